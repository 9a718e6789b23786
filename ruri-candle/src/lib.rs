//! Ruri v3 embeddings on [candle](https://github.com/huggingface/candle): a ModernBERT
//! encoder written for this crate, on CPU (f32, bf16, f16) and, with the `cuda` feature, on
//! NVIDIA GPUs.
//!
//! [`builder()`] makes a [`ruri_core::TextEmbedder`]: the shared pipeline of `ruri-core`
//! (prompts, whitespace and truncation policies, length-sorted token-budget batches,
//! normalization) around a [`CandleBackend`], which runs the model on one padded batch and
//! returns mean-pooled vectors. It reads `model.safetensors`, so the official cl-nagoya folders
//! (which ship no ONNX file) run as they are.
//!
//! ```
//! use ruri_candle::{DType, Device};
//!
//! # let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tiny");
//! // `folder`: a Ruri v3 sentence-transformers folder (here the repository's tiny test model).
//! let embedder = ruri_candle::builder()
//!     .device(Device::Cpu)
//!     .dtype(DType::F32)
//!     .build_from_dir(folder)?;
//! let query = embedder.embed_query("瑠璃色はどんな色？")?;
//! assert_eq!(query.len(), embedder.dim());
//! # Ok::<(), ruri_core::Error>(())
//! ```
//!
//! # The model
//!
//! The encoder follows transformers' `ModernBertModel` (the implementation the reference
//! vectors in `testdata/` come from) step by step: token embedding → LayerNorm; pre-norm
//! layers (layer 0 has no attention norm) with fused `Wqkv`, rotary embeddings on the whole
//! head (θ = `global_rope_theta` on global layers, `local_rope_theta` on local ones), a
//! sliding window `|i − j| ≤ local_attention / 2` on local layers, a GeGLU MLP with the exact
//! (erf) GELU; final LayerNorm; then mean pooling under the attention mask, done on the
//! device in f32 so only `batch × dim` floats leave it. It matches sentence-transformers to
//! ~1e-6 in f32.
//!
//! candle-transformers has a ModernBERT too; it is not used because it only finds weights
//! under a `model.` prefix (sentence-transformers checkpoints have none) and is wrong in bf16.
//! Here, whatever the weight dtype, the rotary tables and the score → mask → softmax → value
//! path run in **f32** (transformers also upcasts there), and masks use a finite minimum so
//! padding can never turn into NaN.
//!
//! Weights are memory-mapped from `model.safetensors` and converted to the chosen dtype;
//! tensors with or without the `model.` prefix are accepted, and every tensor's shape is
//! checked against `config.json` before loading ([`ruri_core::Error::InvalidConfig`]).
//!
//! # Long inputs
//!
//! Two thirds of the layers are local. From a few windows of length on, local layers use
//! **banded attention**: the sequence is cut into blocks of `local_attention / 2` tokens and
//! each block of queries attends to its own and its two neighbouring key blocks, so a local
//! layer costs O(seq · window) instead of O(seq²) (the dense band-masked path is kept for
//! short inputs, and for comparison: [`LocalAttention::Dense`]). Masks and rotary tables are
//! built once per batch on the device and shared by all layers. Global attention over very
//! long batches runs in query chunks, bounding the score matrix at 128 MiB.
//!
//! # Precision
//!
//! * [`DType::F32`] (default): equal to sentence-transformers within 1e-5 (tested).
//! * [`DType::BF16`]: weights and activations in bf16, attention core in f32; cosine ≥ 0.999
//!   to f32 sentence-transformers (tested). On CPU candle has no bf16 GEMM (it widens to f32),
//!   so bf16 saves memory, not time; it is meant for GPUs.
//! * [`DType::F16`]: as bf16 with f16 weights (tested likewise).
//!
//! # Threads
//!
//! On CPU candle runs its GEMMs and most element-wise kernels on rayon's global pool, which
//! has one thread per logical core unless `RAYON_NUM_THREADS` says otherwise (candle reads the
//! same variable). Batches of one call run one after the other, each using all threads.
//!
//! # Batching
//!
//! Unless [`CandleBuilder::batching`] says otherwise, the device advises the batch
//! limits ([`Device::advised_batching`]): the pipeline's CPU defaults on [`Device::Cpu`],
//! and on [`Device::Cuda`] a padded-token budget of [`GPU_MAX_BATCH_TOKENS`] that the text
//! count does not cap ([`gpu_batching`]). Padding never changes a vector on either device
//! (the parity tests run the same batches on CPU and GPU, with the same tolerances).
//!
//! # Features
//!
//! * `cuda`: enables [`Device::Cuda`] through candle's CUDA backend; needs `nvcc` and the
//!   CUDA headers and libraries at build time (see `tools/cuda/README.md`). Without it,
//!   [`Device::Cuda`] still exists and [`CandleBuilder::build_from_dir`] returns
//!   [`ruri_core::Error::InvalidOption`].

#![deny(missing_docs)]
// Weights are memory-mapped, which needs `unsafe`: each block says why it is sound.
#![warn(clippy::undocumented_unsafe_blocks)]

mod attention;
mod batching;
#[cfg(feature = "hub")]
mod hub;
mod model;

pub use batching::{GPU_MAX_BATCH_TOKENS, gpu_batching};

use std::path::{Path, PathBuf};

use ndarray::Array2;
use ruri_core::{
    Backend, BackendOutput, BatchOptions, Error, ModelDir, PaddedBatch, Result, TextEmbedder,
    Whitespace,
};

use model::{ModernBert, candle_error};

/// Where the model runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Device {
    /// The CPU (default).
    #[default]
    Cpu,
    /// The CUDA GPU of this ordinal; needs the `cuda` feature.
    Cuda(usize),
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
        }
    }
}

/// The dtype weights and activations are held in. The rotary tables, attention scores,
/// softmax and pooling are f32 in every case.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// 32-bit float (default): equal to sentence-transformers within 1e-5.
    #[default]
    F32,
    /// bfloat16: cosine ≥ 0.999 to f32; fast on GPUs, not on CPUs.
    BF16,
    /// IEEE half precision.
    F16,
}

impl DType {
    fn to_candle(self) -> candle_core::DType {
        match self {
            DType::F32 => candle_core::DType::F32,
            DType::BF16 => candle_core::DType::BF16,
            DType::F16 => candle_core::DType::F16,
        }
    }
}

/// How local (sliding-window) layers compute attention.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LocalAttention {
    /// Banded attention from four half-windows of length on (256 tokens for Ruri v3), dense
    /// below (default). Both give the same vectors up to float summation order.
    #[default]
    Auto,
    /// Always the dense `seq × seq` band-masked scores: quadratic cost, for comparison.
    Dense,
}

/// Starts a builder of a [`TextEmbedder`] on candle (`ruri::candle::builder()` in the facade).
pub fn builder() -> CandleBuilder {
    CandleBuilder::default()
}

/// Builds a [`TextEmbedder`] on candle. Setters never fail; everything is checked in
/// [`build_from_dir`](CandleBuilder::build_from_dir).
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct CandleBuilder {
    device: Device,
    dtype: DType,
    local_attention: LocalAttention,
    /// `None`: the device's [`Device::advised_batching`].
    batching: Option<BatchOptions>,
    whitespace: Whitespace,
}

impl CandleBuilder {
    /// Where to run (default [`Device::Cpu`]).
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// Weight and activation dtype (default [`DType::F32`]).
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// How local layers compute attention (default [`LocalAttention::Auto`]).
    pub fn local_attention(mut self, local_attention: LocalAttention) -> Self {
        self.local_attention = local_attention;
        self
    }

    /// Batch limits of the pipeline (padded-token budget, texts per batch); default: the
    /// device's [`Device::advised_batching`].
    pub fn batching(mut self, batching: BatchOptions) -> Self {
        self.batching = Some(batching);
        self
    }

    /// Whitespace policy for prompt + text (default [`Whitespace::Keep`]; [`Whitespace::Strip`]
    /// reproduces sentence-transformers 2.x–5.3). Calls may override it with
    /// [`EmbedOptions::whitespace`](ruri_core::EmbedOptions::whitespace).
    pub fn whitespace(mut self, whitespace: Whitespace) -> Self {
        self.whitespace = whitespace;
        self
    }

    /// Opens the model folder, maps `model.safetensors` and loads the weights on the device.
    pub fn build_from_dir(self, dir: impl AsRef<Path>) -> Result<TextEmbedder> {
        let dir = ModelDir::open(dir)?;
        // `None`: the backend advises (Backend::advised_batching, the device's).
        let embedder = TextEmbedder::load(&dir, self.batching, || {
            CandleBackend::load(&dir, self.device, self.dtype, self.local_attention)
        })?
        .with_whitespace(self.whitespace);
        Ok(embedder)
    }
}

/// The candle [`Backend`]: ModernBERT weights on one device, mean pooling included.
#[derive(Debug)]
pub struct CandleBackend {
    model: ModernBert,
    device: Device,
    dtype: DType,
    banded_from: usize,
    weights: PathBuf,
}

fn candle_device(device: Device) -> Result<candle_core::Device> {
    match device {
        Device::Cpu => Ok(candle_core::Device::Cpu),
        #[cfg(feature = "cuda")]
        Device::Cuda(ordinal) => candle_core::Device::new_cuda(ordinal)
            .map_err(candle_error(format!("opening CUDA device {ordinal}"))),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(Error::InvalidOption {
            name: "device",
            value: device.to_string(),
            reason: "ruri-candle was built without the `cuda` feature",
        }),
    }
}

impl CandleBackend {
    /// Loads `model.safetensors` of `dir` in `dtype` on `device`.
    pub fn load(
        dir: &ModelDir,
        device: Device,
        dtype: DType,
        local_attention: LocalAttention,
    ) -> Result<Self> {
        let config = dir.config();
        config.check_supported(&dir.path().join("config.json"))?;
        let candle = candle_device(device)?;
        let weights = dir.file("model.safetensors")?;
        let model = ModernBert::load(&weights, config, dtype.to_candle(), &candle)?;
        let banded_from = match local_attention {
            LocalAttention::Auto => model.default_banded_from(),
            LocalAttention::Dense => usize::MAX,
        };
        Ok(Self {
            model,
            device,
            dtype,
            banded_from,
            weights,
        })
    }

    /// The device the weights live on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The dtype of the weights and activations.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The safetensors file the weights came from.
    pub fn weights_file(&self) -> &Path {
        &self.weights
    }

    /// Whether the checkpoint stored its tensors under a `model.` prefix.
    pub fn weights_prefixed(&self) -> bool {
        self.model.prefixed()
    }
}

impl Backend for CandleBackend {
    fn dim(&self) -> usize {
        self.model.hidden_size()
    }

    /// The device's advice ([`Device::advised_batching`]).
    fn advised_batching(&self) -> BatchOptions {
        self.device.advised_batching()
    }

    fn forward(&self, batch: &PaddedBatch) -> Result<BackendOutput> {
        let (rows, seq) = (batch.batch_size(), batch.seq_len());
        let vocab = self.model.vocab_size();
        let ids = batch
            .input_ids()
            .iter()
            .map(|&id| {
                u32::try_from(id)
                    .ok()
                    .filter(|&id| (id as usize) < vocab)
                    .ok_or_else(|| Error::InvalidOption {
                        name: "input_ids",
                        value: id.to_string(),
                        reason: "token id outside the model's vocabulary (tokenizer and \
                                 model.safetensors disagree)",
                    })
            })
            .collect::<Result<Vec<u32>>>()?;
        let mask: Vec<u32> = batch
            .attention_mask()
            .iter()
            .map(|&m| u32::from(m != 0))
            .collect();
        if rows == 0 || seq == 0 {
            return Ok(BackendOutput::Pooled(Array2::zeros((rows, self.dim()))));
        }
        let context = || {
            format!(
                "running {} on {rows} × {seq} tokens",
                self.weights.display()
            )
        };
        let pooled = self
            .model
            .forward_pooled(ids, mask, rows, seq, self.banded_from)
            .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
            .map_err(candle_error(context()))?;
        let pooled =
            Array2::from_shape_vec((rows, self.dim()), pooled).map_err(|e| Error::ModelOutput {
                reason: format!("pooled output of unexpected size: {e}"),
            })?;
        Ok(BackendOutput::Pooled(pooled))
    }
}
