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
