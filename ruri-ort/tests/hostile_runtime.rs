//! ONNX Runtime libraries that are not usable: too old, or not ONNX Runtime at all. Each is
//! a typed error that names the library and says how to get a working one. Its own test
//! binary (ONNX Runtime is loaded once per process): no test here loads a working library.
//! The fake libraries are built with `cc` (tools/testkit's `fake_onnxruntime`).

use ruri_core::Error;
use ruri_testkit::{FakeOrt, fake_onnxruntime, tiny_model_dir};

fn refusal(library: &std::path::Path) -> String {
    match ruri_ort::builder()
        .runtime_path(library)
        .build_from_dir(tiny_model_dir())
    {
        Err(e @ Error::RuntimeUnavailable { .. }) => e.to_string(),
        other => panic!("expected RuntimeUnavailable, got {other:?}"),
    }
}

/// What an ONNX Runtime older than ruri accepts looks like to the loader: its version string,
/// and no API of ruri's level. 1.21 lacks the API level (22); 1.22 has it but aborts the
/// process when `ort` creates a session, so it is refused by its version, before `ort` loads
/// it. The real libraries of the onnxruntime 1.21.1 and 1.22.0 wheels gave the same errors
/// (checked by hand, see docs/hostile-inputs.md; CI does not download them).
#[test]
fn too_old_a_version_is_refused_with_its_version() {
    for version in ["1.21.1", "1.22.0"] {
        let dir = tempfile::tempdir().unwrap();
        let library = fake_onnxruntime(dir.path(), FakeOrt::Version(version));
        let message = refusal(&library);
        assert!(
            message.contains(&format!("version {version} is too old")),
            "{message}"
        );
        assert!(message.contains(&*library.to_string_lossy()), "{message}");
        assert!(
            message.contains("pip download") && message.contains("ORT_DYLIB_PATH"),
            "{message}"
        );
    }
}

#[test]
fn a_shared_library_that_is_not_onnx_runtime_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let library = fake_onnxruntime(dir.path(), FakeOrt::NotOnnxRuntime);
    let message = refusal(&library);
    assert!(message.contains("OrtGetApiBase"), "{message}");
    assert!(message.contains("ORT_DYLIB_PATH"), "{message}");
}
