//! The folders real Ruri ports publish: every ONNX file name they use, the preference between
//! them, the error when a precision is missing, a trailing `Normalize` module, and ONNX exports
//! with float16 outputs or with the normalization baked in (`testdata/onnx_variants/`, made by
//! tools/testdata/build_model.py). Expected vectors come from testdata/reference/tiny.json
//! (sentence-transformers and onnxruntime-Python), never from ruri. The rows about ONNX file
//! names concern ort's ONNX-file graph only; the rows about the folder's modules run every
//! graph and backend.

use ruri::TextEmbedder;
use std::path::Path;

use ruri::ort::Precision;
use ruri::{EmbedOptions, Embedder, Error, Task};
use ruri_testkit::{
    Reference, TempDir, cosine, max_abs_diff, testdata_dir, tiny_model_copy, tiny_model_dir,
};

/// fp32 runs the same math as torch: the parity test's tolerance.
const FP32_MAX_ABS_DIFF: f64 = 1e-5;

/// A copy of the tiny model without any ONNX file, with `files` (name in the copy, file of
/// testdata) put in.
fn folder_with(files: &[(&str, &Path)]) -> TempDir {
    let dir = tiny_model_copy(&|path| !path.ends_with(".onnx"));
    for (name, source) in files {
        let target = dir.path().join(name);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(source, target).unwrap();
    }
    dir
}

fn tiny_file(name: &str) -> std::path::PathBuf {
    tiny_model_dir().join(name)
}

fn ort(dir: &Path, precision: Precision) -> TextEmbedder {
    ruri::ort::builder()
        .graph(ruri::ort::Graph::OnnxFile)
        .precision(precision)
        .build_from_dir(dir)
        .unwrap_or_else(|e| panic!("{precision} in {}: {e}", dir.display()))
}

/// The document the folder tests embed, and its reference.
fn document() -> ruri_testkit::Item {
    Reference::tiny().item("document_capital").clone()
}

/// Which file ran, told apart by its output: the fp32 file gives sentence-transformers'
/// vector, the int8 file onnxruntime-Python's int8 vector (the two differ by far more than
/// either tolerance).
fn assert_runs(embedder: &TextEmbedder, fp32: bool, at: &str) {
    let item = document();
    let v = embedder.embed_documents(&[&item.text]).unwrap();
    let v = v.get(0).unwrap();
    let (fp32_diff, int8_diff) = (
        max_abs_diff(v, &item.st_fp32.normalized),
        max_abs_diff(v, &item.ort_int8.normalized),
    );
    if fp32 {
        assert!(fp32_diff <= FP32_MAX_ABS_DIFF, "{at}: {fp32_diff} to fp32");
    } else {
        assert!(
            int8_diff < fp32_diff,
            "{at}: {int8_diff} to int8, {fp32_diff} to fp32"
        );
    }
}

#[test]
fn every_port_file_name_is_found() {
    for precision in [Precision::Fp32, Precision::Int8] {
        let source = match precision {
            Precision::Fp32 => tiny_file("onnx/model.onnx"),
            _ => tiny_file("onnx/model_quantized.onnx"),
        };
        for name in precision.candidates() {
            let dir = folder_with(&[(name, &source)]);
            let embedder = ort(dir.path(), precision);
            let ran = embedder
                .backend_as::<ruri::ort::OrtBackend>()
                .unwrap()
                .onnx_file();
            assert_eq!(ran, dir.path().join(name), "{precision}");
            assert_runs(&embedder, precision == Precision::Fp32, name);
        }
    }
    // The names real ports publish are all among the candidates.
    for (precision, name) in [
        (Precision::Fp32, "onnx/model.onnx"),
        (Precision::Fp32, "model.onnx"),
        (Precision::Int8, "onnx/model_quantized.onnx"),
        (Precision::Int8, "onnx/model_int8.onnx"),
        (Precision::Int8, "onnx/model_qint8_avx512_vnni.onnx"),
        (Precision::Int8, "onnx/model_qint8_avx512.onnx"),
        (Precision::Int8, "onnx/model_qint8_avx2.onnx"),
        (Precision::Int8, "onnx/model_qint8_arm64.onnx"),
        (Precision::Fp16, "onnx/model_fp16.onnx"),
    ] {
        assert!(precision.candidates().contains(&name), "{name}");
    }
}

#[test]
fn the_preferred_name_wins() {
    let fp32 = tiny_file("onnx/model.onnx");
    let int8 = tiny_file("onnx/model_quantized.onnx");
    // The subfolder before the root; the other file is the other precision, so the vector
    // tells which ran.
    let dir = folder_with(&[("onnx/model.onnx", &fp32), ("model.onnx", &int8)]);
    assert_runs(&ort(dir.path(), Precision::Fp32), true, "onnx/ over root");
    // sirasagi62's name before sentence-transformers' export names.
    let dir = folder_with(&[
        ("onnx/model_quantized.onnx", &int8),
        ("onnx/model_qint8_avx512_vnni.onnx", &fp32),
        ("onnx/model_qint8_avx2.onnx", &fp32),
    ]);
    assert_runs(
        &ort(dir.path(), Precision::Int8),
        false,
        "model_quantized first",
    );
    // An explicit file beats discovery.
    let embedder = ruri::ort::builder()
        .graph(ruri::ort::Graph::OnnxFile)
        .precision(Precision::Int8)
        .onnx_file("onnx/model_qint8_avx2.onnx")
        .build_from_dir(dir.path())
        .unwrap();
    assert_runs(&embedder, true, "explicit file");
}

#[test]
fn a_missing_precision_lists_what_the_folder_has() {
    let int8 = tiny_file("onnx/model_quantized.onnx");
    let dir = folder_with(&[
        ("onnx/model_qint8_arm64.onnx", &int8),
        ("extra.onnx", &int8),
    ]);
    for precision in [Precision::Fp32, Precision::Fp16] {
        match ruri::ort::builder()
            .graph(ruri::ort::Graph::OnnxFile)
            .precision(precision)
            .build_from_dir(dir.path())
        {
            Err(Error::NoModelFile {
                looked_for, found, ..
            }) => {
                assert_eq!(looked_for, precision.candidates());
                assert_eq!(found, ["extra.onnx", "onnx/model_qint8_arm64.onnx"]);
            }
            other => panic!("{precision}: expected NoModelFile, got {:?}", other.err()),
        }
    }
    let e = ruri::ort::builder()
        .graph(ruri::ort::Graph::OnnxFile)
        .build_from_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("fp32 ONNX file") && e.contains("onnx/model_qint8_arm64.onnx"),
        "{e}"
    );
}

/// sentence-transformers' `Normalize` module does what the pipeline does by default.
#[test]
fn a_normalize_module_gives_sentence_transformers_vectors() {
    let dir = tiny_model_copy(&|_| true);
    ruri_testkit::edit_file(
        &dir.path().join("modules.json"),
        "\n]",
        r#", {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
]"#,
    );
    std::fs::create_dir(dir.path().join("2_Normalize")).unwrap();
    let item = document();
    // Every fp32 graph and backend: the module is read by the shared folder code, but each
    // backend's build path opens the folder.
    let embedders: [(&str, Box<dyn Embedder>); 4] = [
        ("ort ONNX file", Box::new(ort(dir.path(), Precision::Fp32))),
        (
            "ort fused graph",
            Box::new(
                ruri::ort::builder()
                    .graph(ruri::ort::Graph::Fused)
                    .precision(Precision::Fp32)
                    .build_from_dir(dir.path())
                    .unwrap(),
            ),
        ),
        (
            "candle",
            Box::new(ruri::candle::builder().build_from_dir(dir.path()).unwrap()),
        ),
        (
            "native",
            Box::new(
                ruri::native::builder()
                    .precision(ruri::native::Precision::Fp32)
                    .build_from_dir(dir.path())
                    .unwrap(),
            ),
        ),
    ];
    for (name, embedder) in embedders {
        let v = embedder.embed_documents(&[&item.text]).unwrap();
        let diff = max_abs_diff(v.get(0).unwrap(), &item.st_fp32.normalized);
        assert!(diff <= FP32_MAX_ABS_DIFF, "{name}: {diff}");
    }
}

fn variant(name: &str) -> std::path::PathBuf {
    testdata_dir().join("onnx_variants").join(name)
}

/// An opset-14 export whose only output, `sentence_embedding`, is L2-normalized in the graph
/// (as some published ports are): normalized vectors are right, raw ones are refused rather
/// than returned as unit vectors.
#[test]
fn a_normalized_only_output_refuses_raw_vectors() {
    let dir = folder_with(&[("onnx/model.onnx", &variant("tiny_normalized_opset14.onnx"))]);
    let embedder = ort(dir.path(), Precision::Fp32);
    let item = document();
    let v = embedder.embed_documents(&[&item.text]).unwrap();
    let diff = max_abs_diff(v.get(0).unwrap(), &item.st_fp32.normalized);
    assert!(diff <= FP32_MAX_ABS_DIFF, "{diff}");
    let raw = embedder.embed_with(
        &[&item.text],
        &EmbedOptions::new(Task::Document).normalize(false),
    );
    match raw {
        Err(Error::InvalidOption { name, reason, .. }) => {
            assert_eq!(name, "normalize");
            assert!(reason.contains("already L2-normalized"), "{reason}");
        }
        other => panic!("expected InvalidOption, got {other:?}"),
    }
}

/// A port whose `sentence_embedding` is normalized in the graph but which also has
/// `token_embeddings`: raw means raw, so the token embeddings are pooled instead.
#[test]
fn a_normalized_pooled_output_beside_token_embeddings_still_gives_raw_vectors() {
    let dir = folder_with(&[(
        "onnx/model.onnx",
        &variant("tiny_normalized_with_tokens.onnx"),
    )]);
    let embedder = ort(dir.path(), Precision::Fp32);
    let item = document();
    let normalized = embedder.embed_documents(&[&item.text]).unwrap();
    let diff = max_abs_diff(normalized.get(0).unwrap(), &item.st_fp32.normalized);
    assert!(diff <= FP32_MAX_ABS_DIFF, "normalized: {diff}");
    let raw = embedder
        .embed_with(
            &[&item.text],
            &EmbedOptions::new(Task::Document).normalize(false),
        )
        .unwrap();
    let raw = raw.get(0).unwrap();
    // Relative to the raw vector's scale: its entries are far from unit size.
    let scale = item
        .st_fp32
        .mean
        .iter()
        .fold(0.0f64, |m, &x| m.max(f64::from(x).abs()));
    let diff = max_abs_diff(raw, &item.st_fp32.mean);
    assert!(
        diff <= FP32_MAX_ABS_DIFF * scale,
        "raw: {diff} (scale {scale})"
    );
}

/// float16 outputs are read as float16 and widened: the vectors are onnxruntime-Python's on
/// the same file.
#[test]
fn float16_outputs_are_read() {
    let dir = folder_with(&[("onnx/model_fp16.onnx", &variant("tiny_fp16.onnx"))]);
    let reference = Reference::tiny();
    let item = reference.item("document_capital");
    let expected = item
        .ort_fp16
        .as_ref()
        .expect("tiny.json has onnxruntime-Python's fp16 vectors");
    match ruri::ort::builder()
        .graph(ruri::ort::Graph::OnnxFile)
        .precision(Precision::Fp16)
        .build_from_dir(dir.path())
    {
        Ok(embedder) => {
            let v = embedder.embed_documents(&[&item.text]).unwrap();
            let v = v.get(0).unwrap();
            println!(
                "fp16: cosine {} to onnxruntime-Python fp16, {} to st fp32",
                cosine(v, &expected.normalized),
                cosine(v, &item.st_fp32.normalized)
            );
            // The same kernels on the same file: float16 rounding of the output only.
            assert!(max_abs_diff(v, &expected.normalized) <= 1e-3);
        }
        Err(e) => panic!("fp16: {e}"),
    }
}
