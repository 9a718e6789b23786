//! `ruri`: Ruri v3 Japanese text embeddings, in-process.
//!
//! This facade re-exports [`ruri_core`] (the [`Embedder`] trait, errors, pipeline) and, with the
//! default `ort` feature, the ONNX Runtime backend as [`ort`]. It also hosts the workspace's
//! examples (`examples/embed.rs`) and benchmarks.
//!
//! # Features
//!
//! * `ort` (default): the ONNX Runtime backend, [`ruri_ort`], as [`ort`].
//! * `candle` (default): the candle backend on CPU, [`ruri_candle`], as [`candle`].
//! * `cuda`: CUDA devices for the candle backend (needs the CUDA toolkit to build).

#![deny(missing_docs)]

pub use ruri_core::*;

/// The ONNX Runtime backend.
#[cfg(feature = "ort")]
pub use ruri_ort as ort;

/// The candle backend.
#[cfg(feature = "candle")]
pub use ruri_candle as candle;
