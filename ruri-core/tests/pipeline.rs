//! Invariants of the shared pipeline, with a stand-in backend whose output is a known function
//! of the ids, over the committed tiny model's tokenizer.

use std::sync::Mutex;

use ndarray::{Array2, Array3};
use proptest::prelude::*;
use ruri_core::{
    Backend, BackendOutput, BatchOptions, EmbedOptions, Error, ModelDir, PaddedBatch, Task,
    TextEmbedder, Truncation,
};
use ruri_testkit::tiny_model_dir;

const DIM: usize = 8;

/// Each token's vector depends only on its id, so a text's mean is independent of padding
/// and batch neighbours: any difference between batched and single results is the pipeline's.
fn token_vector(id: i64) -> [f32; DIM] {
    std::array::from_fn(|k| ((id as f32 + 1.0) * (k as f32 + 1.0) * 0.37).sin() + 0.1)
}

/// Returns token embeddings, records every batch it was given (and on which thread).
#[derive(Default)]
struct FakeBackend {
    batches: Mutex<Vec<(usize, usize)>>,
    threads: Mutex<std::collections::HashSet<std::thread::ThreadId>>,
    pooled: bool,
    /// Reported as [`Backend::parallelism`] (0 = the default).
    parallelism: usize,
    /// Fails every batch of this padded length.
    fail_at_seq_len: Option<usize>,
}

impl Backend for FakeBackend {
    fn dim(&self) -> usize {
        DIM
    }

    fn parallelism(&self) -> usize {
        self.parallelism.max(1)
    }

    fn forward(&self, batch: &PaddedBatch) -> ruri_core::Result<BackendOutput> {
        let (b, s) = (batch.batch_size(), batch.seq_len());
        self.batches.lock().unwrap().push((b, s));
        self.threads
            .lock()
            .unwrap()
            .insert(std::thread::current().id());
        if self.fail_at_seq_len == Some(s) {
            return Err(Error::ModelOutput {
                reason: format!("refusing a batch of length {s}"),
            });
        }
        let mut tokens = Array3::<f32>::zeros((b, s, DIM));
        for i in 0..b {
            for j in 0..s {
                // Padding rows get garbage: pooling must ignore them.
                let v = if batch.attention_mask()[i * s + j] == 1 {
                    token_vector(batch.input_ids()[i * s + j])
                } else {
                    [1e6; DIM]
                };
                for k in 0..DIM {
                    tokens[[i, j, k]] = v[k];
                }
            }
        }
        if self.pooled {
            // Same contract, pooled by the backend.
            let mut pooled = Array2::<f32>::zeros((b, DIM));
            for i in 0..b {
                let mask = &batch.attention_mask()[i * s..(i + 1) * s];
                let mut row = vec![0.0; DIM];
                ruri_core::mean_pool(tokens.slice(ndarray::s![i, .., ..]), mask, &mut row);
                pooled.row_mut(i).assign(&ndarray::Array1::from(row));
            }
            return Ok(BackendOutput::Pooled(pooled));
        }
        Ok(BackendOutput::TokenEmbeddings(tokens))
    }
}

fn pipeline(batching: BatchOptions, pooled: bool) -> TextEmbedder {
    with_backend(
        batching,
        FakeBackend {
            pooled,
            ..FakeBackend::default()
        },
    )
}

fn with_backend(batching: BatchOptions, backend: FakeBackend) -> TextEmbedder {
    let dir = ModelDir::open(tiny_model_dir()).unwrap();
    TextEmbedder::new(
        dir.tokenizer().unwrap(),
        dir.prompts().clone(),
        backend,
        Some(batching),
    )
    .unwrap()
}

#[test]
fn mean_of_known_token_vectors() {
    let p = pipeline(BatchOptions::default(), false);
    let text = "瑠璃色の空";
    let ids = p
        .tokenizer()
        .encode("", text, Truncation::Truncate)
        .unwrap();
    let mut expected = [0.0f32; DIM];
    for &id in ids.ids() {
        for (e, x) in expected.iter_mut().zip(token_vector(i64::from(id))) {
            *e += x / ids.len() as f32;
        }
    }
    let raw = p
        .embed_with(&[text], &EmbedOptions::new(Task::None).normalize(false))
        .unwrap();
    for (a, e) in raw.get(0).unwrap().iter().zip(expected) {
        assert!((a - e).abs() < 1e-6, "{a} vs {e}");
    }
}

#[test]
fn prompts_are_prepended_as_text() {
    let p = pipeline(BatchOptions::default(), false);
    let via_task = p.embed(&["猫"], Task::Query).unwrap();
    let via_text = p.embed(&["検索クエリ: 猫"], Task::None).unwrap();
    assert_eq!(via_task, via_text);
    let via_raw = p
        .embed(&["猫"], Task::Prompt("検索クエリ: ".into()))
        .unwrap();
    assert_eq!(via_task, via_raw);
    let named = p.embed(&["猫"], Task::Named("query".into())).unwrap();
    assert_eq!(via_task, named);
    assert!(matches!(
        p.embed(&["猫"], Task::Named("nope".into())),
        Err(Error::InvalidOption { .. })
    ));
}

#[test]
fn batches_are_length_sorted_and_within_budget() {
    let p = pipeline(
        BatchOptions::default()
            .max_batch_tokens(64)
            .max_batch_size(4),
        false,
    );
    let texts: Vec<String> = (0..20).map(|i| "あ".repeat(i * 3)).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    p.embed(&refs, Task::None).unwrap();
    let batches = p
        .backend_as::<FakeBackend>()
        .unwrap()
        .batches
        .lock()
        .unwrap()
        .clone();
    assert_eq!(batches.iter().map(|b| b.0).sum::<usize>(), 20);
    let mut previous_len = usize::MAX;
    for (b, s) in batches {
        assert!(b <= 4);
        assert!(b * s <= 64 || b == 1, "{b} × {s} over budget");
        assert!(s <= previous_len, "batches go from long to short");
        previous_len = s;
    }
}

#[test]
fn a_parallel_backend_gets_batches_on_several_threads_with_the_same_result() {
    let texts: Vec<String> = (0..40).map(|i| "瑠璃".repeat(i % 13 + 1)).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let batching = BatchOptions::default().max_batch_size(3);
    let sequential = pipeline(batching, false);
    let parallel = with_backend(
        batching,
        FakeBackend {
            parallelism: 3,
            ..FakeBackend::default()
        },
    );
    let expected = sequential.embed(&refs, Task::Document).unwrap();
    for _ in 0..5 {
        assert_eq!(parallel.embed(&refs, Task::Document).unwrap(), expected);
    }
    assert_eq!(
        sequential
            .backend_as::<FakeBackend>()
            .unwrap()
            .threads
            .lock()
            .unwrap()
            .len(),
        1
    );
    assert!(
        parallel
            .backend_as::<FakeBackend>()
            .unwrap()
            .threads
            .lock()
            .unwrap()
            .len()
            > 1
    );
}

#[test]
fn tokenizing_on_several_threads_keeps_the_order_and_the_first_error() {
    // 300 texts on a backend of 3 workers: three shares of 100 texts, each on its thread.
    let texts: Vec<String> = (0..300)
        .map(|i| format!("{i}番目の瑠璃{}", "色".repeat(i % 17)))
        .collect();
    let sequential = pipeline(BatchOptions::default(), false);
    let parallel = with_backend(
        BatchOptions::default(),
        FakeBackend {
            parallelism: 3,
            ..FakeBackend::default()
        },
    );
    let options = EmbedOptions::new(Task::Document);
    let expected = sequential.tokenize(&texts, &options).unwrap();
    assert_eq!(expected.len(), 300);
    assert_eq!(parallel.tokenize(&texts, &options).unwrap(), expected);
    // Each text alone gives its own encoding (no share boundary moves a text).
    for i in [0, 99, 100, 101, 199, 200, 299] {
        assert_eq!(
            parallel.tokenize(&texts[i..=i], &options).unwrap()[0],
            expected[i]
        );
    }
    assert_eq!(
        parallel.embed(&texts, Task::Document).unwrap(),
        sequential.embed(&texts, Task::Document).unwrap()
    );

    // Texts too long under the error policy in the second and third shares: the first one
    // in input order is named, whichever thread finished first.
    let long = "東京".repeat(2000);
    let refuse = EmbedOptions::new(Task::None).truncation(Truncation::Error);
    for (bad, first) in [(vec![260, 130], 130), (vec![260], 260), (vec![299, 0], 0)] {
        let mut texts = texts.clone();
        for &i in &bad {
            texts[i] = long.clone();
        }
        match parallel.tokenize(&texts, &refuse) {
            Err(Error::InputTooLong { index, .. }) => assert_eq!(index, first, "{bad:?}"),
            other => panic!("expected InputTooLong, got {other:?}"),
        }
    }
}

/// The pooled rows of [`FakeBackend`], handed over column-major or as a window of a larger
/// buffer (an owned array with an offset): the pipeline must read them by index, not by
/// memory order.
struct Relaid {
    inner: FakeBackend,
    column_major: bool,
}

impl Backend for Relaid {
    fn dim(&self) -> usize {
        DIM
    }

    fn forward(&self, batch: &PaddedBatch) -> ruri_core::Result<BackendOutput> {
        let BackendOutput::Pooled(rows) = self.inner.forward(batch)? else {
            unreachable!("the inner backend pools")
        };
        let b = rows.nrows();
        let relaid = if self.column_major {
            use ndarray::ShapeBuilder;
            let mut f = Array2::<f32>::zeros((b, DIM).f());
            f.assign(&rows);
            f
        } else {
            let mut big = Array2::<f32>::from_elem((b + 2, DIM), 1e9);
            big.slice_mut(ndarray::s![1..b + 1, ..]).assign(&rows);
            big.slice_move(ndarray::s![1..b + 1, ..])
        };
        Ok(BackendOutput::Pooled(relaid))
    }
}

#[test]
fn pooled_rows_in_any_memory_layout_give_the_same_vectors() {
    let texts: Vec<String> = (0..20).map(|i| "瑠璃".repeat(i % 7 + 1)).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let batching = BatchOptions::default().max_batch_size(3);
    let expected = pipeline(batching, true).embed(&refs, Task::None).unwrap();
    let dir = ModelDir::open(tiny_model_dir()).unwrap();
    for column_major in [true, false] {
        let backend = Relaid {
            inner: FakeBackend {
                pooled: true,
                ..FakeBackend::default()
            },
            column_major,
        };
        let p = TextEmbedder::new(
            dir.tokenizer().unwrap(),
            dir.prompts().clone(),
            backend,
            Some(batching),
        )
        .unwrap();
        assert_eq!(
            p.embed(&refs, Task::None).unwrap(),
            expected,
            "column-major {column_major}"
        );
    }
}

#[test]
fn a_failing_batch_fails_the_call_on_every_path() {
    let texts: Vec<String> = (0..30).map(|i| "あ".repeat(i + 1)).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    // Text 9 (10 × あ) alone in its batch: its padded length fails.
    let p = pipeline(BatchOptions::default().max_batch_size(1), false);
    let len = p
        .tokenizer()
        .encode("", &texts[9], Truncation::Truncate)
        .unwrap()
        .len();
    for parallelism in [1, 2, 4] {
        let p = with_backend(
            BatchOptions::default().max_batch_size(1),
            FakeBackend {
                parallelism,
                fail_at_seq_len: Some(len),
                ..FakeBackend::default()
            },
        );
        match p.embed(&refs, Task::None) {
            Err(Error::ModelOutput { reason }) => assert!(reason.contains(&len.to_string())),
            other => {
                panic!("parallelism {parallelism}: expected the backend's error, got {other:?}")
            }
        }
    }
}

#[test]
fn empty_request_returns_empty_result_without_inference() {
    let p = pipeline(BatchOptions::default(), false);
    let e = p.embed(&[] as &[&str], Task::Query).unwrap();
    assert!(e.is_empty());
    assert_eq!(e.dim(), DIM);
    assert!(
        p.backend_as::<FakeBackend>()
            .unwrap()
            .batches
            .lock()
            .unwrap()
            .is_empty()
    );
}

#[test]
fn error_policy_names_the_long_text() {
    let p = pipeline(BatchOptions::default(), false);
    let long = "東京".repeat(2000);
    let texts = ["短い", long.as_str()];
    let options = EmbedOptions::new(Task::None).truncation(Truncation::Error);
    match p.embed_with(&texts, &options) {
        Err(Error::InputTooLong { index, tokens, max }) => {
            assert_eq!(index, 1);
            assert!(tokens > max);
            assert_eq!(max, 512);
        }
        other => panic!("expected InputTooLong, got {other:?}"),
    }
    let truncated = p.embed(&texts, Task::None).unwrap();
    assert_eq!(truncated.truncated_flags(), &[false, true]);
    assert_eq!(truncated.tokens(1), Some(512));
}

#[test]
fn wrong_backend_shapes_are_errors() {
    struct Bad;
    impl Backend for Bad {
        fn dim(&self) -> usize {
            DIM
        }
        fn forward(&self, batch: &PaddedBatch) -> ruri_core::Result<BackendOutput> {
            Ok(BackendOutput::Pooled(Array2::zeros((
                batch.batch_size() + 1,
                DIM,
            ))))
        }
    }
    let dir = ModelDir::open(tiny_model_dir()).unwrap();
    let p = TextEmbedder::new(
        dir.tokenizer().unwrap(),
        dir.prompts().clone(),
        Bad,
        Some(BatchOptions::default()),
    )
    .unwrap();
    assert!(matches!(
        p.embed(&["a"], Task::None),
        Err(Error::ModelOutput { .. })
    ));
    // A dimension that disagrees with config.json is refused up front.
    assert!(matches!(
        TextEmbedder::load(&dir, Some(BatchOptions::default()), || Ok(Bad)),
        Err(Error::InvalidConfig { .. })
    ));
}

#[test]
fn zero_batch_limits_are_refused() {
    let dir = ModelDir::open(tiny_model_dir()).unwrap();
    for batching in [
        BatchOptions::default().max_batch_tokens(0),
        BatchOptions::default().max_batch_size(0),
        BatchOptions::default().max_batch_attention(0),
    ] {
        let r = TextEmbedder::new(
            dir.tokenizer().unwrap(),
            dir.prompts().clone(),
            FakeBackend::default(),
            Some(batching),
        );
        assert!(matches!(r, Err(Error::InvalidOption { .. })));
    }
}

/// Per-call batch limits (sentence-transformers' `encode(batch_size=…)` in the Python package)
/// apply to that call only, give the same vectors, and are validated like the builder's.
#[test]
fn per_call_batching_overrides_the_embedders_for_that_call_only() {
    let p = pipeline(BatchOptions::default(), false);
    let texts: Vec<String> = (0..10).map(|i| "瑠璃".repeat(i + 1)).collect();
    let options = EmbedOptions::new(Task::None);
    let encodings = p.tokenize(&texts, &options).unwrap();
    let batches = || {
        std::mem::take(
            &mut *p
                .backend_as::<FakeBackend>()
                .unwrap()
                .batches
                .lock()
                .unwrap(),
        )
    };
    let default = p.embed_encodings(&encodings, true).unwrap();
    assert_eq!(batches().len(), 1, "10 short texts fit one default batch");
    let small = BatchOptions::default().max_batch_size(3);
    let three = p
        .embed_encodings_with_batching(&encodings, true, &small)
        .unwrap();
    let sizes: Vec<usize> = batches().iter().map(|b| b.0).collect();
    assert_eq!(sizes, [3, 3, 3, 1]);
    assert_eq!(three, default);
    p.embed_encodings(&encodings, true).unwrap();
    assert_eq!(
        batches().len(),
        1,
        "the embedder's own limits are unchanged"
    );
    let zero = BatchOptions::default().max_batch_size(0);
    assert!(matches!(
        p.embed_encodings_with_batching(&encodings, true, &zero),
        Err(Error::InvalidOption {
            name: "max_batch_size",
            ..
        })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Order kept, batch == one by one (bit for bit: the stand-in backend has no batch
    /// effects), unit norm, token counts as the tokenizer says; for both output kinds, run
    /// sequentially or on several threads.
    #[test]
    fn batch_equals_one_by_one(
        texts in proptest::collection::vec(any::<String>(), 0..24),
        budget in 8usize..600,
        pooled in any::<bool>(),
        parallelism in 1usize..4,
    ) {
        let p = with_backend(
            BatchOptions::default().max_batch_tokens(budget).max_batch_size(7),
            FakeBackend { pooled, parallelism, ..FakeBackend::default() },
        );
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let all = p.embed(&refs, Task::Document).unwrap();
        prop_assert_eq!(all.len(), texts.len());
        for (i, text) in refs.iter().enumerate() {
            let one = p.embed(&[text], Task::Document).unwrap();
            prop_assert_eq!(all.get(i).unwrap(), one.get(0).unwrap());
            let norm: f32 = all.get(i).unwrap().iter().map(|x| x * x).sum::<f32>().sqrt();
            prop_assert!((norm - 1.0).abs() < 1e-5, "norm {}", norm);
            let enc = p.tokenizer().encode("検索文書: ", text, Truncation::Truncate).unwrap();
            prop_assert_eq!(all.tokens(i), Some(enc.len()));
            prop_assert_eq!(all.truncated(i), Some(enc.truncated()));
        }
    }
}
