//! Texts through the whole path (tokenize with the prompt, length-sorted batches over two
//! sessions, ONNX Runtime fp32 on the tiny model, pooling, normalization): no panic; with the
//! default policy one finite unit vector per text, in order, each equal to the same text
//! embedded alone; token counts and truncation flags as the tokenizer says; with
//! `Truncation::Error`, refused exactly when a text is too long, naming the first one.

#![no_main]

use ruri_core::TextEmbedder;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use ruri_core::{BatchOptions, EmbedOptions, Error, Truncation};
use ruri_fuzz::{Request, tiny_model_dir};

/// fp32 batch against alone: float summation order only (≈3e-7 seen in the property tests).
const BATCH_VS_ALONE: f32 = 1e-5;

fn embedder() -> &'static TextEmbedder {
    static EMBEDDER: OnceLock<TextEmbedder> = OnceLock::new();
    EMBEDDER.get_or_init(|| {
        ruri_ort::builder()
            .sessions(2)
            .intra_threads(1)
            // Small batches: a few texts already make several, some run in parallel, and a
            // long text runs alone past the budget.
            .batching(
                BatchOptions::default()
                    .max_batch_tokens(256)
                    .max_batch_size(3),
            )
            .build_from_dir(tiny_model_dir())
            .expect("the tiny model and ONNX Runtime (tools/fetch-onnxruntime.sh)")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some(request) = Request::decode(data) else {
        return;
    };
    let embedder = embedder();
    let tokenizer = embedder.tokenizer();
    let texts = request.text_refs();
    let encodings: Vec<_> = texts
        .iter()
        .map(|t| {
            tokenizer
                .encode(request.prompt, t, Truncation::Truncate)
                .expect("truncating never fails")
        })
        .collect();
    let first_too_long = encodings.iter().position(|e| e.truncated());
    let options = EmbedOptions::new(request.task.clone()).truncation(request.truncation);

    match embedder.embed_with(&texts, &options) {
        Ok(all) => {
            assert!(request.truncation == Truncation::Truncate || first_too_long.is_none());
            assert_eq!(all.len(), texts.len());
            for (i, (text, encoding)) in texts.iter().zip(&encodings).enumerate() {
                let v = all.get(i).expect("one vector per text");
                assert!(v.iter().all(|x| x.is_finite()), "text {i}: {v:?}");
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                assert!((norm - 1.0).abs() < 1e-4, "text {i}: norm {norm}");
                assert_eq!(all.tokens(i), Some(encoding.len()));
                assert_eq!(all.truncated(i), Some(encoding.truncated()));
                let alone = embedder
                    .embed_with(&[text], &options)
                    .expect("a text of a successful batch succeeds alone");
                let diff = v
                    .iter()
                    .zip(alone.get(0).expect("one vector"))
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                assert!(diff <= BATCH_VS_ALONE, "text {i}: |Δ| {diff} to alone");
            }
        }
        Err(Error::InputTooLong { index, tokens, max }) => {
            assert_eq!(request.truncation, Truncation::Error);
            assert_eq!(Some(index), first_too_long);
            assert_eq!(tokens, encodings[index].untruncated_len());
            assert_eq!(max, tokenizer.max_length());
        }
        Err(e) => panic!("unexpected error: {e:?}"),
    }
});
