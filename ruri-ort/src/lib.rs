//! Ruri v3 embeddings on ONNX Runtime (CPU): on ruri's own graph built from
//! `model.safetensors`, or from fp32, int8 or fp16 ONNX files.
//!
//! [`builder()`] makes a [`ruri_core::TextEmbedder`]: the shared pipeline of `ruri-core`
//! (prompts, whitespace and truncation policies, length-sorted token-budget batches, pooling,
//! normalization) around an [`OrtBackend`], a pool of ONNX Runtime sessions.
//!
//! ```
//! use ruri_ort::Precision;
//!
//! # let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tiny");
//! // `folder`: a Ruri v3 folder with ONNX files (here the repository's tiny test model).
//! let embedder = ruri_ort::builder().precision(Precision::Int8).build_from_dir(folder)?;
//! let query = embedder.embed_query("瑠璃色はどんな色？")?;
//! assert_eq!(query.len(), embedder.dim());
//! # Ok::<(), ruri_core::Error>(())
//! ```
//!
//! # Graphs
//!
//! [`OrtBuilder::graph`] chooses what ONNX Runtime runs; the default, [`Graph::Auto`], is the
//! fused graph whenever the folder has `model.safetensors` (and the precision is fp32 or
//! int8), else the folder's ONNX file.
//!
//! * [`Graph::Fused`]: ruri builds the ModernBERT graph itself, in process, from
//!   `config.json` + `model.safetensors` (ONNX Runtime's Model Editor API; no export step,
//!   no ONNX file, no Python), so the official cl-nagoya folders run as they are. 15 nodes
//!   a layer at fp32 (about 50 with per-row int8) where the TorchScript export has 150+:
//!   faster session creation and less per-operator overhead on short texts. fp32 equals
//!   sentence-transformers within 1e-5. int8 is quantized at load: weights per output
//!   channel (7-bit range, so that x86's 16-bit `vpmaddubsw` sums never saturate and every
//!   x86 CPU computes the same integers),
//!   activations per token row ([`Int8Activations::PerRow`]: a text's int8 vector does not
//!   depend on its batch neighbours), with an exact fp32 rescaling of outlier channels folded
//!   into the LayerNorm weights and the linears after them. Texts over
//!   [`OrtBuilder::long_text_tokens`] run on a second graph whose attention memory is linear
//!   in the length (local layers by blocks, global layers unmasked), so one 8,192-token text
//!   fits in a few hundred MB.
//! * [`Graph::OnnxFile`]: the folder's ONNX file for the [`Precision`], or
//!   [`OrtBuilder::onnx_file`].
//!
//! ```
//! use ruri_ort::{Graph, Precision};
//!
//! # let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tiny");
//! // No ONNX file needed: the graph is built from model.safetensors.
//! let embedder = ruri_ort::builder()
//!     .graph(Graph::Fused)
//!     .precision(Precision::Int8)
//!     .build_from_dir(folder)?;
//! let fused = embedder.backend_as::<ruri_ort::FusedBackend>().expect("the fused backend");
//! assert!(fused.is_int8());
//! # Ok::<(), ruri_core::Error>(())
//! ```
//!
//! # Model folders
//!
//! Either layout works: a sentence-transformers folder with ONNX files, or an ONNX port such as
//! sirasagi62/ruri-v3-30m-ONNX (`config.json`, `tokenizer.json`, `onnx/model.onnx`,
//! `onnx/model_quantized.onnx`). [`Precision`] finds its file under every name real ports use,
//! in a fixed order ([`Precision::candidates`]); [`OrtBuilder::onnx_file`] runs a given
//! file instead. A missing precision is [`ruri_core::Error::NoModelFile`], listing the names
//! tried and the ONNX files the folder has. The official cl-nagoya folders ship no ONNX file;
//! they run on the fused graph.
//!
//! The model must take `input_ids` and `attention_mask` (int64, `batch × seq`) and give
//! `sentence_embedding` (`batch × dim`, mean pooled) or `token_embeddings` /
//! `last_hidden_state` (`batch × seq × dim`, pooled here), as float32 or float16. Some exports
//! bake L2 normalization into `sentence_embedding` (found at load by running two short texts):
//! then `token_embeddings` is pooled instead when the file has it, and otherwise raw vectors
//! (`normalize(false)`) are refused rather than returned normalized.
//!
//! # The ONNX Runtime library
//!
//! Loaded at run time (`ort`'s `load-dynamic`; nothing is downloaded or linked at build
//! time): from [`OrtBuilder::runtime_path`], else `ORT_DYLIB_PATH`, else ruri's default folder
//! ([`default_install_dir`]: `~/.cache/ruri/onnxruntime-1.31.1/`), else the system library
//! path. A missing or too old library is [`ruri_core::Error::RuntimeUnavailable`], whose
//! message gives the steps: unpack `libonnxruntime.so.1.31.1` from the `onnxruntime` wheel on
//! PyPI into the default folder, point `ORT_DYLIB_PATH` at an installed onnxruntime Python
//! package's library, or use a system library.
//!
//! # Threads
//!
//! An embedder holds a small pool of sessions (one by default). A call takes a session for
//! each of its batches in turn, so calls from several threads run concurrently up to the pool
//! size; set
//! [`OrtBuilder::sessions`] and [`OrtBuilder::intra_threads`] so that
//! `sessions × intra_threads` matches the cores you want used.

#![deny(missing_docs)]
// This crate needs `unsafe` (ONNX Runtime is loaded from a shared library; weights are
// memory-mapped): each block says why it is sound.
#![warn(clippy::undocumented_unsafe_blocks)]

mod builder;
mod discover;
mod fused;
#[cfg(feature = "hub")]
mod hub;
mod onnx_file;
mod pool;
mod runtime;

pub use builder::{
    DEFAULT_LONG_TEXT_TOKENS, Graph, Int8Activations, OptimizationLevel, OrtBuilder, Precision,
    builder,
};
pub use fused::FusedBackend;
pub use onnx_file::OrtBackend;
pub use runtime::{ONNXRUNTIME_VERSION, default_install_dir, loaded_runtime_path};

/// Entry points for the fuzz targets in `fuzz/` (not part of the API: no stability promise).
#[doc(hidden)]
pub mod __fuzz {
    pub use crate::fused::read_checkpoint;
}
