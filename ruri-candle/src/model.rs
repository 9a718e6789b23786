//! ModernBERT as transformers implements it (`models/modernbert/modeling_modernbert.py`,
//! transformers 5.24, the version that made the reference vectors), for inference only.
//!
//! Differences from candle-transformers' `modernbert.rs`, on purpose: weights are found with
//! or without the `model.` prefix (sentence-transformers checkpoints have none), and the
//! rotary tables and the score → mask → softmax path are f32 whatever the weight dtype, which
//! is what makes bf16 and f16 right.

use std::path::Path;

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{D, DType, Device, Module, Tensor};
use candle_nn::VarBuilder;
use ruri_core::{AttentionKind, Error, ModelConfig, Result};

use crate::attention::{LocalStrategy, Masks, rope_tables};

/// Wraps a candle error with what was being done.
pub(crate) fn candle_error(context: impl Into<String>) -> impl FnOnce(candle_core::Error) -> Error {
    let context = context.into();
    move |e| Error::Backend {
        backend: "candle",
        context,
        source: Box::new(e),
    }
}

/// LayerNorm without bias (`norm_bias = False` in every ModernBERT config), computed in f32
/// inside candle's fused kernel whatever the dtype, as torch does for bf16/f16 LayerNorm.
#[derive(Debug)]
struct Norm {
    weight: Tensor,
    zero_bias: Tensor,
    eps: f32,
}

impl Norm {
    fn load(vb: &VarBuilder, name: &str, hidden: usize, eps: f64) -> candle_core::Result<Self> {
        let weight = vb.get(hidden, &format!("{name}.weight"))?;
        let zero_bias = weight.zeros_like()?;
        Ok(Self {
            weight,
            zero_bias,
            eps: eps as f32,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::ops::layer_norm(&x.contiguous()?, &self.weight, &self.zero_bias, self.eps)
    }
}

/// `x · wᵀ` without bias (`attention_bias = mlp_bias = False`), as one GEMM over all tokens.
fn linear(x: &Tensor, weight: &Tensor) -> candle_core::Result<Tensor> {
    let (b, s, inner) = x.dims3()?;
    let out = weight.dim(0)?;
    x.reshape((b * s, inner))?
        .matmul(&weight.t()?)?
        .reshape((b, s, out))
}

#[derive(Debug)]
struct Layer {
    /// `None` on layer 0: transformers makes its `attn_norm` an `nn.Identity` (and the
    /// checkpoint has no weight for it), because the embedding norm just ran.
    attn_norm: Option<Norm>,
    wqkv: Tensor,
    wo: Tensor,
    mlp_norm: Norm,
    wi: Tensor,
    mlp_wo: Tensor,
    kind: AttentionKind,
}

/// Per-batch state shared by every layer: masks and rotary tables, built once on the device.
struct BatchContext {
    masks: Masks,
    rope_global: (Tensor, Tensor),
    rope_local: (Tensor, Tensor),
}

/// A loaded ModernBERT encoder with mean pooling.
#[derive(Debug)]
pub(crate) struct ModernBert {
    tok_embeddings: Tensor,
    emb_norm: Norm,
    layers: Vec<Layer>,
    final_norm: Norm,
    heads: usize,
    head_dim: usize,
    hidden: usize,
    vocab: usize,
    half_window: usize,
    global_theta: f64,
    local_theta: f64,
    dtype: DType,
    device: Device,
    prefixed: bool,
}

impl ModernBert {
    /// Maps `weights` (a safetensors file) and loads it in `dtype` on `device`, after checking
    /// every tensor against `config` (a mismatch is [`Error::InvalidConfig`], not a panic or
    /// an opaque shape error deep inside a matmul).
    pub(crate) fn load(
        weights: &Path,
        config: &ModelConfig,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let invalid = |reason: String| Error::InvalidConfig {
            path: weights.to_path_buf(),
            reason,
        };
        // SAFETY: the file is mapped read-only; like every mmap user we rely on nobody
        // truncating it while it is mapped (candle's and safetensors' documented contract).
        let header = unsafe { MmapedSafetensors::new(weights) }
            .map_err(candle_error(format!("reading {}", weights.display())))?;
        let prefix = ruri_core::checkpoint_prefix(weights, |name| header.get(name).is_ok())?;
        let prefixed = !prefix.is_empty();
        for (name, shape) in config.checkpoint_tensors() {
            let full = format!("{prefix}{name}");
            let view = header
                .get(&full)
                .map_err(|_| invalid(format!("the tensor {full} is missing")))?;
            if view.shape() != shape.as_slice() {
                return Err(invalid(format!(
                    "the tensor {full} has shape {:?} but config.json implies {shape:?}",
                    view.shape()
                )));
            }
        }
        drop(header);

        // SAFETY: as above.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[weights], dtype, device) }
            .map_err(candle_error(format!("mapping {}", weights.display())))?;
        let vb = if prefixed { vb.pp("model") } else { vb };
        Self::from_var_builder(&vb, config, dtype, device, prefixed)
            .map_err(candle_error(format!("loading {}", weights.display())))
    }

    fn from_var_builder(
        vb: &VarBuilder,
        c: &ModelConfig,
        dtype: DType,
        device: &Device,
        prefixed: bool,
    ) -> candle_core::Result<Self> {
        let (h, i, eps) = (c.hidden_size, c.intermediate_size, c.norm_eps);
        let layers = (0..c.num_hidden_layers)
            .map(|n| {
                let vb = vb.pp(format!("layers.{n}"));
                Ok(Layer {
                    attn_norm: if n == 0 {
                        None
                    } else {
                        Some(Norm::load(&vb, "attn_norm", h, eps)?)
                    },
                    wqkv: vb.get((3 * h, h), "attn.Wqkv.weight")?,
                    wo: vb.get((h, h), "attn.Wo.weight")?,
                    mlp_norm: Norm::load(&vb, "mlp_norm", h, eps)?,
                    wi: vb.get((2 * i, h), "mlp.Wi.weight")?,
                    mlp_wo: vb.get((h, i), "mlp.Wo.weight")?,
                    kind: c.layer_types[n],
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Self {
            tok_embeddings: vb.get((c.vocab_size, h), "embeddings.tok_embeddings.weight")?,
            emb_norm: Norm::load(vb, "embeddings.norm", h, eps)?,
            layers,
            final_norm: Norm::load(vb, "final_norm", h, eps)?,
            heads: c.num_attention_heads,
            head_dim: c.head_dim(),
            hidden: h,
            vocab: c.vocab_size,
            // transformers: `sliding_window = local_attention // 2`, and a sliding layer
            // lets query i see key j iff |i − j| ≤ sliding_window.
            half_window: c.local_attention / 2,
            global_theta: c.global_rope_theta,
            local_theta: c.local_rope_theta,
            dtype,
            device: device.clone(),
            prefixed,
        })
    }

    pub(crate) fn hidden_size(&self) -> usize {
        self.hidden
    }

    pub(crate) fn vocab_size(&self) -> usize {
        self.vocab
    }

    pub(crate) fn prefixed(&self) -> bool {
        self.prefixed
    }

    /// Sequence length from which local layers use banded attention: from four blocks on,
    /// the three-block windows cost less than the full `seq × seq` scores.
    pub(crate) fn default_banded_from(&self) -> usize {
        4 * self.half_window.max(1)
    }

    /// Mean-pooled (not normalized) f32 vectors, `batch × hidden`, of a right-padded batch:
    /// `ids` and `mask` are `batch × seq`, row-major.
    pub(crate) fn forward_pooled(
        &self,
        ids: Vec<u32>,
        mask: Vec<u32>,
        batch: usize,
        seq: usize,
        banded_from: usize,
    ) -> candle_core::Result<Tensor> {
        let ids = Tensor::from_vec(ids, (batch, seq), &self.device)?;
        let mask = Tensor::from_vec(mask, (batch, seq), &self.device)?;
        let strategy = LocalStrategy::choose(seq, self.half_window, banded_from);
        let context = BatchContext {
            masks: Masks::new(&mask, self.half_window, strategy)?,
            rope_global: rope_tables(seq, self.head_dim, self.global_theta, &self.device)?,
            rope_local: rope_tables(seq, self.head_dim, self.local_theta, &self.device)?,
        };

        // ModernBertEmbeddings: token embedding → LayerNorm (no position embeddings: RoPE).
        let x =
            candle_nn::Embedding::new(self.tok_embeddings.clone(), self.hidden).forward(&ids)?;
        let mut x = self.emb_norm.forward(&x)?;
        for layer in &self.layers {
            x = self.layer(layer, &x, &context)?;
        }
        let x = self.final_norm.forward(&x)?;

        // sentence-transformers' mean Pooling, in f32: sum(h · mask) / clamp(count, 1e-9).
        let mask = mask.to_dtype(DType::F32)?;
        let count = mask.sum_keepdim(1)?.clamp(1e-9f32, f32::MAX)?;
        let summed = x
            .to_dtype(DType::F32)?
            .broadcast_mul(&mask.unsqueeze(2)?)?
            .sum(1)?;
        summed.broadcast_div(&count)
    }

    /// ModernBertEncoderLayer: pre-norm residual attention, then pre-norm residual GeGLU MLP.
    fn layer(&self, layer: &Layer, x: &Tensor, cx: &BatchContext) -> candle_core::Result<Tensor> {
        let normed = match &layer.attn_norm {
            Some(norm) => norm.forward(x)?,
            None => x.clone(),
        };
        let x = (x + self.attention(layer, &normed, cx)?)?;
        let mlp = self.mlp(layer, &layer.mlp_norm.forward(&x)?)?;
        x + mlp
    }

    /// ModernBertAttention with eager attention.
    fn attention(
        &self,
        layer: &Layer,
        x: &Tensor,
        cx: &BatchContext,
    ) -> candle_core::Result<Tensor> {
        let (b, s, _) = x.dims3()?;
        let (h, d) = (self.heads, self.head_dim);
        // Wqkv output viewed as (b, s, 3, heads, head_dim), unbound on the "3" axis.
        let qkv = linear(x, &layer.wqkv)?.reshape((b, s, 3, h, d))?;
        let part = |i: usize| -> candle_core::Result<Tensor> {
            qkv.narrow(2, i, 1)?
                .squeeze(2)?
                .transpose(1, 2)?
                .to_dtype(DType::F32)?
                .contiguous()
        };
        let (cos, sin) = match layer.kind {
            AttentionKind::Global => &cx.rope_global,
            AttentionKind::Local => &cx.rope_local,
        };
        // apply_rotary_pos_emb: q·cos + rotate_half(q)·sin on the whole head, in f32.
        // candle's `rope` is exactly the rotate_half (non-interleaved) convention.
        let q = candle_nn::rotary_emb::rope(&part(0)?, cos, sin)?;
        let k = candle_nn::rotary_emb::rope(&part(1)?, cos, sin)?;
        let v = part(2)?;
        // scaling = head_dim^-0.5 (a power of two for head_dim 16, 64: folding it into q
        // changes no bit of the scores).
        let q = (q * (d as f64).powf(-0.5))?;
        let out = match layer.kind {
            AttentionKind::Global => cx.masks.global(&q, &k, &v)?,
            AttentionKind::Local => cx.masks.local(&q, &k, &v)?,
        };
        // Softmax output goes back to the model dtype before Wo, as
        // `softmax(..., dtype=float32).to(query.dtype)` does upstream.
        let out = out
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, s, h * d))?
            .to_dtype(self.dtype)?;
        linear(&out, &layer.wo)
    }

    /// ModernBertMLP: `Wi` → chunk into (input, gate) → GELU(input) · gate → `Wo`.
    /// `hidden_activation = "gelu"` is the exact erf GELU in transformers' ACT2FN.
    fn mlp(&self, layer: &Layer, x: &Tensor) -> candle_core::Result<Tensor> {
        let wi = linear(x, &layer.wi)?;
        let half = wi.dim(D::Minus1)? / 2;
        let input = wi.narrow(D::Minus1, 0, half)?;
        let gate = wi.narrow(D::Minus1, half, half)?;
        let act = (input.gelu_erf()? * gate)?;
        linear(&act, &layer.mlp_wo)
    }
}
