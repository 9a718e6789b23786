//! Loading: `model.`-prefixed checkpoints, and typed errors for broken folders and options.

use ruri_core::TextEmbedder;
use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;
use ruri_core::Error;
use ruri_testkit::{copy_model, tiny_model_dir};

/// A copy of the tiny model whose `model.safetensors` is `edit` applied to the original tensors.
fn edited_copy(edit: impl FnOnce(&mut HashMap<String, Tensor>)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_model(&tiny_model_dir(), dir.path(), &|p| p != "model.safetensors");
    let mut tensors = candle_core::safetensors::load(
        tiny_model_dir().join("model.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    edit(&mut tensors);
    candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors")).unwrap();
    dir
}

fn build(dir: &Path) -> ruri_core::Result<TextEmbedder> {
    ruri_candle::builder().build_from_dir(dir)
}

const TEXTS: [&str; 3] = ["瑠璃色はどんな色？", "検索文書: 今日は晴れです。", ""];

#[test]
fn model_prefix_loads_identically() {
    let prefixed = edited_copy(|tensors| {
        *tensors = tensors
            .drain()
            .map(|(name, t)| (format!("model.{name}"), t))
            .collect();
    });
    let plain = build(&tiny_model_dir()).unwrap();
    let with_prefix = build(prefixed.path()).unwrap();
    assert!(
        !plain
            .backend_as::<ruri_candle::CandleBackend>()
            .unwrap()
            .weights_prefixed()
    );
    assert!(
        with_prefix
            .backend_as::<ruri_candle::CandleBackend>()
            .unwrap()
            .weights_prefixed()
    );
    let a = plain.embed_documents(&TEXTS).unwrap();
    let b = with_prefix.embed_documents(&TEXTS).unwrap();
    assert_eq!(a.as_slice(), b.as_slice(), "same weights, same vectors");
}

#[test]
fn missing_weights_is_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    copy_model(&tiny_model_dir(), dir.path(), &|p| p != "model.safetensors");
    match build(dir.path()) {
        Err(Error::MissingFile { path }) => assert!(path.ends_with("model.safetensors")),
        other => panic!("expected MissingFile, got {other:?}"),
    }
}

#[test]
fn wrong_shape_is_invalid_config() {
    let dir = edited_copy(|tensors| {
        let wi = tensors.get_mut("layers.1.mlp.Wi.weight").unwrap();
        *wi = wi.narrow(0, 0, 64).unwrap();
    });
    match build(dir.path()) {
        Err(Error::InvalidConfig { path, reason }) => {
            assert!(path.ends_with("model.safetensors"));
            assert!(reason.contains("layers.1.mlp.Wi.weight"), "{reason}");
            assert!(reason.contains("[64, 64]"), "{reason}");
        }
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

#[test]
fn missing_tensor_is_invalid_config() {
    let dir = edited_copy(|tensors| {
        tensors.remove("layers.2.attn_norm.weight");
    });
    match build(dir.path()) {
        Err(Error::InvalidConfig { reason, .. }) => {
            assert!(reason.contains("layers.2.attn_norm.weight"), "{reason}")
        }
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

#[test]
fn not_modernbert_is_invalid_config() {
    let dir = edited_copy(|tensors| {
        let t = tensors.remove("embeddings.tok_embeddings.weight").unwrap();
        tensors.insert("bert.embeddings.word_embeddings.weight".into(), t);
    });
    assert!(matches!(
        build(dir.path()),
        Err(Error::InvalidConfig { .. })
    ));
}

#[test]
fn bad_batching_is_invalid_option() {
    let result = ruri_candle::builder()
        .batching(ruri_core::BatchOptions::default().max_batch_tokens(0))
        .build_from_dir(tiny_model_dir());
    assert!(matches!(
        result,
        Err(Error::InvalidOption {
            name: "max_batch_tokens",
            ..
        })
    ));
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_without_feature_is_invalid_option() {
    let result = ruri_candle::builder()
        .device(ruri_candle::Device::Cuda(0))
        .dtype(ruri_candle::DType::BF16)
        .build_from_dir(tiny_model_dir());
    match result {
        Err(Error::InvalidOption {
            name,
            value,
            reason,
        }) => {
            assert_eq!(name, "device");
            assert_eq!(value, "cuda:0");
            assert!(reason.contains("`cuda` feature"), "{reason}");
        }
        other => panic!("expected InvalidOption, got {other:?}"),
    }
}

#[test]
fn embedder_is_send_sync_and_concurrent() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<TextEmbedder>();
    let embedder = build(&tiny_model_dir()).unwrap();
    let alone = embedder.embed_documents(&TEXTS).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|_| s.spawn(|| embedder.embed_documents(&TEXTS).unwrap()))
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap().as_slice(), alone.as_slice());
        }
    });
}
