//! One call's batches spread over the session pool while other callers wait for sessions:
//! every call gets the vectors of its own texts, equal to a one-session embedder's. (Many
//! threads × many small calls on every backend, under a deadlock watchdog: the root
//! package's tests/concurrency.rs.)

use std::sync::Arc;

use ruri_core::{Embedder, Task};
use ruri_testkit::{Reference, tiny_model_dir};

#[test]
fn one_call_spreads_its_batches_over_the_sessions_with_the_same_vectors() {
    let reference = Reference::tiny();
    let owned: Vec<String> = reference.items.iter().map(|i| i.text.clone()).collect();
    let texts: Vec<&str> = owned.iter().map(String::as_str).collect();
    let build = |sessions: usize| {
        ruri_ort::builder()
            .sessions(sessions)
            .intra_threads(1)
            .batching(ruri_core::BatchOptions::default().max_batch_size(2))
            .build_from_dir(tiny_model_dir())
            .unwrap()
    };
    let sequential = build(1).embed(&texts, Task::Document).unwrap();
    let pooled = Arc::new(build(3));
    assert_eq!(
        pooled.embed(&texts, Task::Document).unwrap().len(),
        texts.len()
    );
    // Several callers at once, each spreading 15 batches over the same 3 sessions.
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (pooled, owned) = (pooled.clone(), owned.clone());
            std::thread::spawn(move || {
                let texts: Vec<&str> = owned.iter().map(String::as_str).collect();
                pooled.embed(&texts, Task::Document).unwrap()
            })
        })
        .collect();
    for handle in handles {
        let got = handle.join().expect("no thread panicked");
        for i in 0..texts.len() {
            for (a, b) in got.get(i).unwrap().iter().zip(sequential.get(i).unwrap()) {
                assert!((a - b).abs() <= 1e-6, "text {i}: {a} vs {b}");
            }
        }
    }
}
