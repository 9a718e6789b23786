//! Throughput over a mixed-length workload, single-query latency, and the host↔device copy
//! share of one batch.

use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Tensor};
use ruri_candle::CandleBackend;
use ruri_core::{
    Backend, BackendOutput, BatchOptions, EmbedOptions, PaddedBatch, Result, Task, TextEmbedder,
    Tokenizer, Truncation, plan_batches,
};
use serde_json::{Value, json};

use crate::Failure;
use crate::memory::Probe;

/// One loaded model shared by embedders of different batch limits.
pub struct Shared(pub Arc<CandleBackend>);

impl Backend for Shared {
    fn dim(&self) -> usize {
        self.0.dim()
    }

    fn advised_batching(&self) -> BatchOptions {
        self.0.advised_batching()
    }

    fn forward(&self, batch: &PaddedBatch) -> Result<BackendOutput> {
        self.0.forward(batch)
    }
}

/// Ordinary Japanese prose, repeated and cut to the wanted token count.
const PROSE: &str = "瑠璃は古くから珍重されてきた青い宝石で、その深い色は夜空にたとえられる。\
    日本では七宝の一つに数えられ、寺院の装飾や仏具にも用いられてきた。\
    現代でも装身具として人気があり、産地によって色合いや模様が少しずつ異なる。";

/// The longest prefix of the repeated prose with at most `tokens` tokens (specials included).
fn text_of(tokenizer: &Tokenizer, tokens: usize) -> String {
    let chars: Vec<char> = PROSE.chars().cycle().take(tokens * 4 + 64).collect();
    let count = |n: usize| {
        let text: String = chars[..n].iter().collect();
        tokenizer
            .encode("", &text, Truncation::Error)
            .map_or(usize::MAX, |e| e.len())
    };
    let (mut lo, mut hi) = (0, chars.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if count(mid) <= tokens {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    chars[..lo].iter().collect()
}

/// Lengths of the workload: 16 steps, evenly spaced in log scale from 16 to 512 tokens
/// (queries to passages of a retrieval corpus), each text a different step.
pub const LENGTHS: usize = 16;

pub fn workload(tokenizer: &Tokenizer, texts: usize) -> Vec<String> {
    let by_length: Vec<String> = (0..LENGTHS)
        .map(|k| {
            let tokens = 16.0 * 32f64.powf(k as f64 / (LENGTHS - 1) as f64);
            text_of(tokenizer, tokens.round() as usize)
        })
        .collect();
    // 7 is prime to 16: neighbours differ in length, as in a stream of documents.
    (0..texts)
        .map(|i| by_length[(i * 7) % LENGTHS].clone())
        .collect()
}

/// Texts per second over whole calls of `texts`, for at least `seconds` (at least one call),
/// after a warm-up call on one text of each length (which loads every kernel the workload
/// uses, the banded local attention of texts from 256 tokens included).
pub fn throughput(
    embedder: &TextEmbedder,
    batching: &BatchOptions,
    texts: &[&str],
    seconds: f64,
    probe: &Probe,
) -> std::result::Result<Value, Failure> {
    let options = EmbedOptions::new(Task::None);
    let warm = Instant::now();
    embedder.embed_with(&texts[..texts.len().min(LENGTHS)], &options)?;
    let warm_up_s = warm.elapsed().as_secs_f64();

    probe.reset_peak();
    let started = Instant::now();
    let first = embedder.embed_with(texts, &options)?;
    let mut calls = 1usize;
    while started.elapsed().as_secs_f64() < seconds && calls < 1000 {
        embedder.embed_with(texts, &options)?;
        calls += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut lengths = first.token_counts().to_vec();
    lengths.sort_unstable_by(|a, b| b.cmp(a));
    let plan = plan_batches(&lengths, batching);
    let padded: usize = plan.iter().map(|b| b.len() * lengths[b.start]).sum();
    let real: usize = lengths.iter().sum();
    Ok(json!({
        "max_batch_tokens": batching.get_max_batch_tokens(),
        "max_batch_size": batching.get_max_batch_size(),
        "max_batch_attention": batching.get_max_batch_attention(),
        "texts_per_call": texts.len(),
        "batches_per_call": plan.len(),
        "largest_batch_texts": plan.iter().map(|b| b.len()).max(),
        "real_tokens_per_call": real,
        "padded_tokens_per_call": padded,
        "calls": calls,
        "seconds": elapsed,
        "warm_up_seconds": warm_up_s,
        "texts_per_s": (calls * texts.len()) as f64 / elapsed,
        "tokens_per_s": (calls * real) as f64 / elapsed,
        "peak_memory_bytes": probe.peak_bytes(),
    }))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank]
}

/// One query at a time (a batch of one), after 10 warm-up calls: milliseconds.
pub fn latency(embedder: &TextEmbedder, seconds: f64) -> std::result::Result<Value, Failure> {
    let query = "瑠璃色はどんな色？";
    let options = EmbedOptions::new(Task::Query);
    let mut query_tokens = None;
    for _ in 0..10 {
        query_tokens = embedder.embed_with(&[query], &options)?.tokens(0);
    }
    let mut times = Vec::new();
    let started = Instant::now();
    while times.len() < 20 || (started.elapsed().as_secs_f64() < seconds && times.len() < 10_000) {
        let call = Instant::now();
        embedder.embed_with(&[query], &options)?;
        times.push(call.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(json!({
        "query": query,
        "query_tokens": query_tokens,
        "calls": times.len(),
        "p50_ms": percentile(&times, 0.5),
        "p90_ms": percentile(&times, 0.9),
        "p99_ms": percentile(&times, 0.99),
        "mean_ms": times.iter().sum::<f64>() / times.len() as f64,
    }))
}

/// Median of up to 7 timed runs after a warm-up one, stopping after 2 s (one run at least).
fn median_ms(
    mut run: impl FnMut() -> std::result::Result<(), Failure>,
) -> std::result::Result<f64, Failure> {
    run()?;
    let mut times = Vec::new();
    let started = Instant::now();
    while times.is_empty() || (times.len() < 7 && started.elapsed().as_secs_f64() < 2.0) {
        let call = Instant::now();
        run()?;
        times.push(call.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// The share of one batch's `forward` that is host↔device copying: the backend's ids and
/// mask go up as `u32` (`batch × seq` each) and the pooled `batch × dim` f32 rows come back.
/// Timed apart with the same shapes on the same device (and stream), each copy waited for;
/// the host-side `i64 → u32` conversion and buffer allocation count as copying too.
pub fn copy_share(
    backend: &CandleBackend,
    device: &candle_core::Device,
    batching: &BatchOptions,
    pad_id: u32,
) -> std::result::Result<Value, Failure> {
    // A batch of 256-token texts filling the budget, a few with some padding.
    let seq = 256usize;
    let texts = (batching.get_max_batch_tokens() / seq)
        .clamp(1, batching.get_max_batch_size())
        .min(batching.get_max_batch_attention() / (seq * seq))
        .max(1);
    let rows: Vec<Vec<u32>> = (0..texts)
        .map(|r| {
            let len = seq - (r % 4) * 16;
            (0..len)
                .map(|i| 7 + ((r * 131 + i * 17) % 7000) as u32)
                .collect()
        })
        .collect();
    let batch = PaddedBatch::new(rows.iter().map(Vec::as_slice), pad_id);
    let forward_ms = median_ms(|| {
        backend.forward(&batch)?;
        Ok(())
    })?;
    let upload_ms = median_ms(|| {
        let ids: Vec<u32> = batch.input_ids().iter().map(|&id| id as u32).collect();
        let mask: Vec<u32> = batch.attention_mask().iter().map(|&m| m as u32).collect();
        let ids = Tensor::from_vec(ids, (texts, seq), device)?;
        let mask = Tensor::from_vec(mask, (texts, seq), device)?;
        device.synchronize()?;
        drop((ids, mask));
        Ok(())
    })?;
    let pooled = Tensor::zeros((texts, backend.dim()), DType::F32, device)?;
    device.synchronize()?;
    let download_ms = median_ms(|| {
        pooled.flatten_all()?.to_vec1::<f32>()?;
        Ok(())
    })?;
    Ok(json!({
        "batch_texts": texts,
        "batch_seq": seq,
        "forward_ms": forward_ms,
        "upload_ms": upload_ms,
        "download_ms": download_ms,
        "copy_share": (upload_ms + download_ms) / forward_ms,
    }))
}
