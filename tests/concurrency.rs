//! Many threads share one embedder, on every backend: each call gets the vectors of its own
//! texts, equal to the sequential ones, and every thread finishes, under a watchdog that
//! turns a deadlock or a starved caller into a failure instead of a hung test. ort runs with
//! a session pool smaller than the number of threads, and with one call's batches spread over
//! the pool while other callers wait for sessions (ruri-ort/tests/concurrency.rs has more ort
//! cases).

use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::time::Duration;

use ruri::{BatchOptions, Embedder, Task};
use ruri_testkit::{Reference, max_abs_diff, tiny_model_dir};

const THREADS: usize = 6;
const CALLS: usize = 15;
/// Far above the few seconds the work takes on 2 cores in a debug build.
const WATCHDOG: Duration = Duration::from_secs(180);

/// Runs `work` on its own thread; fails if it panics or is not done within [`WATCHDOG`].
fn within_watchdog<T: Send + 'static>(what: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, result) = channel();
    std::thread::spawn(move || {
        let _ = done.send(work());
    });
    match result.recv_timeout(WATCHDOG) {
        Ok(value) => value,
        Err(RecvTimeoutError::Timeout) => {
            panic!("{what}: not done after {WATCHDOG:?} (deadlock or starvation)")
        }
        Err(RecvTimeoutError::Disconnected) => panic!("{what}: a thread panicked"),
    }
}

/// `THREADS` threads × `CALLS` calls of 1 to 4 texts (different mixes, so different
/// batches), plus one thread embedding every text at once; all against the sequential
/// vectors of each text alone.
fn shared_embedder_equals_sequential(name: &'static str, embedder: Arc<dyn Embedder>) {
    let reference = Reference::tiny();
    let texts: Arc<Vec<String>> =
        Arc::new(reference.items.iter().map(|i| i.text.clone()).collect());
    let sequential: Arc<Vec<Vec<f32>>> = Arc::new(
        texts
            .iter()
            .map(|t| {
                embedder
                    .embed(&[t.as_str()], Task::Document)
                    .unwrap()
                    .into_vec()
            })
            .collect(),
    );
    let check = move |thread: usize, picked: &[usize], got: &ruri::Embeddings| {
        assert_eq!(got.len(), picked.len(), "{name}, thread {thread}");
        for (k, &i) in picked.iter().enumerate() {
            let diff = max_abs_diff(got.get(k).unwrap(), &sequential[i]);
            // Other batch-mates change only float summation order: 1.1e-6 measured on the
            // outlier model (a 512-token text), far below the 1e-5 parity tolerance.
            assert!(
                diff <= 5e-6,
                "{name}, thread {thread}, text {i}: |Δ| {diff}"
            );
        }
    };
    within_watchdog(name, move || {
        let mut handles = Vec::new();
        for thread in 0..THREADS {
            let (embedder, texts, check) = (embedder.clone(), texts.clone(), check.clone());
            handles.push(std::thread::spawn(move || {
                for call in 0..CALLS {
                    let n = texts.len();
                    let picked: Vec<usize> = (0..1 + (thread + call) % 4)
                        .map(|k| (thread * 11 + call * 7 + k * 5) % n)
                        .collect();
                    let batch: Vec<&str> = picked.iter().map(|&i| texts[i].as_str()).collect();
                    check(
                        thread,
                        &picked,
                        &embedder.embed(&batch, Task::Document).unwrap(),
                    );
                }
            }));
        }
        // One caller with many batches at once, among the small ones.
        let all: Vec<usize> = (0..texts.len()).collect();
        let batch: Vec<&str> = texts.iter().map(String::as_str).collect();
        for _ in 0..3 {
            check(
                THREADS,
                &all,
                &embedder.embed(&batch, Task::Document).unwrap(),
            );
        }
        for handle in handles {
            handle.join().expect("no thread panicked");
        }
    });
}

#[test]
fn ort_with_a_pool_smaller_than_the_threads() {
    let embedder = ruri::ort::builder()
        .sessions(2)
        .intra_threads(1)
        .batching(BatchOptions::default().max_batch_size(4))
        .build_from_dir(tiny_model_dir())
        .unwrap();
    shared_embedder_equals_sequential("ort fp32, 2 sessions", Arc::new(embedder));
}

#[test]
fn ort_with_one_session() {
    let embedder = ruri::ort::builder()
        .intra_threads(1)
        .build_from_dir(tiny_model_dir())
        .unwrap();
    shared_embedder_equals_sequential("ort fp32, 1 session", Arc::new(embedder));
}

#[test]
fn candle() {
    let embedder = ruri::candle::builder()
        .batching(BatchOptions::default().max_batch_size(4))
        .build_from_dir(tiny_model_dir())
        .unwrap();
    shared_embedder_equals_sequential("candle f32", Arc::new(embedder));
}
