//! What the examples share: the model flags (`--model`, `--backend`, `--precision`), the
//! default model folder, loading the chosen backend, and the exit status.
//!
//! Not an example itself (a folder is one only with a `main.rs`): each example includes it
//! with `mod common;`. The error formatter, `describe.rs`, is not part of it: `search` and
//! `embed` include it themselves. (The HTTP server is a crate of its own, `ruri-server`.)

use ruri::TextEmbedder;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::ValueEnum;
use ruri::candle::DType;
use ruri::ort::Precision as OrtPrecision;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum BackendArg {
    /// ONNX Runtime (fp32, int8).
    Ort,
    /// candle on the CPU (fp32, bf16).
    Candle,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Precision {
    Fp32,
    Int8,
    Fp16,
    Bf16,
}

/// `--whitespace`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum WhitespaceArg {
    /// Prompt + text as given (sentence-transformers ≥ 5.4).
    Keep,
    /// Strip prompt + text as Python's str.strip() (sentence-transformers 2.x–5.3, what Ruri
    /// v3 was trained with and most existing indexes were built with).
    Strip,
}

/// The model flags every example takes.
#[derive(Debug, clap::Args)]
pub struct ModelArgs {
    /// Model folder (sentence-transformers layout, or an ONNX port), or a Hugging Face Hub
    /// model id (org/name: only the files the backend and precision need are downloaded into
    /// the Hub's cache; HF_ENDPOINT, HF_HUB_CACHE, HF_TOKEN, HF_HUB_OFFLINE apply). An
    /// existing folder wins over an id. Default: the committed tiny random-weight test model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Branch, tag or commit of a Hub model id (default: main).
    #[arg(long)]
    pub revision: Option<String>,
    /// Inference backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Ort)]
    pub backend: BackendArg,
    /// Weights precision (ort: of its graph built from model.safetensors, or else which ONNX
    /// file of the folder runs; candle: the dtype).
    #[arg(long, value_enum, default_value_t = Precision::Fp32)]
    pub precision: Precision,
    /// Run this ONNX file (relative to the model folder, or absolute) instead of the one
    /// --precision finds (ort only).
    #[arg(long)]
    pub onnx_file: Option<PathBuf>,
    /// Whitespace at the ends of prompt + text.
    #[arg(long, value_enum, default_value_t = WhitespaceArg::Keep)]
    pub whitespace: WhitespaceArg,
}

impl ModelArgs {
    /// `--model`, or else the tiny test model, with a notice on stderr.
    pub fn dir_or_tiny(&self) -> PathBuf {
        self.model.clone().unwrap_or_else(|| {
            let dir = tiny_model_dir();
            eprintln!(
                "note: no --model given; using {}, a random-weight TEST model: its vectors mean nothing",
                dir.display()
            );
            dir
        })
    }

    /// Refuses a precision the chosen backend lacks, as `--precision <value> needs …`.
    pub fn check(&self) -> Result<(), String> {
        if let Some((_, reason)) = unsupported(self.backend, self.precision) {
            return Err(format!("--precision {reason}"));
        }
        if self.onnx_file.is_some() && matches!(self.backend, BackendArg::Candle) {
            return Err("--onnx-file needs --backend ort (candle reads model.safetensors)".into());
        }
        Ok(())
    }

    fn whitespace(&self) -> ruri::Whitespace {
        match self.whitespace {
            WhitespaceArg::Keep => ruri::Whitespace::Keep,
            WhitespaceArg::Strip => ruri::Whitespace::Strip,
        }
    }

    /// Loads `model` (a folder, or a Hub id at `--revision`) with the chosen backend and
    /// precision; `threads` and `sessions` are ONNX Runtime's (candle ignores them). A
    /// precision the backend lacks is [`ruri::Error::InvalidOption`].
    pub fn load(
        &self,
        model: &Path,
        threads: Option<usize>,
        sessions: Option<usize>,
    ) -> ruri::Result<TextEmbedder> {
        if let Some((value, reason)) = unsupported(self.backend, self.precision) {
            return Err(ruri::Error::InvalidOption {
                name: "--precision",
                value: value.into(),
                reason,
            });
        }
        let source = Source::parse(model, self.revision.as_deref())?;
        Ok(match self.backend {
            BackendArg::Ort => {
                let precision = match self.precision {
                    Precision::Int8 => OrtPrecision::Int8,
                    Precision::Fp16 => OrtPrecision::Fp16,
                    _ => OrtPrecision::Fp32,
                };
                let mut builder = ruri::ort::builder()
                    .precision(precision)
                    .whitespace(self.whitespace());
                if let Some(file) = &self.onnx_file {
                    builder = builder.onnx_file(file);
                }
                if let Some(threads) = threads {
                    builder = builder.intra_threads(threads);
                }
                if let Some(sessions) = sessions {
                    builder = builder.sessions(sessions);
                }
                source.build_ort(builder)?
            }
            BackendArg::Candle => {
                let dtype = match self.precision {
                    Precision::Bf16 => DType::BF16,
                    Precision::Fp16 => DType::F16,
                    _ => DType::F32,
                };
                let builder = ruri::candle::builder()
                    .dtype(dtype)
                    .whitespace(self.whitespace());
                source.build_candle(builder)?
            }
        })
    }
}

/// `--model` and `--revision`: a folder, or (with the `hub` feature) a Hub model id.
#[cfg(feature = "hub")]
struct Source(ruri::hub::ModelSource);

#[cfg(feature = "hub")]
impl Source {
    fn parse(model: &Path, revision: Option<&str>) -> ruri::Result<Self> {
        ruri::hub::ModelSource::parse(model, revision).map(Source)
    }
    fn build_ort(self, builder: ruri::ort::OrtBuilder) -> ruri::Result<TextEmbedder> {
        builder.build(self.0)
    }
    fn build_candle(self, builder: ruri::candle::CandleBuilder) -> ruri::Result<TextEmbedder> {
        builder.build(self.0)
    }
}

/// `--model`: a folder only (this build has no `hub` feature).
#[cfg(not(feature = "hub"))]
struct Source(PathBuf);

#[cfg(not(feature = "hub"))]
impl Source {
    fn parse(model: &Path, revision: Option<&str>) -> ruri::Result<Self> {
        match revision {
            Some(revision) => Err(ruri::Error::InvalidOption {
                name: "--revision",
                value: revision.to_owned(),
                reason: "this build has no `hub` feature: --model takes a folder only",
            }),
            None => Ok(Source(model.to_path_buf())),
        }
    }
    fn build_ort(self, builder: ruri::ort::OrtBuilder) -> ruri::Result<TextEmbedder> {
        builder.build_from_dir(self.0)
    }
    fn build_candle(self, builder: ruri::candle::CandleBuilder) -> ruri::Result<TextEmbedder> {
        builder.build_from_dir(self.0)
    }
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

/// The `--precision` value and the reason, when the backend cannot run that precision.
fn unsupported(backend: BackendArg, precision: Precision) -> Option<(&'static str, &'static str)> {
    match (backend, precision) {
        (BackendArg::Ort, Precision::Bf16) => Some(("bf16", "bf16 needs --backend candle")),
        (BackendArg::Candle, Precision::Int8) => {
            Some(("int8", "int8 needs --backend ort (an int8 ONNX file)"))
        }
        _ => None,
    }
}
