//! `ruri`: Ruri v3 Japanese text embeddings, in-process.
//!
//! Build a [`TextEmbedder`] with a backend's builder, then embed:
//!
//! ```
//! # #[cfg(feature = "ort")]
//! # fn main() -> ruri::Result<()> {
//! # let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/tiny");
//! // `folder`: a Ruri v3 model folder (here the repository's tiny random-weight test model).
//! let embedder = ruri::ort::builder().build_from_dir(folder)?;
//! let documents: Vec<String> = vec!["瑠璃は青い宝石です。".into(), "今日は晴れです。".into()];
//! let docs = embedder.embed_documents(&documents)?;
//! let query = embedder.embed_query("瑠璃色はどんな色？")?;
//! let best = ruri::top_k(&query, &docs, 1);
//! assert_eq!(best.len(), 1);
//! # Ok(()) }
//! # #[cfg(not(feature = "ort"))]
//! # fn main() {}
//! ```
//!
//! This facade re-exports [`ruri_core`] ([`TextEmbedder`], the [`Embedder`] trait, [`Error`],
//! [`ModelDir`], the pipeline's pieces) and the backends: [`ort`] (ONNX Runtime, `ruri::ort::builder()`)
//! and [`candle`] (`ruri::candle::builder()`). It also hosts the workspace's examples and
//! benchmarks; measured figures are in the repository's BENCHMARKS.md.
//!
//! # Features
//!
//! * `ort` (default): the ONNX Runtime backend, [`ruri_ort`], as [`ort`]. The ONNX Runtime
//!   library is loaded at run time (see [`ruri_ort`]'s docs for where it is looked for).
//! * `candle` (default): the candle backend on CPU, [`ruri_candle`], as [`candle`].
//! * `hub` (default): [`hub`], and the backends' `build_from_hub(id)` and `build(source)`
//!   (a folder or a model id): downloads into the Hugging Face Hub's standard cache, shared
//!   with Python's `huggingface_hub` (see [`ruri_core::hub`]).
//! * `native` (default): ruri's own pure-Rust engine, [`ruri_native`], as [`native`]: fp32,
//!   and int8 with exact integer kernels that give the same vector on every CPU.
//! * `cuda`: CUDA devices for the candle backend (needs the CUDA toolkit to build).

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub use ruri_core::*;

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
