//! Command-line flags for the model (the `clap` feature): [`ModelArgs`], what the
//! repository's examples take, turned into an [`EmbedderConfig`] by [`ModelArgs::config`].
//!
//! ```
//! use clap::Parser;
//! use ruri::{AttentionPrecision, BackendKind, EmbedderConfig, Precision};
//!
//! #[derive(Parser)]
//! struct Args {
//!     #[command(flatten)]
//!     model: ruri::cli::ModelArgs,
//! }
//!
//! let args = Args::parse_from(["prog", "--backend", "candle", "--precision", "bf16"]);
//! let wanted = EmbedderConfig::new().backend(BackendKind::Candle).precision(Precision::Bf16);
//! assert_eq!(args.model.config(), wanted);
//!
//! // The native engine's attention in bfloat16.
//! let args = Args::parse_from(["prog", "--precision", "int8", "--attention", "bf16"]);
//! let wanted = EmbedderConfig::new()
//!     .precision(Precision::Int8)
//!     .attention(AttentionPrecision::Bf16);
//! assert_eq!(args.model.config(), wanted);
//!
//! // Without flags: the loader's defaults, the best backend compiled in (native) at fp32.
//! let args = Args::parse_from(["prog"]);
//! assert_eq!(args.model.config(), EmbedderConfig::new());
//! assert_eq!(args.model.backend, BackendKind::best());
//! ```

use std::path::PathBuf;

use clap::ValueEnum;
use ruri_core::Whitespace;

use crate::{AttentionPrecision, BackendKind, EmbedderConfig, Precision};

/// `--whitespace`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WhitespaceArg {
    /// Prompt + text as given (sentence-transformers ≥ 5.4).
    Keep,
    /// Strip prompt + text as Python's str.strip() (sentence-transformers 2.x–5.3, what Ruri
    /// v3 was trained with and most existing indexes were built with).
    Strip,
}

impl From<WhitespaceArg> for Whitespace {
    fn from(arg: WhitespaceArg) -> Self {
        match arg {
            WhitespaceArg::Keep => Whitespace::Keep,
            WhitespaceArg::Strip => Whitespace::Strip,
        }
    }
}

/// The model flags: `--model`, `--revision`, `--backend`, `--precision`, `--onnx-file`,
/// `--whitespace`, `--prequantized`, `--attention`.
#[derive(Debug, Clone, clap::Args)]
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
    /// Inference backend: native (ruri's own engine; reads model.safetensors), ort (ONNX
    /// Runtime; also runs ONNX files, and an ONNX-only folder needs it) or candle. Default:
    /// the best one compiled in (native, else ort, else candle).
    #[arg(long, value_enum, default_value_t = BackendKind::best())]
    pub backend: BackendKind,
    /// Weights precision (native: fp32 or int8 with exact integer kernels; ort: of its graph
    /// built from model.safetensors, or else which ONNX file of the folder runs; candle: the
    /// dtype).
    #[arg(long, value_enum, default_value_t = Precision::Fp32)]
    pub precision: Precision,
    /// Run this ONNX file (relative to the model folder, or absolute) instead of the one
    /// --precision finds (ort only).
    #[arg(long)]
    pub onnx_file: Option<PathBuf>,
    /// Whitespace at the ends of prompt + text.
    #[arg(long, value_enum, default_value_t = WhitespaceArg::Keep)]
    pub whitespace: WhitespaceArg,
    /// Read ruri's int8 file, model.ruri-int8.safetensors (written by `ruri quantize`),
    /// instead of quantizing model.safetensors at load: the same vectors, a faster load
    /// (backend native, --precision int8).
    #[arg(long)]
    pub prequantized: bool,
    /// Attention's two products in f32, in bfloat16 with f32 sums, or in 13-bit integers with
    /// exact sums (bf16 and int13: backend native, fp32 or int8): about half the attention
    /// time on long texts, bf16 on CPUs with AVX-512 BF16, int13 on CPUs with AVX-512 VNNI;
    /// the same vectors on every CPU, a little further from sentence-transformers'. Default:
    /// int13 at native int8, else f32.
    #[arg(long, value_enum)]
    pub attention: Option<AttentionPrecision>,
}

impl ModelArgs {
    /// The configuration these flags ask for (not yet validated:
    /// [`EmbedderConfig::validate`], or any `build_*`, does that).
    pub fn config(&self) -> EmbedderConfig {
        let config = EmbedderConfig::new()
            .backend(self.backend)
            .precision(self.precision)
            .whitespace(self.whitespace.into())
            .prequantized(self.prequantized)
            .attention(self.attention);
        match &self.onnx_file {
            Some(file) => config.onnx_file(file),
            None => config,
        }
    }
}
