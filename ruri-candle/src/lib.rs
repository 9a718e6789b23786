//! The candle backend for Ruri v3 (ModernBERT on CPU f32/bf16 and CUDA bf16).
//!
//! **Not implemented yet.** This crate exists so the workspace has its final shape; it has no
//! API, so nothing can mistake it for a working backend. Use `ruri-ort` today.

#![deny(missing_docs)]
