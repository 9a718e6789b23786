//! Libraries that pass ort's version check but give no API: `OrtGetApiBase()` returning NULL,
//! or a supported version string with `GetApi` returning NULL (a stub or broken build). Its
//! own test binary: ort keeps the first library that passes its version check for the whole
//! process, so this must not share a process with other runtime tests.

use ruri_core::Error;
use ruri_testkit::{FakeOrt, fake_onnxruntime, tiny_model_dir};

/// `RuntimeUnavailable`, as for any unusable library. ort itself asserts on both
/// (`assert!(!base.is_null())` in `ort::load_dynamic::version_string`; `expect("Failed to
/// initialize ORT API")` in `ort::setup_api`), so ruri-ort probes the library first.
#[test]
fn a_library_without_an_api_is_refused_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    // NULL base first: it fails before ort keeps the library for the process.
    for fake in [FakeOrt::NullApiBase, FakeOrt::Version("1.31.1")] {
        let library = fake_onnxruntime(dir.path(), fake);
        let result = std::panic::catch_unwind(|| {
            ruri_ort::builder()
                .runtime_path(&library)
                .build_from_dir(tiny_model_dir())
        });
        match result {
            Ok(Err(e @ Error::RuntimeUnavailable { .. })) => {
                let message = format!("{e}");
                assert!(
                    message.contains("NULL") || message.contains("C API version"),
                    "{message}"
                );
            }
            Ok(other) => panic!("{fake:?}: expected RuntimeUnavailable, got {other:?}"),
            Err(_) => panic!("{fake:?}: building the embedder panicked"),
        }
    }
}
