//! Many threads share one embedder: every call gets the vectors of its own texts, equal to
//! the sequential results, with a pool smaller than the number of threads (so callers wait
//! for sessions) and without deadlock.

use std::sync::Arc;

use ruri_core::{Embedder, Task};
use ruri_ort::OrtEmbedder;
use ruri_testkit::{Reference, tiny_model_dir};

#[test]
fn threads_sharing_an_embedder_get_their_own_vectors() {
    let embedder = Arc::new(
        OrtEmbedder::builder()
            .sessions(2)
            .intra_threads(1)
            .build_from_dir(tiny_model_dir())
            .unwrap(),
    );
    let reference = Reference::tiny();
    let texts: Vec<String> = reference.items.iter().map(|i| i.text.clone()).collect();
    let sequential: Vec<Vec<f32>> = texts
        .iter()
        .map(|t| {
            embedder
                .embed(&[t.as_str()], Task::Document)
                .unwrap()
                .into_vec()
        })
        .collect();

    let handles: Vec<_> = (0..6)
        .map(|thread| {
            let (embedder, texts, sequential) =
                (embedder.clone(), texts.clone(), sequential.clone());
            std::thread::spawn(move || {
                for round in 0..10 {
                    // Each thread walks the texts from a different offset, alone or in pairs.
                    let i = (thread * 7 + round * 3) % texts.len();
                    let j = (i + 1 + thread) % texts.len();
                    let both = embedder
                        .embed(&[texts[i].as_str(), texts[j].as_str()], Task::Document)
                        .unwrap();
                    for (k, idx) in [i, j].into_iter().enumerate() {
                        let got = both.get(k).unwrap();
                        for (a, b) in got.iter().zip(&sequential[idx]) {
                            assert!(
                                (a - b).abs() <= 1e-6,
                                "thread {thread} text {idx}: {a} vs {b}"
                            );
                        }
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().expect("no thread panicked");
    }
}

#[test]
fn one_call_spreads_its_batches_over_the_sessions_with_the_same_vectors() {
    let reference = Reference::tiny();
    let owned: Vec<String> = reference.items.iter().map(|i| i.text.clone()).collect();
    let texts: Vec<&str> = owned.iter().map(String::as_str).collect();
    let build = |sessions: usize| {
        OrtEmbedder::builder()
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
