//! What the examples share: the default model folder, loading through ruri's one loader, and
//! the exit status. The model flags themselves (`--model`, `--backend`, `--precision`, …) are
//! `ruri::cli::ModelArgs`, the facade's.
//!
//! Not an example itself (a folder is one only with a `main.rs`): each example includes it
//! with `mod common;`. (The HTTP server is a crate of its own, `ruri-server`.)

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ruri::TextEmbedder;
use ruri::cli::ModelArgs;

/// `--model`, or else the tiny test model, with a notice on stderr.
pub fn dir_or_tiny(args: &ModelArgs) -> PathBuf {
    args.model.clone().unwrap_or_else(|| {
        let dir = tiny_model_dir();
        eprintln!(
            "note: no --model given; using {}, a random-weight TEST model: its vectors mean nothing",
            dir.display()
        );
        dir
    })
}

/// Loads `model` (a folder, or a Hub id at `--revision`) as the flags ask (the native engine
/// unless `--backend` says otherwise), with the backend's `threads`; the error is the message
/// to print.
pub fn load(
    args: &ModelArgs,
    model: &Path,
    threads: Option<usize>,
) -> Result<TextEmbedder, String> {
    args.config()
        .threads(threads)
        .build_from_arg(model, args.revision.as_deref())
        .map_err(|e| describe(&e))
}

/// An error and its causes on one line (ruri's one formatter).
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    ruri::error_chain(e).to_string()
}

/// What `main` returns for `run`'s result: success, or failure after `error: <message>` on
/// stderr.
pub fn exit_code(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The committed tiny random-weight test model.
pub fn tiny_model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/tiny")
}
