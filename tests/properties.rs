//! Properties of the real backends on the committed tiny model, over random Unicode texts
//! (NUL and other controls, lone combining marks, literal special tokens, texts past the
//! maximum length; `ruri_testkit::hostile_text`) in random batches and tasks:
//!
//! * no panic, and every call with the default policy succeeds;
//! * one unit-length, finite vector per text, in input order: each equal to the same text
//!   embedded alone within 1e-6 (fp32; ort's ONNX-file int8 with batches of one, which makes
//!   it batch-independent, see README; the fused graph's int8 and the native engine's int8
//!   in any batch: per-row activation scales);
//! * token counts and truncation flags as the tokenizer gives them;
//! * under `Truncation::Error`, refused exactly when a text is too long, naming the first.
//!
//! ruri-core/tests/pipeline.rs checks the same invariants bit for bit with a stand-in
//! backend; here the model is real.

use ruri::TextEmbedder;
use std::sync::OnceLock;

use ruri::ort::Precision;
use ruri::{
    BatchOptions, EmbedOptions, Embedder, Error, ModelDir, Task, Tokenizer, Truncation, prompts,
};
use ruri_testkit::proptest::prelude::*;
use ruri_testkit::proptest::{self, test_runner::TestCaseError};
use ruri_testkit::{hostile_text, max_abs_diff, tiny_model_dir};

/// Batch and alone differ only in float summation order (other padded shapes).
const BATCH_VS_ALONE: f64 = 1e-6;

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        ModelDir::open(tiny_model_dir())
            .unwrap()
            .tokenizer()
            .unwrap()
    })
}

fn ort(precision: Precision, batching: BatchOptions) -> TextEmbedder {
    ruri::ort::builder()
        .graph(ruri::ort::Graph::OnnxFile)
        .precision(precision)
        .batching(batching)
        .build_from_dir(tiny_model_dir())
        .unwrap()
}

/// ort's fused graph (the default graph) from `model.safetensors`, default batches.
fn fused(precision: Precision) -> TextEmbedder {
    ruri::ort::builder()
        .graph(ruri::ort::Graph::Fused)
        .precision(precision)
        .build_from_dir(tiny_model_dir())
        .unwrap()
}

fn task() -> impl Strategy<Value = (Task, &'static str)> {
    prop::sample::select(vec![
        (Task::None, ""),
        (Task::Query, prompts::QUERY),
        (Task::Document, prompts::DOCUMENT),
        (Task::Topic, prompts::TOPIC),
    ])
}

fn texts() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(hostile_text(), 0..8)
}

fn check(
    embedder: &dyn Embedder,
    texts: &[String],
    (task, prompt): (Task, &str),
) -> Result<(), TestCaseError> {
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let all = embedder.embed(&refs, task.clone()).unwrap();
    prop_assert_eq!(all.len(), refs.len());
    let mut first_too_long = None;
    for (i, text) in refs.iter().enumerate() {
        let v = all.get(i).unwrap();
        prop_assert!(v.iter().all(|x| x.is_finite()), "text {}: {:?}", i, v);
        let norm = v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
        prop_assert!((norm - 1.0).abs() < 1e-5, "text {}: norm {}", i, norm);

        let encoding = tokenizer()
            .encode(prompt, text, Truncation::Truncate)
            .unwrap();
        prop_assert_eq!(all.tokens(i), Some(encoding.len()));
        prop_assert_eq!(all.truncated(i), Some(encoding.truncated()));
        if encoding.truncated() && first_too_long.is_none() {
            first_too_long = Some((i, encoding.untruncated_len()));
        }

        let alone = embedder.embed(&[text], task.clone()).unwrap();
        let diff = max_abs_diff(v, alone.get(0).unwrap());
        prop_assert!(diff <= BATCH_VS_ALONE, "text {}: |Δ| {} to alone", i, diff);
    }

    let refuse = EmbedOptions::new(task).truncation(Truncation::Error);
    match (embedder.embed_with(&refs, &refuse), first_too_long) {
        (Ok(e), None) => prop_assert_eq!(e.len(), refs.len()),
        (Err(Error::InputTooLong { index, tokens, max }), Some((i, untruncated))) => {
            prop_assert_eq!((index, tokens), (i, untruncated));
            prop_assert_eq!(max, tokenizer().max_length());
        }
        (other, expected) => {
            prop_assert!(
                false,
                "expected refusal {:?}, got {:?}",
                expected,
                other.err()
            )
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn ort_fp32(texts in texts(), task in task()) {
        static EMBEDDER: OnceLock<TextEmbedder> = OnceLock::new();
        let embedder = EMBEDDER.get_or_init(|| ort(Precision::Fp32, BatchOptions::default()));
        check(embedder, &texts, task)?;
    }

    #[test]
    fn ort_int8_in_batches_of_one(texts in texts(), task in task()) {
        static EMBEDDER: OnceLock<TextEmbedder> = OnceLock::new();
        let embedder = EMBEDDER
            .get_or_init(|| ort(Precision::Int8, BatchOptions::default().max_batch_size(1)));
        check(embedder, &texts, task)?;
    }

    #[test]
    fn ort_fused_fp32(texts in texts(), task in task()) {
        static EMBEDDER: OnceLock<TextEmbedder> = OnceLock::new();
        let embedder = EMBEDDER.get_or_init(|| fused(Precision::Fp32));
        check(embedder, &texts, task)?;
    }

    /// The fused graph's int8 (the default) in its default batches: per-row activation
    /// scales, so a batch changes a vector by float summation order only.
    #[test]
    fn ort_fused_int8(texts in texts(), task in task()) {
        static EMBEDDER: OnceLock<TextEmbedder> = OnceLock::new();
        let embedder = EMBEDDER.get_or_init(|| fused(Precision::Int8));
        check(embedder, &texts, task)?;
    }

    #[test]
    fn candle_f32(texts in texts(), task in task()) {
        static EMBEDDER: OnceLock<TextEmbedder> = OnceLock::new();
        let embedder = EMBEDDER
            .get_or_init(|| ruri::candle::builder().build_from_dir(tiny_model_dir()).unwrap());
        check(embedder, &texts, task)?;
    }

    /// The native engine's int8 in its default batches: batch-independent by construction
    /// (per-row activations, exact integer sums), so batched equals alone here too.
    #[test]
    fn native_int8(texts in texts(), task in task()) {
        static EMBEDDER: OnceLock<TextEmbedder> = OnceLock::new();
        let embedder = EMBEDDER
            .get_or_init(|| ruri::native::builder().build_from_dir(tiny_model_dir()).unwrap());
        check(embedder, &texts, task)?;
    }

    #[test]
    fn native_fp32(texts in texts(), task in task()) {
        static EMBEDDER: OnceLock<TextEmbedder> = OnceLock::new();
        let embedder = EMBEDDER.get_or_init(|| {
            ruri::native::builder()
                .precision(ruri::native::Precision::Fp32)
                .build_from_dir(tiny_model_dir())
                .unwrap()
        });
        check(embedder, &texts, task)?;
    }
}
