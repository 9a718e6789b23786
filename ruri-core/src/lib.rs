//! Japanese text embeddings with the Ruri v3 models, in-process.
//!
//! `ruri-core` holds what every backend shares:
//!
//! * the [`Embedder`] trait: `Send + Sync`, `&self`, texts in, vectors out in input order;
//! * one error enum, [`Error`], with structured variants;
//! * [`ModelDir`]: a model folder in either layout (sentence-transformers, or an ONNX port),
//!   with `config.json` in either the transformers 4 or 5 spelling;
//! * the one pipeline, [`TextEmbedder`]: tokenize (with the Ruri prompt) → sort by length →
//!   pack batches under a padded-token budget → [`Backend`] → mean pooling under the mask →
//!   L2 normalization → input order.
//!
//! A backend crate (`ruri-ort`, `ruri-candle`) only implements [`Backend`]: a padded batch of
//! ids in, vectors out.
//!
//! # Example
//!
//! Code that embeds can depend on the [`Embedder`] trait, and a test can hand it a stand-in
//! whose answers are built with [`Embeddings::from_parts`]; in production it gets a
//! [`TextEmbedder`] from `ruri::ort::builder()` or `ruri::candle::builder()`.
//!
//! ```
//! use ruri_core::{EmbedOptions, Embedder, Embeddings, top_k};
//!
//! fn best_document(embedder: &dyn Embedder, query: &str, docs: &[&str]) -> ruri_core::Result<usize> {
//!     let docs = embedder.embed_documents(docs)?;
//!     let query = embedder.embed_query(query)?;
//!     Ok(top_k(&query, &docs, 1)?[0].0)
//! }
//!
//! /// A stand-in: a text's vector says whether it mentions 青.
//! struct Blue;
//! impl Embedder for Blue {
//!     fn dim(&self) -> usize {
//!         2
//!     }
//!     fn embed_with(&self, texts: &[&str], _: &EmbedOptions) -> ruri_core::Result<Embeddings> {
//!         let data = texts
//!             .iter()
//!             .flat_map(|t| if t.contains('青') { [1.0, 0.0] } else { [0.0, 1.0] })
//!             .collect();
//!         Embeddings::from_parts(data, 2, vec![3; texts.len()], vec![false; texts.len()])
//!     }
//! }
//!
//! let docs = ["今日は晴れです。", "瑠璃は青い宝石です。"];
//! assert_eq!(best_document(&Blue, "青い石", &docs)?, 1);
//! # Ok::<(), ruri_core::Error>(())
//! ```
//!
//! # Choices
//!
//! * Vectors are **L2-normalized by default** (Ruri is used with cosine similarity); ask for
//!   raw mean-pooled vectors, which is sentence-transformers' default, with
//!   [`EmbedOptions::normalize`]`(false)`.
//! * **Truncation is a visible policy**: over-long texts are truncated like
//!   sentence-transformers does (keeping `</s>`) and flagged in [`Embeddings::truncated`], or
//!   refused with [`Error::InputTooLong`] under [`Truncation::Error`].
//! * **Whitespace is a visible policy** too: by default prompt + text reach the tokenizer as
//!   given ([`Whitespace::Keep`], as sentence-transformers ≥ 5.4, the current reference, and
//!   text-embeddings-inference: nothing the caller passed is changed); [`Whitespace::Strip`]
//!   strips them exactly as Python's `str.strip()`, as sentence-transformers 2.x–5.3 did —
//!   the versions Ruri v3 was trained and evaluated with and most existing indexes were built
//!   with. Set it per embedder (the backends' builders) or per call
//!   ([`EmbedOptions::whitespace`]).
//! * Batches are formed by **length**, not by arrival, and limited by padded tokens, so short
//!   texts are not padded to the length of long ones.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod config;
mod embedder;
mod error;
#[cfg(feature = "hub")]
pub mod hub;
mod model_dir;
mod pipeline;
pub mod quantize;
pub mod safetensors;
mod similarity;
mod text_embedder;

pub use config::{AttentionKind, ModelConfig, Pooling, checkpoint_prefix};
pub use embedder::{EmbedOptions, Embedder, Embeddings, Task};
pub use error::{Error, ErrorChain, Result, TokenSource, error_chain};
pub use model_dir::{Layout, ModelDir, ModelTexts, Prompts, prompts};
pub use pipeline::{Backend, BackendOutput, BatchOptions, l2_normalize, mean_pool, plan_batches};
pub use quantize::{Quantization, QuantizationRanges, QuantizedEmbeddings};
pub use similarity::{cosine, dot, top_k};
pub use text_embedder::TextEmbedder;

pub use ruri_tokenize::{
    self as tokenize, Encoding, PaddedBatch, Tokenizer, Truncation, Whitespace,
};
