//! Model folders in both layouts, and broken ones: each problem is a typed error, never a
//! panic.

use ruri_core::{Error, Layout, ModelDir, Task, TextEmbedder};
use ruri_ort::Precision;
use ruri_testkit::{Agreement, Reference, copy_model, edit_file, tiny_model_dir};

fn copy_tiny(keep: &dyn Fn(&str) -> bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_model(&tiny_model_dir(), dir.path(), keep);
    dir
}

fn build(dir: &std::path::Path) -> Result<TextEmbedder, Error> {
    ruri_ort::builder()
        .graph(ruri_ort::Graph::OnnxFile)
        .build_from_dir(dir)
}

#[test]
fn onnx_port_layout_loads_and_matches_python() {
    // The file set of sirasagi62/ruri-v3-30m-ONNX: no modules.json, no sentence_bert_config.
    let dir = copy_tiny(&|p| {
        matches!(
            p,
            "config.json" | "tokenizer.json" | "tokenizer_config.json" | "special_tokens_map.json"
        ) || p.starts_with("onnx/")
    });
    assert_eq!(
        ModelDir::open(dir.path()).unwrap().layout(),
        Layout::OnnxPort
    );
    let embedder = build(dir.path()).unwrap();
    // Without sentence_bert_config.json the limit is tokenizer_config's model_max_length.
    assert_eq!(embedder.tokenizer().max_length(), 8192);
    let reference = Reference::tiny();
    let mut agreement = Agreement::new();
    for item in reference.items.iter().filter(|i| !i.truncated) {
        let v = embedder
            .embed(
                &[format!("{}{}", item.prompt, item.text).as_str()],
                Task::None,
            )
            .unwrap();
        agreement.add(v.get(0).unwrap(), &item.st_fp32.normalized);
    }
    assert!(
        agreement.min_cosine >= 0.99999 && agreement.max_abs_diff <= 1e-5,
        "{agreement:?}"
    );
}

#[test]
fn sentence_transformers_layout_is_detected() {
    assert_eq!(
        ModelDir::open(tiny_model_dir()).unwrap().layout(),
        Layout::SentenceTransformers
    );
}

#[test]
fn explicit_onnx_file_equals_the_precision_default() {
    let by_precision = ruri_ort::builder()
        .graph(ruri_ort::Graph::OnnxFile)
        .precision(Precision::Int8)
        .build_from_dir(tiny_model_dir())
        .unwrap();
    let by_file = ruri_ort::builder()
        .graph(ruri_ort::Graph::OnnxFile)
        .onnx_file("onnx/model_quantized.onnx")
        .build_from_dir(tiny_model_dir())
        .unwrap();
    let texts = ["瑠璃色", "検索"];
    assert_eq!(
        by_precision.embed(&texts, Task::Query).unwrap(),
        by_file.embed(&texts, Task::Query).unwrap()
    );
    assert_eq!(
        by_file
            .backend_as::<ruri_ort::OrtBackend>()
            .unwrap()
            .onnx_file(),
        tiny_model_dir().join("onnx/model_quantized.onnx")
    );
}

#[test]
fn missing_folder_and_files() {
    let nowhere = tiny_model_dir().join("does-not-exist");
    assert!(matches!(build(&nowhere), Err(Error::MissingFile { path }) if path == nowhere));

    let no_config = copy_tiny(&|p| p != "config.json");
    assert!(matches!(build(no_config.path()),
        Err(Error::MissingFile { path }) if path.ends_with("config.json")));

    let no_tokenizer = copy_tiny(&|p| p != "tokenizer.json");
    assert!(matches!(build(no_tokenizer.path()),
        Err(Error::MissingFile { path }) if path.ends_with("tokenizer.json")));

    let no_onnx = copy_tiny(&|p| !p.starts_with("onnx/"));
    assert!(matches!(build(no_onnx.path()),
        Err(Error::NoModelFile { looked_for, found, .. })
            if looked_for[0] == "onnx/model.onnx" && found.is_empty()));
    let int8 = ruri_ort::builder()
        .graph(ruri_ort::Graph::OnnxFile)
        .precision(Precision::Int8)
        .build_from_dir(no_onnx.path());
    assert!(matches!(int8,
        Err(Error::NoModelFile { looked_for, .. }) if looked_for[0] == "onnx/model_quantized.onnx"));
}

#[test]
fn corrupt_files() {
    let dir = copy_tiny(&|_| true);
    std::fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    assert!(
        matches!(build(dir.path()), Err(Error::InvalidJson { path, .. }) if path.ends_with("config.json"))
    );

    let dir = copy_tiny(&|_| true);
    std::fs::write(dir.path().join("tokenizer.json"), "{}").unwrap();
    assert!(matches!(
        build(dir.path()),
        Err(Error::InvalidTokenizer { .. })
    ));

    let dir = copy_tiny(&|_| true);
    std::fs::write(
        dir.path().join("1_Pooling/config.json"),
        r#"{"pooling_mode_cls_token": true}"#,
    )
    .unwrap();
    assert!(matches!(build(dir.path()), Err(Error::Unsupported { .. })));

    // A truncated ONNX file: ONNX Runtime's own error, kept as the source.
    let dir = copy_tiny(&|_| true);
    let onnx = dir.path().join("onnx/model.onnx");
    let bytes = std::fs::read(&onnx).unwrap();
    std::fs::write(&onnx, &bytes[..bytes.len() / 3]).unwrap();
    match build(dir.path()) {
        Err(Error::Backend {
            backend: "ort",
            source,
            ..
        }) => {
            assert!(!source.to_string().is_empty());
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
}

#[test]
fn config_that_disagrees_with_the_files() {
    fn invalid_config(e: &Error) -> bool {
        matches!(e, Error::InvalidConfig { .. })
    }
    fn pad_mismatch(e: &Error) -> bool {
        matches!(e, Error::InvalidConfig { reason, .. } if reason.contains("pads with id 3"))
    }
    /// The edit to config.json, and the error it must cause.
    type Case = (&'static str, &'static str, fn(&Error) -> bool);
    let cases: [Case; 3] = [
        // hidden_size that the ONNX output does not have.
        ("\"hidden_size\": 64", "\"hidden_size\": 32", invalid_config),
        // A vocabulary smaller than the tokenizer's: ids would index past the embeddings.
        (
            "\"vocab_size\": 8000",
            "\"vocab_size\": 100",
            invalid_config,
        ),
        // A pad id that is not the tokenizer's.
        ("\"pad_token_id\": 3", "\"pad_token_id\": 0", pad_mismatch),
    ];
    for (from, to, expected) in cases {
        let dir = copy_tiny(&|_| true);
        edit_file(&dir.path().join("config.json"), from, to);
        match build(dir.path()) {
            Err(e) if expected(&e) => {}
            other => panic!("{to}: unexpected {other:?}"),
        }
    }
}

#[test]
fn invalid_builder_options() {
    let zero_sessions = ruri_ort::builder()
        .graph(ruri_ort::Graph::OnnxFile)
        .sessions(0)
        .build_from_dir(tiny_model_dir());
    assert!(matches!(
        zero_sessions,
        Err(Error::InvalidOption {
            name: "sessions",
            ..
        })
    ));
    let zero_threads = ruri_ort::builder()
        .graph(ruri_ort::Graph::OnnxFile)
        .intra_threads(0)
        .build_from_dir(tiny_model_dir());
    assert!(matches!(
        zero_threads,
        Err(Error::InvalidOption {
            name: "intra_threads",
            ..
        })
    ));
}
