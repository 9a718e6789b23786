//! `ruri`: Ruri v3 Japanese text embeddings, in-process.
//!
//! Build a [`TextEmbedder`] with a backend's builder, then embed:
//!
//! ```
//! # #[cfg(feature = "native")]
//! # fn main() -> ruri::Result<()> {
//! # let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/tiny");
//! // `folder`: a Ruri v3 model folder (here the repository's tiny random-weight test model).
//! let embedder = ruri::native::builder().build_from_dir(folder)?;
//! let documents: Vec<String> = vec!["瑠璃は青い宝石です。".into(), "今日は晴れです。".into()];
//! let docs = embedder.embed_documents(&documents)?;
//! let query = embedder.embed_query("瑠璃色はどんな色？")?;
//! let best = ruri::top_k(&query, &docs, 1)?;
//! assert_eq!(best.len(), 1);
//! # Ok(()) }
//! # #[cfg(not(feature = "native"))]
//! # fn main() {}
//! ```
//!
//! Or let the facade choose: [`EmbedderConfig`] names the backend, the precision and the
//! options in one vocabulary and loads any of them ([`EmbedderConfig::build_from_dir`], or
//! `build(source)` for a folder or a Hub id), refusing a combination no backend runs with one
//! typed error; [`from_pretrained`] is the one-call form with the best backend compiled in.
//! The command lines and the Python package load through it. The default backend
//! ([`BackendKind::best`]) is the native engine: 1.7–2.9× the int8 throughput of ruri's ONNX
//! Runtime graph (1.75× on a Zen 4, 2.9× with a Xeon's AMX) and 1.1× its fp32 throughput
//! (Zen 4; BENCHMARKS.md), and no shared library, so the default path downloads no ONNX
//! Runtime.
//! ort stays for ONNX files (a model with ONNX files only is refused by the default backend
//! with an error naming backend ort) and as the comparison.
//!
//! This facade re-exports what a program that embeds uses from [`ruri_core`] at its root
//! ([`TextEmbedder`], the [`Embedder`] trait, [`Error`], [`ModelDir`], [`top_k`], …); what a
//! backend implements or calls is in [`backend`]. The backends themselves are [`native`]
//! (ruri's own engine, `ruri::native::builder()`), [`ort`] (ONNX Runtime,
//! `ruri::ort::builder()`) and [`candle`] (`ruri::candle::builder()`). It also hosts
//! the workspace's examples and benchmarks; measured figures are in the repository's
//! BENCHMARKS.md.
//!
//! # Features
//!
//! * `ort` (default): the ONNX Runtime backend, [`ruri_ort`], as [`ort`]. The ONNX Runtime
//!   library is loaded at run time (see [`ruri_ort`]'s docs for where it is looked for).
//! * `candle` (default): the candle backend on CPU, [`ruri_candle`], as [`candle`].
//! * `native` (default): ruri's own pure-Rust engine, [`ruri_native`], as [`native`]: fp32,
//!   and int8 with exact integer kernels that give the same vector on every CPU. The default
//!   backend whenever it is compiled in (else ort, else candle: [`BackendKind::best`]).
//! * `hub` (default): [`hub`], [`EmbedderConfig::build`] and `build_from_hub`, and the
//!   backends' `build_from_hub(id)` and `build(source)` (a folder or a model id): downloads
//!   into the Hugging Face Hub's standard cache, shared with Python's `huggingface_hub` (see
//!   [`ruri_core::hub`]).
//! * `clap` (default): [`cli`], the model flags for a command line, and clap's `ValueEnum`
//!   for [`BackendKind`], [`Precision`] and [`AttentionPrecision`]. On by default so that the examples build with a
//!   plain `cargo run --example`; a library that depends on `ruri` can leave it out.
//! * `cuda`: CUDA devices for the candle backend (needs the CUDA toolkit to build).
//!
//! A backend left out stays nameable: [`BackendKind::Candle`] exists in every build, and
//! loading with it returns [`Error::InvalidOption`] naming the feature to turn on.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(feature = "clap")]
pub mod cli;
mod loader;

#[cfg(feature = "native")]
pub use loader::WeightsLoader;
pub use loader::{
    AttentionPrecision, BackendKind, EmbedderConfig, Graph, Precision, from_pretrained,
};

pub use ruri_core::{
    BatchOptions, EmbedOptions, Embedder, Embeddings, Encoding, Error, ErrorChain, ModelDir,
    ModelTexts, Prompts, Quantization, QuantizationRanges, QuantizedEmbeddings, Result, Task,
    TextEmbedder, TokenSource, Tokenizer, Truncation, Whitespace, cosine, dot, error_chain,
    l2_normalize, prompts, tokenize, top_k,
};

/// For backend authors: what a backend implements ([`Backend`](backend::Backend)) and the
/// pieces of the shared pipeline it may call. A program that only embeds needs none of it.
///
/// A backend turns a [`PaddedBatch`](backend::PaddedBatch) of ids and masks into vectors
/// (pooled, or token states that [`mean_pool`](backend::mean_pool) pools); ruri-core does the
/// rest (tokenize, [`plan_batches`](backend::plan_batches), normalize, restore order), in
/// [`TextEmbedder::load`].
pub mod backend {
    pub use ruri_core::config;
    pub use ruri_core::{
        AttentionKind, Backend, BackendOutput, Layout, ModelConfig, PaddedBatch, Pooling,
        checkpoint_prefix, mean_pool, plan_batches,
    };
}

/// The ONNX Runtime backend.
#[cfg(feature = "ort")]
pub use ruri_ort as ort;

/// The candle backend.
#[cfg(feature = "candle")]
pub use ruri_candle as candle;

/// ruri's own pure-Rust engine.
#[cfg(feature = "native")]
pub use ruri_native as native;

/// Models by id from the Hugging Face Hub and its standard cache ([`ruri_core::hub`]).
#[cfg(feature = "hub")]
pub use ruri_core::hub;
