//! The fused graph on official-layout folders (model.safetensors, no ONNX file) and on broken
//! ones: each problem is a typed error naming the file, never a panic.

use ruri_core::{Error, TextEmbedder};
use ruri_ort::{FusedBackend, Graph, OrtBackend, Precision};
use ruri_testkit::{Agreement, Reference, copy_model, tiny_model_dir};

/// The tiny model without any ONNX file: the cl-nagoya layout.
fn official_layout() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_model(&tiny_model_dir(), dir.path(), &|p| !p.ends_with(".onnx"));
    dir
}

fn fused(dir: &std::path::Path, precision: Precision) -> Result<TextEmbedder, Error> {
    ruri_ort::builder()
        .graph(Graph::Fused)
        .precision(precision)
        .build_from_dir(dir)
}

#[test]
fn a_folder_without_onnx_runs_on_the_fused_graph_by_default() {
    let dir = official_layout();
    for precision in [Precision::Fp32, Precision::Int8] {
        let embedder = ruri_ort::builder()
            .precision(precision)
            .build_from_dir(dir.path())
            .unwrap();
        let backend = embedder
            .backend_as::<FusedBackend>()
            .expect("fused by default");
        assert_eq!(backend.is_int8(), precision == Precision::Int8);
        assert_eq!(
            backend.safetensors_file(),
            dir.path().join("model.safetensors")
        );
        let reference = Reference::tiny();
        let mut agreement = Agreement::new();
        for item in &reference.items {
            let v = embedder
                .embed(&[&item.text], ruri_core::Task::Prompt(item.prompt.clone()))
                .unwrap();
            agreement.add(v.get(0).unwrap(), &item.st_fp32.normalized);
        }
        let min = if precision == Precision::Fp32 {
            0.99999
        } else {
            0.995
        };
        assert!(agreement.min_cosine >= min, "{precision}: {agreement:?}");
        if precision == Precision::Fp32 {
            assert!(agreement.max_abs_diff <= 1e-5, "{agreement:?}");
        }
    }
}

#[test]
fn the_onnx_file_graph_stays_available() {
    let embedder = ruri_ort::builder()
        .graph(Graph::OnnxFile)
        .build_from_dir(tiny_model_dir())
        .unwrap();
    assert!(embedder.backend_as::<OrtBackend>().is_some());
    // An explicit file also means the file, under Auto.
    let embedder = ruri_ort::builder()
        .onnx_file("onnx/model.onnx")
        .build_from_dir(tiny_model_dir())
        .unwrap();
    assert!(embedder.backend_as::<OrtBackend>().is_some());
}

#[test]
fn conflicting_choices_are_refused() {
    let e = ruri_ort::builder()
        .graph(Graph::Fused)
        .onnx_file("onnx/model.onnx")
        .build_from_dir(tiny_model_dir())
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidOption { name: "graph", .. }),
        "{e:?}"
    );
    let e = fused(&tiny_model_dir(), Precision::Fp16).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidOption {
                name: "precision",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn a_folder_without_safetensors_is_a_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    copy_model(&tiny_model_dir(), dir.path(), &|p| p != "model.safetensors");
    let e = fused(dir.path(), Precision::Fp32).unwrap_err();
    assert!(
        matches!(&e, Error::MissingFile { path } if path.ends_with("model.safetensors")),
        "{e:?}"
    );
}

fn with_weights(bytes: &[u8]) -> tempfile::TempDir {
    let dir = official_layout();
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    dir
}

fn invalid_config(e: &Error) -> String {
    match e {
        Error::InvalidConfig { path, reason } if path.ends_with("model.safetensors") => {
            reason.clone()
        }
        other => panic!("expected InvalidConfig on model.safetensors, got {other:?}"),
    }
}

#[test]
fn broken_checkpoints_are_typed_errors() {
    let good = std::fs::read(tiny_model_dir().join("model.safetensors")).unwrap();
    // Truncated in the header, and in the data.
    for cut in [4, 100, good.len() / 2] {
        let dir = with_weights(&good[..cut]);
        let e = fused(dir.path(), Precision::Fp32).unwrap_err();
        invalid_config(&e);
    }
    // A header that is not JSON.
    let mut bad = good.clone();
    bad[8] = b'!';
    let e = fused(with_weights(&bad).path(), Precision::Int8).unwrap_err();
    assert!(invalid_config(&e).contains("JSON"), "{e:?}");
    // A checkpoint of another shape than config.json says.
    let dir = official_layout();
    let config = dir.path().join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("\"intermediate_size\": 128", "\"intermediate_size\": 96"),
    )
    .unwrap();
    let e = fused(dir.path(), Precision::Fp32).unwrap_err();
    assert!(invalid_config(&e).contains("mlp.Wi.weight"), "{e:?}");
}

/// The tiny model's checkpoint with its header rewritten by `edit` (offsets stay relative to
/// the data, so the data is kept as is).
fn with_header(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let good = std::fs::read(tiny_model_dir().join("model.safetensors")).unwrap();
    let len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&good[8..8 + len]).unwrap();
    edit(&mut header);
    let header = serde_json::to_vec(&header).unwrap();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.extend_from_slice(&good[8 + len..]);
    out
}

const EMBEDDINGS: &str = "embeddings.tok_embeddings.weight";

/// Crafted headers, each on both precisions: a typed error naming the tensor, never a panic
/// (tests run in a debug build, where each of these overflowed before the parser's
/// arithmetic was checked).
#[test]
fn crafted_headers_are_typed_errors() {
    let cases: [(&str, serde_json::Value, serde_json::Value); 5] = [
        (
            "offsets that wrap",
            // The right length, but `data_start + end` wraps past u64::MAX.
            serde_json::json!([8000, 64]),
            serde_json::json!([u64::MAX - 2_047_999, u64::MAX]),
        ),
        (
            "a range that runs backwards",
            serde_json::json!([8000, 64]),
            serde_json::json!([2_048_000, 0]),
        ),
        (
            "a start past the end of the file",
            serde_json::json!([8000, 64]),
            serde_json::json!([1u64 << 40, (1u64 << 40) + 2_048_000]),
        ),
        (
            "a shape whose product overflows",
            serde_json::json!([1u64 << 32, 1u64 << 32, 2]),
            serde_json::json!([0, 0]),
        ),
        (
            "a product that wraps to the data's length",
            // (2^62 + 2) · 4 bytes ≡ 8 (mod 2^64).
            serde_json::json!([(1u64 << 62) + 2]),
            serde_json::json!([0, 8]),
        ),
    ];
    for (case, shape, offsets) in cases {
        let bytes = with_header(|h| {
            h[EMBEDDINGS]["shape"] = shape.clone();
            h[EMBEDDINGS]["data_offsets"] = offsets.clone();
        });
        for precision in [Precision::Fp32, Precision::Int8] {
            let e = fused(with_weights(&bytes).path(), precision).unwrap_err();
            let reason = invalid_config(&e);
            assert!(
                reason.contains(EMBEDDINGS) && reason.contains("does not fit"),
                "{case}, {precision:?}: {reason}"
            );
        }
    }
}

/// A `config.json` whose vocabulary makes the embedding table's byte length wrap to exactly
/// its real length: (2^56 + 8000) · 64 · 4 ≡ 8000 · 64 · 4 (mod 2^64). Unchecked, the shape
/// matched config.json, the size check passed, and the int8 table asked for 2^62 bytes.
#[test]
fn a_table_whose_length_wraps_to_the_right_size_is_refused() {
    let vocab = (1u64 << 56) + 8000;
    let bytes = with_header(|h| h[EMBEDDINGS]["shape"] = serde_json::json!([vocab, 64]));
    for precision in [Precision::Fp32, Precision::Int8] {
        let dir = with_weights(&bytes);
        let config = dir.path().join("config.json");
        let text = std::fs::read_to_string(&config).unwrap();
        assert!(text.contains("\"vocab_size\": 8000"));
        std::fs::write(
            &config,
            text.replace("\"vocab_size\": 8000", &format!("\"vocab_size\": {vocab}")),
        )
        .unwrap();
        let e = fused(dir.path(), precision).unwrap_err();
        let reason = invalid_config(&e);
        assert!(
            reason.contains(EMBEDDINGS) && reason.contains("does not fit"),
            "{precision:?}: {reason}"
        );
    }
}
