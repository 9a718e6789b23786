//! The one model worker: a thread that takes tokenized requests off a queue, merges those
//! waiting into one backend call (the pipeline then sorts all their texts by length and packs
//! them under its padded-token budget), and hands each request its rows back.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use ruri::{Encoding, TextEmbedder};
use tokio::sync::{mpsc, oneshot};

use crate::metrics::Metrics;

/// Raw (unnormalized) vectors of one request, row-major, or why the backend failed.
pub type Reply = Result<Vec<f32>, String>;

/// One request's tokenized texts, waiting for the model.
pub struct Job {
    pub encodings: Vec<Encoding>,
    pub tokens: usize,
    pub enqueued: Instant,
    pub reply: oneshot::Sender<Reply>,
    /// Set by whichever of the model thread (taking the job) and the handler (giving up on
    /// it: [`Admission`]'s drop) comes first; that one releases the job's tokens.
    pub claim: Arc<AtomicBool>,
}

/// A request's place in the queue, held by its handler: dropped before the model thread
/// takes the job (the request timed out, or its client went away), it gives the tokens back
/// at once, and the model thread then skips the job.
pub struct Admission {
    shared: Arc<crate::Shared>,
    tokens: usize,
    claim: Arc<AtomicBool>,
}

impl Admission {
    /// After `Depth::try_admit` has counted `tokens`.
    pub fn new(shared: Arc<crate::Shared>, tokens: usize) -> Self {
        Self {
            shared,
            tokens,
            claim: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn claim(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.claim)
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if !self.claim.swap(true, Ordering::AcqRel) {
            self.shared.depth.release(self.tokens);
            self.shared.metrics.abandoned.inc();
        }
    }
}

/// What waits in the queue, counted at admission and released when a backend call takes it.
#[derive(Default)]
pub struct Depth {
    pub requests: AtomicUsize,
    pub tokens: AtomicUsize,
}

impl Depth {
    /// Reserves room for `tokens` unless the queue would pass `max_tokens`. An empty queue
    /// always admits, so a request larger than the whole budget is slow, never refused.
    pub fn try_admit(&self, tokens: usize, max_tokens: usize) -> bool {
        let admitted = self
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                (queued == 0 || queued.saturating_add(tokens) <= max_tokens)
                    .then_some(queued + tokens)
            })
            .is_ok();
        if admitted {
            self.requests.fetch_add(1, Ordering::AcqRel);
        }
        admitted
    }

    pub fn release(&self, tokens: usize) {
        self.tokens.fetch_sub(tokens, Ordering::AcqRel);
        self.requests.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs until every sender is gone (the server has shut down and its last request is answered).
pub fn run_worker(
    engine: &TextEmbedder,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    depth: &Depth,
    metrics: &Metrics,
    max_merge_tokens: usize,
) {
    // A job taken off the channel that did not fit the previous merge.
    let mut held: Option<Job> = None;
    loop {
        let Some(first) = held.take().or_else(|| jobs.blocking_recv()) else {
            return;
        };
        let mut merged = Vec::new();
        let mut tokens = 0;
        for job in std::iter::once(first).chain(std::iter::from_fn(|| jobs.try_recv().ok())) {
            // Held for the next call before it is claimed: a held job stays its handler's to
            // give up on until a call takes it.
            if !merged.is_empty() && tokens + job.tokens > max_merge_tokens {
                held = Some(job);
                break;
            }
            if job.claim.swap(true, Ordering::AcqRel) {
                // Its handler gave up and released its tokens already.
                continue;
            }
            if job.reply.is_closed() {
                // The client went away while waiting: skip its work.
                depth.release(job.tokens);
                metrics.abandoned.inc();
                continue;
            }
            tokens += job.tokens;
            merged.push(job);
            if tokens >= max_merge_tokens {
                break;
            }
        }
        if merged.is_empty() {
            continue;
        }
        run_merged(engine, merged, tokens, depth, metrics);
    }
}

fn run_merged(
    engine: &TextEmbedder,
    mut merged: Vec<Job>,
    tokens: usize,
    depth: &Depth,
    metrics: &Metrics,
) {
    let started = Instant::now();
    let mut sizes = Vec::with_capacity(merged.len());
    let mut encodings = Vec::new();
    for job in &mut merged {
        depth.release(job.tokens);
        metrics
            .queue_wait_seconds
            .observe(started.duration_since(job.enqueued).as_secs_f64());
        sizes.push(job.encodings.len());
        encodings.append(&mut job.encodings);
    }
    metrics.batch_requests.observe(merged.len() as f64);
    metrics.batch_texts.observe(encodings.len() as f64);
    metrics.batch_tokens.observe(tokens as f64);

    // A panic in a backend must cost these requests, not the worker (and so the server).
    // Raw vectors, unless the model only has normalized ones (the handlers refuse
    // `normalize: false` then); the handlers cut dimensions and normalize.
    let normalized = !crate::raw_available(engine);
    let result = catch_unwind(AssertUnwindSafe(|| {
        engine.embed_encodings(&encodings, normalized)
    }))
    .unwrap_or_else(|panic| {
        Err(ruri::Error::ModelOutput {
            reason: format!("the backend panicked: {}", crate::panic_message(&*panic)),
        })
    });
    metrics
        .inference_seconds
        .observe(started.elapsed().as_secs_f64());

    match result {
        Ok(embeddings) if embeddings.len() == encodings.len() => {
            metrics.texts.inc_by(encodings.len() as u64);
            metrics.tokens.inc_by(tokens as u64);
            // The client may have gone: nothing to do then.
            if merged.len() == 1 {
                // Alone in its call (every request when the server is not busy): the
                // buffer itself, no copy.
                let job = merged.pop().expect("checked: one job");
                let _ = job.reply.send(Ok(embeddings.into_vec()));
                return;
            }
            let dim = embeddings.dim();
            let mut rows = embeddings.as_slice();
            for (job, n) in merged.into_iter().zip(sizes) {
                let (own, rest) = rows.split_at(n * dim);
                rows = rest;
                let _ = job.reply.send(Ok(own.to_vec()));
            }
        }
        other => {
            let message = match other {
                Ok(embeddings) => format!(
                    "the backend returned {} vectors for {} texts",
                    embeddings.len(),
                    encodings.len()
                ),
                Err(e) => crate::describe(&e),
            };
            eprintln!(
                "error: backend call over {} texts failed: {message}",
                encodings.len()
            );
            metrics.backend_errors.inc();
            for job in merged {
                let _ = job.reply.send(Err(message.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_respects_budget_but_never_starves_an_empty_queue() {
        let depth = Depth::default();
        assert!(depth.try_admit(1000, 100), "an empty queue admits anything");
        assert!(!depth.try_admit(1, 100));
        depth.release(1000);
        assert!(depth.try_admit(60, 100));
        assert!(depth.try_admit(40, 100));
        assert!(!depth.try_admit(1, 100));
        assert_eq!(depth.requests.load(Ordering::Acquire), 2);
    }
}
