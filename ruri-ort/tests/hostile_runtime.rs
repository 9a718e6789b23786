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

/// What an ONNX Runtime older than the API level ruri asks for (22) looks like to the
/// loader: its version string, and no API of that level. The real libonnxruntime.so.1.21.1
/// of the onnxruntime 1.21.1 wheel gave the same error (checked by hand, see
/// docs/hostile-inputs.md; CI does not download it).
#[test]
fn too_old_a_version_is_refused_with_its_version() {
    let dir = tempfile::tempdir().unwrap();
    let library = fake_onnxruntime(dir.path(), FakeOrt::Version("1.21.1"));
    let message = refusal(&library);
    assert!(message.contains("version 1.21.1 is too old"), "{message}");
    assert!(message.contains(&*library.to_string_lossy()), "{message}");
    assert!(
        message.contains("pip download") && message.contains("ORT_DYLIB_PATH"),
        "{message}"
    );
}

#[test]
fn a_shared_library_that_is_not_onnx_runtime_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let library = fake_onnxruntime(dir.path(), FakeOrt::NotOnnxRuntime);
    let message = refusal(&library);
    assert!(message.contains("OrtGetApiBase"), "{message}");
    assert!(message.contains("ORT_DYLIB_PATH"), "{message}");
}
