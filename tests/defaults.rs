//! The facade's defaults (issue 21, item 7): with no backend named, a model runs on the
//! native engine (the fastest at int8; see BENCHMARKS.md for fp32), at fp32; a model with ONNX files
//! only is refused with a typed error that names backend ort, which runs it.
//!
//! These tests fail if the default moves off the native engine: the loaded backend is checked
//! by its concrete type, not by the name the configuration reports.

use ruri::hub::HubRepo;
use ruri::{BackendKind, EmbedderConfig, Error, Precision, TextEmbedder};
use ruri_testkit::hub_mock::{self, MockHub, TINY_MIRROR_REPO};
use ruri_testkit::{TempDir, repo_root, tiny_model_copy, tiny_model_dir};

mod support;
use support::hub;

const TEXTS: &[&str] = &["瑠璃色はどんな色？", "瑠璃は青い宝石です。"];

fn vectors(embedder: &TextEmbedder) -> Vec<Vec<f32>> {
    let embeddings = embedder.embed_documents(TEXTS).unwrap();
    embeddings.iter().map(<[f32]>::to_vec).collect()
}

fn is_native(embedder: &TextEmbedder) -> bool {
    embedder
        .backend_as::<ruri::native::NativeBackend>()
        .is_some()
}

/// The tiny model as an ONNX port has it: the configs, the tokenizer and `onnx/`, no
/// `model.safetensors`.
fn onnx_only_folder() -> TempDir {
    tiny_model_copy(&|name| name != "model.safetensors")
}

#[test]
fn the_default_build_turns_the_native_engine_on() {
    // The root package's default features, as Cargo.toml writes them: a build without
    // `native` would pick ort (BackendKind::best) and these tests would not run.
    let manifest = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    let defaults = manifest
        .lines()
        .find(|line| line.starts_with("default = ["))
        .expect("a default feature list");
    assert!(defaults.contains("\"native\""), "{defaults}");
}

#[test]
fn with_no_backend_named_the_native_engine_runs_at_fp32() {
    assert_eq!(BackendKind::best(), BackendKind::Native);
    let config = EmbedderConfig::default();
    assert_eq!(config.get_backend(), BackendKind::Native);
    assert_eq!(config.get_precision(), Precision::Fp32);

    let default = ruri::from_pretrained(tiny_model_dir()).unwrap();
    assert!(
        is_native(&default),
        "from_pretrained did not load the native engine"
    );
    let built = EmbedderConfig::new()
        .build_from_dir(tiny_model_dir())
        .unwrap();
    assert!(is_native(&built));
    // The native engine at fp32, not at int8: the same bits as its own builder's fp32.
    let native_fp32 = ruri::native::builder()
        .precision(ruri::native::Precision::Fp32)
        .build_from_dir(tiny_model_dir())
        .unwrap();
    assert_eq!(vectors(&default), vectors(&native_fp32));
    assert_eq!(vectors(&built), vectors(&native_fp32));
    // And ort only when asked for.
    let ort = EmbedderConfig::new()
        .backend(BackendKind::Ort)
        .build_from_dir(tiny_model_dir())
        .unwrap();
    assert!(!is_native(&ort));
    assert!(ort.backend_as::<ruri::ort::FusedBackend>().is_some());
}

/// The refusal of an ONNX-only model: the option to change, and the ONNX files it has.
fn assert_names_backend_ort(message: &str, backend: &str) {
    assert!(
        message.contains(&format!("which backend {backend} reads")),
        "{message}"
    );
    assert!(message.contains("backend ort"), "{message}");
    assert!(message.contains("--backend ort"), "{message}");
    assert!(message.contains("onnx/model.onnx"), "{message}");
}

#[test]
fn an_onnx_only_folder_is_refused_naming_backend_ort_which_runs_it() {
    let folder = onnx_only_folder();
    for (config, backend) in [
        (EmbedderConfig::new(), "native"),
        (
            EmbedderConfig::new()
                .backend(BackendKind::Native)
                .precision(Precision::Int8),
            "native",
        ),
        (EmbedderConfig::new().backend(BackendKind::Candle), "candle"),
    ] {
        match config.build_from_dir(folder.path()) {
            Err(
                ref error @ Error::NoModelFile {
                    ref dir,
                    ref looked_for,
                    ref found,
                    ..
                },
            ) => {
                assert_eq!(dir, folder.path());
                assert_eq!(looked_for, &["model.safetensors"]);
                assert_eq!(
                    found,
                    &["onnx/model.onnx", "onnx/model_quantized.onnx"],
                    "{config:?}"
                );
                assert_names_backend_ort(&ruri::error_chain(error).to_string(), backend);
            }
            Err(other) => panic!("{config:?}: not NoModelFile: {other}"),
            Ok(_) => panic!("{config:?}: loaded a folder without model.safetensors"),
        }
    }
    assert!(ruri::from_pretrained(folder.path()).is_err());

    // The fix the message names works: ort runs the folder's ONNX files, fp32 and int8.
    for precision in [Precision::Fp32, Precision::Int8] {
        let ort = EmbedderConfig::new()
            .backend(BackendKind::Ort)
            .precision(precision)
            .build_from_dir(folder.path())
            .unwrap();
        let file = ort
            .backend_as::<ruri::ort::OrtBackend>()
            .expect("the ort backend")
            .onnx_file()
            .to_owned();
        let wanted = match precision {
            Precision::Fp32 => "onnx/model.onnx",
            _ => "onnx/model_quantized.onnx",
        };
        assert_eq!(file, folder.path().join(wanted));
        assert_eq!(vectors(&ort).len(), TEXTS.len());
    }
}

#[test]
fn a_folder_with_no_weights_at_all_keeps_the_backends_missing_file() {
    let folder = tiny_model_copy(&|name| name != "model.safetensors" && !name.starts_with("onnx/"));
    match EmbedderConfig::new().build_from_dir(folder.path()) {
        Err(Error::MissingFile { path }) => {
            assert_eq!(path, folder.path().join("model.safetensors"))
        }
        other => panic!("expected MissingFile, got {:?}", other.err()),
    }
}

#[test]
fn an_onnx_only_hub_repository_is_refused_naming_backend_ort() {
    const ONNX_ONLY: &str = "ruri-test/tiny-onnx-only";
    let mut repo = hub_mock::tiny_repos()
        .into_iter()
        .find(|r| r.id == TINY_MIRROR_REPO)
        .expect("the mirror repository");
    repo.id = ONNX_ONLY.to_owned();
    for commit in &mut repo.commits {
        assert!(commit.files.remove("model.safetensors").is_some());
    }
    let mock = MockHub::start(vec![repo]);
    let cache = TempDir::new().unwrap();
    let at = || HubRepo::new(ONNX_ONLY).hub(hub(&mock, cache.path()));

    match EmbedderConfig::new().build_from_hub(at()) {
        Err(ref error @ Error::RemoteFileNotFound { ref files, .. }) => {
            assert!(files.contains(&"onnx/model.onnx".to_owned()), "{files:?}");
            assert_names_backend_ort(&ruri::error_chain(error).to_string(), "native");
        }
        other => panic!("expected RemoteFileNotFound, got {:?}", other.err()),
    }
    let ort = EmbedderConfig::new()
        .backend(BackendKind::Ort)
        .build_from_hub(at())
        .unwrap();
    let local = EmbedderConfig::new()
        .backend(BackendKind::Ort)
        .build_from_dir(onnx_only_folder().path())
        .unwrap();
    assert_eq!(vectors(&ort), vectors(&local));
}
