//! A missing or unloadable ONNX Runtime library is a typed error that says how to get one.
//! Its own test binary: no test here ever loads a working library, so none can mask another.

use ruri_core::{Error, TextEmbedder};
use ruri_testkit::tiny_model_dir;

fn message_of(result: Result<TextEmbedder, Error>) -> String {
    match result {
        Err(e @ Error::RuntimeUnavailable { .. }) => e.to_string(),
        other => panic!("expected RuntimeUnavailable, got {other:?}"),
    }
}

#[test]
fn missing_library_explains_how_to_install() {
    let message = message_of(
        ruri_ort::builder()
            .runtime_path("/nonexistent/libonnxruntime.so.1.31.1")
            .build_from_dir(tiny_model_dir()),
    );
    assert!(
        message.contains("/nonexistent/libonnxruntime.so.1.31.1"),
        "{message}"
    );
    assert!(
        message.contains("pip download") && message.contains("ORT_DYLIB_PATH"),
        "{message}"
    );
    assert!(message.contains("ORT_DYLIB_PATH"), "{message}");
}

#[test]
fn a_file_that_is_not_a_library_is_refused() {
    let not_a_library = tiny_model_dir().join("config.json");
    let message = message_of(
        ruri_ort::builder()
            .runtime_path(&not_a_library)
            .build_from_dir(tiny_model_dir()),
    );
    assert!(message.contains("config.json"), "{message}");
}
