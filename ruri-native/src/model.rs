//! ModernBERT's encoder on packed tokens: the texts of a batch are laid end to end (no
//! padding reaches a linear layer), attention runs text by text, and mean pooling happens
//! as the final norm is applied. Each step names the transformers behaviour it matches.

use std::ops::Range;
use std::sync::Arc;

use ruri_core::config::AttentionKind;
use ruri_core::{Error, ModelConfig, Result};

use crate::attention::{Arithmetic, AttentionScratch, Head, attend_head};
use crate::helper::Helper;
use crate::kernels::Kernel;
use crate::kernels::aligned::Aligned;
use crate::kernels::simd_f32;
use crate::linear::{
    Linear, LinearParts, LinearScratch, MlpScratch, PARALLEL_MIN_ROWS, detect_outliers,
    detect_writers, geglu_mlp, quantize_row,
};
use crate::weights::Safetensors;
use crate::{AttentionPrecision, EmbeddingTable, Precision};

/// Rotary tables are kept for positions below this; longer texts compute theirs per call.
const ROPE_CACHED: usize = 1024;

#[derive(Debug)]
struct Layer {
    /// Layer 0 has none (transformers' `nn.Identity`).
    attn_norm: Option<Vec<f32>>,
    wqkv: Linear,
    wo: Linear,
    mlp_norm: Vec<f32>,
    wi: Linear,
    mlp_wo: Linear,
    kind: AttentionKind,
}

/// `cos` and `sin` of `position · inv_freq[j]` for one θ, `positions × head_dim / 2`.
#[derive(Debug)]
struct Rope {
    inv_freq: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    fn new(theta: f64, head_dim: usize, cached: usize) -> Self {
        let half = head_dim / 2;
        // transformers' default rope: inv_freq = 1 / θ^(2i / d) (here in f64, then f32, as
        // ruri-candle does: equal to torch's f32 table within its rounding), angles
        // position · inv_freq in f32 as torch's f32 matmul does.
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| (1.0 / theta.powf((2 * i) as f64 / head_dim as f64)) as f32)
            .collect();
        let mut rope = Self {
            inv_freq,
            cos: Vec::with_capacity(cached * half),
            sin: Vec::with_capacity(cached * half),
        };
        for p in 0..cached {
            for j in 0..half {
                let (s, c) = rope.angle(p, j);
                rope.cos.push(c);
                rope.sin.push(s);
            }
        }
        rope
    }

    /// sin and cos of one angle, from libm (pure Rust: the same bits everywhere).
    fn angle(&self, position: usize, j: usize) -> (f32, f32) {
        let a = (position as f32 * self.inv_freq[j]) as f64;
        (libm::sin(a) as f32, libm::cos(a) as f32)
    }

    /// Rotates the first `heads` head vectors of `row` (each `d` long) in place at
    /// `position` (`x·cos + rotate_half(x)·sin`, the whole head). Past the cached positions
    /// the angles come from `past`, computed there the first time a call needs them (the
    /// same values: [`Rope::angle`]), so that a long text's layers compute them once.
    #[cfg(test)]
    fn apply_heads(
        &self,
        row: &mut [f32],
        heads: usize,
        d: usize,
        position: usize,
        past: &mut RopePast,
    ) {
        self.extend(past, d, position + 1, None);
        self.rotate(row, heads, d, position, past);
    }

    /// Makes `past` hold the angles of every position below `end` past the cached ones; many
    /// at once (a long text's) on `pool`'s workers, the same values.
    fn extend(&self, past: &mut RopePast, d: usize, end: usize, pool: Option<&rayon::ThreadPool>) {
        let half = d / 2;
        if half == 0 {
            return;
        }
        let first = self.cos.len() / half + past.cos.len() / half;
        if end <= first {
            return;
        }
        let from = past.cos.len();
        past.sin.resize(from + (end - first) * half, 0.0);
        past.cos.resize(from + (end - first) * half, 0.0);
        let fill = |p0: usize, sin: &mut [f32], cos: &mut [f32]| {
            for (i, (sin, cos)) in sin
                .chunks_exact_mut(half)
                .zip(cos.chunks_exact_mut(half))
                .enumerate()
            {
                for (j, (s, c)) in sin.iter_mut().zip(cos).enumerate() {
                    (*s, *c) = self.angle(p0 + i, j);
                }
            }
        };
        let (sin, cos) = (&mut past.sin[from..], &mut past.cos[from..]);
        match pool {
            Some(pool) if end - first >= ROTATE_SPLIT_MIN_TOKENS => {
                let per = (end - first).div_ceil(pool.current_num_threads()) * half;
                let fill = &fill;
                pool.scope(|scope| {
                    for (i, (sin, cos)) in sin.chunks_mut(per).zip(cos.chunks_mut(per)).enumerate()
                    {
                        scope.spawn(move |_| fill(first + i * per / half, sin, cos));
                    }
                });
            }
            _ => fill(first, sin, cos),
        }
    }

    /// Rotates the first `heads` head vectors of `row` (each `d` long) in place at
    /// `position` (`x·cos + rotate_half(x)·sin`, the whole head), the angles past the cached
    /// positions from `past`, already [extended](Self::extend) to `position`.
    fn rotate(&self, row: &mut [f32], heads: usize, d: usize, position: usize, past: &RopePast) {
        let half = d / 2;
        let (sin, cos): (&[f32], &[f32]) = if position * half + half <= self.cos.len() {
            let at = position * half..position * half + half;
            (&self.sin[at.clone()], &self.cos[at])
        } else {
            let i = position - self.cos.len() / half.max(1);
            let at = i * half..(i + 1) * half;
            (&past.sin[at.clone()], &past.cos[at])
        };
        simd_f32::rotate_heads(&mut row[..heads * d], d, sin, cos);
    }
}

/// The angles of a [`Rope`] past its cached positions, as far as one call has needed them:
/// position `cached + i` at `i · head_dim / 2`. Kept in the call's [`Scratch`] (about 2 MB
/// for an 8,192-token text with heads of 64).
#[derive(Debug, Default)]
struct RopePast {
    sin: Vec<f32>,
    cos: Vec<f32>,
}

/// Reorders the rows of `w` (`rows × k`) that are units of the MLP: Wi's `2·units` rows
/// are the input half and the gate half, each in `units` order.
fn permute_rows(w: &mut [f32], k: usize, units: &[usize]) {
    let u = units.len();
    let old = w.to_vec();
    for half in 0..2 {
        for (new, &from) in units.iter().enumerate() {
            let (dst, src) = ((half * u + new) * k, (half * u + from) * k);
            w[dst..dst + k].copy_from_slice(&old[src..src + k]);
        }
    }
}

/// Reorders the columns of `w` (`n × k`, k = `units.len()`) in `units` order.
fn permute_columns(w: &mut [f32], k: usize, units: &[usize]) {
    let mut row = vec![0.0f32; k];
    for r in w.chunks_exact_mut(k) {
        for (x, &from) in row.iter_mut().zip(units) {
            *x = r[from];
        }
        r.copy_from_slice(&row);
    }
}

/// The token-embedding table's tensor.
pub(crate) const EMBEDDINGS: &str = "embeddings.tok_embeddings.weight";

/// How the prepared weights are made (from the builder).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoadOptions {
    pub(crate) precision: Precision,
    pub(crate) kernel: Kernel,
    pub(crate) outliers: bool,
    pub(crate) table: EmbeddingTable,
    /// Not recorded in ruri's int8 file: it changes no weight.
    pub(crate) attention: AttentionPrecision,
}

/// The token-embedding table as the model holds it.
#[derive(Debug)]
enum Table {
    /// Not held: read a row per token from the file when a call needs it (102,400 × 256
    /// f32 would be 105 MB, and a cache of the rows a workload touches grows to tens of
    /// MB); the operating system's page cache keeps the file's hot pages, outside this
    /// process's memory.
    Source(Safetensors),
    /// Held in f32 (a streamed file leaves nothing to read rows from).
    F32(Vec<f32>),
    /// [`EmbeddingTable::Int8`]: row `r` is `q[r·h..(r+1)·h] · scales[r]`.
    Int8 { q: Vec<i8>, scales: Vec<f32> },
}

/// A linear layer as the [`Assembler`] holds it: packed for the kernel, or (for the writer
/// of ruri's int8 file) its int8 weights before packing.
#[derive(Debug)]
enum Prepared {
    Packed(Linear),
    Parts(LinearParts),
}

/// One layer's tensors as they are prepared, in any order.
#[derive(Debug, Default)]
struct LayerParts {
    attn_norm: Option<Vec<f32>>,
    wqkv: Option<Prepared>,
    wo: Option<Prepared>,
    mlp_norm: Option<Vec<f32>>,
    wi: Option<Prepared>,
    /// `mlp.Wi` received before `mlp.Wo` gave the order of its units: held until then.
    wi_raw: Option<Vec<f32>>,
    /// The order of the MLP's units, once `mlp.Wo` was seen (`Some(None)`: unchanged).
    units: Option<Option<Vec<usize>>>,
    mlp_wo: Option<Prepared>,
}

/// The int8 weights of a whole model before packing, in the checkpoint's terms: what ruri's
/// int8 file stores (`crate::prequant`).
#[derive(Debug)]
pub(crate) struct Quantized {
    pub(crate) emb_norm: Vec<f32>,
    pub(crate) final_norm: Vec<f32>,
    pub(crate) layers: Vec<QuantizedLayer>,
    /// [`EmbeddingTable::Int8`]'s rows and scales (empty for [`EmbeddingTable::F32`]).
    pub(crate) table_q: Vec<i8>,
    pub(crate) table_scales: Vec<f32>,
}

/// One layer of [`Quantized`].
#[derive(Debug)]
pub(crate) struct QuantizedLayer {
    /// Layer 0 has none.
    pub(crate) attn_norm: Option<Vec<f32>>,
    pub(crate) mlp_norm: Vec<f32>,
    pub(crate) wqkv: LinearParts,
    pub(crate) wo: LinearParts,
    pub(crate) wi: LinearParts,
    pub(crate) mlp_wo: LinearParts,
}

/// Prepares the model's tensors one at a time, in whatever order they come (the order of
/// `Model::load`'s reads, or a streamed file's), dropping each fp32 tensor once prepared.
#[derive(Debug)]
pub(crate) struct Assembler {
    config: ModelConfig,
    options: LoadOptions,
    /// Keep the int8 weights unpacked ([`Assembler::finish_parts`]) instead of packing them.
    keep_parts: bool,
    /// One int8 buffer for every layer's weights while they are prepared.
    q: Vec<i8>,
    emb_norm: Option<Vec<f32>>,
    final_norm: Option<Vec<f32>>,
    layers: Vec<LayerParts>,
    /// The table's rows received so far (f32, or int8 and scales).
    table_f32: Vec<f32>,
    table_q: Vec<i8>,
    table_scales: Vec<f32>,
}

impl Assembler {
    pub(crate) fn new(config: &ModelConfig, options: LoadOptions) -> Self {
        Self {
            config: config.clone(),
            options,
            keep_parts: false,
            q: Vec::new(),
            emb_norm: None,
            final_norm: None,
            layers: (0..config.num_hidden_layers)
                .map(|_| LayerParts::default())
                .collect(),
            table_f32: Vec::new(),
            table_q: Vec::new(),
            table_scales: Vec::new(),
        }
    }

    /// An assembler whose int8 layers stay unpacked, for [`Assembler::finish_parts`].
    pub(crate) fn keeping_parts(mut self) -> Self {
        self.keep_parts = true;
        self
    }

    fn invalid(reason: String) -> Error {
        Error::InvalidConfig {
            path: "model.safetensors".into(),
            reason,
        }
    }

    /// One whole tensor of [`ModelConfig::checkpoint_tensors`] but the embedding table (name
    /// without the checkpoint's prefix, shape checked), in `w` (left in any state).
    pub(crate) fn tensor(&mut self, name: &str, w: &mut Vec<f32>) -> Result<()> {
        match name {
            "embeddings.norm.weight" => self.emb_norm = Some(w.clone()),
            "final_norm.weight" => self.final_norm = Some(w.clone()),
            _ => {
                let (n, rest) = name
                    .strip_prefix("layers.")
                    .and_then(|r| r.split_once('.'))
                    .and_then(|(n, rest)| Some((n.parse::<usize>().ok()?, rest)))
                    .filter(|&(n, _)| n < self.layers.len())
                    .ok_or_else(|| Self::invalid(format!("unexpected tensor {name}")))?;
                self.layer_tensor(n, rest, w)?;
            }
        }
        Ok(())
    }

    fn layer_tensor(&mut self, n: usize, rest: &str, w: &mut Vec<f32>) -> Result<()> {
        let (h, i) = (self.config.hidden_size, self.config.intermediate_size);
        let LoadOptions {
            precision,
            outliers,
            ..
        } = self.options;
        match rest {
            "attn_norm.weight" => self.layers[n].attn_norm = Some(w.clone()),
            "mlp_norm.weight" => self.layers[n].mlp_norm = Some(w.clone()),
            // The norm-fed layers may read a massive-activation channel; the others read
            // attention outputs and GeGLU products.
            "attn.Wqkv.weight" => self.layers[n].wqkv = Some(self.linear(w, 3 * h, h, true, None)),
            "attn.Wo.weight" => self.layers[n].wo = Some(self.linear(w, h, h, false, None)),
            "mlp.Wo.weight" => {
                // The MLP's writer units (see `detect_writers`) moved after the others, so
                // that both groups of Wo's input are contiguous and read in place: the same
                // sums (integer, and each group's max), in another order of units.
                let units = if precision == Precision::Int8 && outliers {
                    let writers = detect_writers(w, h, i);
                    (!writers.is_empty()).then(|| {
                        let mut is_writer = vec![false; i];
                        writers.iter().for_each(|&u| is_writer[u] = true);
                        let mut order: Vec<usize> = (0..i).filter(|&u| !is_writer[u]).collect();
                        order.extend(writers);
                        order
                    })
                } else {
                    None
                };
                let wo = self.linear(w, h, i, false, units.as_deref());
                self.layers[n].mlp_wo = Some(wo);
                if let Some(mut raw) = self.layers[n].wi_raw.take() {
                    self.layers[n].wi = Some(self.wi(&mut raw, i, h, units.as_deref()));
                }
                self.layers[n].units = Some(units);
            }
            "mlp.Wi.weight" => match self.layers[n].units.take() {
                Some(units) => {
                    self.layers[n].wi = Some(self.wi(w, i, h, units.as_deref()));
                    self.layers[n].units = Some(units);
                }
                None => self.layers[n].wi_raw = Some(std::mem::take(w)),
            },
            _ => {
                return Err(Self::invalid(format!(
                    "unexpected tensor layers.{n}.{rest}"
                )));
            }
        }
        Ok(())
    }

    /// The MLP's Wi (`2i × h`): at fp32 a gated layer, whose GEMM applies the GeGLU
    /// ([`Linear::fp32_gated`]); else [`Assembler::linear`]'s layer (at int8 the GeGLU reads
    /// its rows as they are dequantized).
    fn wi(&mut self, w: &mut [f32], i: usize, h: usize, units: Option<&[usize]>) -> Prepared {
        match (self.options.precision, units) {
            (Precision::Fp32, None) => Prepared::Packed(Linear::fp32_gated(w, i, h)),
            _ => self.linear(w, 2 * i, h, true, units),
        }
    }

    /// `n × k` weights `w` prepared as `Linear`. `reads_norm`: a layer fed by a LayerNorm
    /// (outlier input channels in f32); else a layer whose writer columns, if any, get an
    /// int8 product of their own. `units`: for the MLP, the order of its intermediate
    /// units, applied to Wi's rows (both halves) and to Wo's columns.
    fn linear(
        &mut self,
        w: &mut [f32],
        n: usize,
        k: usize,
        reads_norm: bool,
        units: Option<&[usize]>,
    ) -> Prepared {
        let LoadOptions {
            precision,
            kernel,
            outliers,
            ..
        } = self.options;
        let q = &mut self.q;
        if let Some(units) = units {
            if reads_norm {
                permute_rows(w, k, units);
            } else {
                permute_columns(w, k, units);
            }
        }
        let parts = match precision {
            Precision::Fp32 => return Prepared::Packed(Linear::fp32(w, n, k)),
            Precision::Int8 if outliers && !reads_norm => {
                let writers = detect_writers(w, n, k);
                if writers.is_empty() {
                    Linear::quantize_int8(w, n, k, Vec::new(), q)
                } else {
                    Linear::quantize_split(w, n, k, writers, q)
                }
            }
            Precision::Int8 => {
                let found = if outliers && reads_norm {
                    detect_outliers(w, n, k)
                } else {
                    Vec::new()
                };
                Linear::quantize_int8(w, n, k, found, q)
            }
        };
        if self.keep_parts {
            Prepared::Parts(parts)
        } else {
            Prepared::Packed(
                Linear::from_parts(kernel, parts, q).expect("quantization makes consistent parts"),
            )
        }
    }

    /// One linear layer's int8 weights as ruri's int8 file stores them (`name`: the
    /// checkpoint's, without `.weight`, e.g. `layers.0.attn.Wqkv`; shapes checked by the
    /// caller), packed for the kernel.
    pub(crate) fn quantized(&mut self, name: &str, parts: LinearParts) -> Result<()> {
        let (n, rest) = name
            .strip_prefix("layers.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(n, rest)| Some((n.parse::<usize>().ok()?, rest)))
            .filter(|&(n, _)| n < self.layers.len())
            .ok_or_else(|| Self::invalid(format!("unexpected linear layer {name}")))?;
        let linear = Linear::from_parts(self.options.kernel, parts, &mut self.q)
            .map_err(|reason| Self::invalid(format!("the int8 weights of {name}: {reason}")))?;
        let layer = &mut self.layers[n];
        let slot = match rest {
            "attn.Wqkv" => &mut layer.wqkv,
            "attn.Wo" => &mut layer.wo,
            "mlp.Wi" => &mut layer.wi,
            "mlp.Wo" => &mut layer.mlp_wo,
            _ => return Err(Self::invalid(format!("unexpected linear layer {name}"))),
        };
        *slot = Some(Prepared::Packed(linear));
        Ok(())
    }

    /// The next whole rows of [`EmbeddingTable::Int8`]'s table, already quantized (ruri's
    /// int8 file); their scales come through [`embedding_scales`](Self::embedding_scales).
    pub(crate) fn embedding_rows_int8(&mut self, rows: &[i8]) -> Result<()> {
        let cells = self
            .config
            .vocab_size
            .saturating_mul(self.config.hidden_size);
        if self.table_q.is_empty() {
            self.table_q.try_reserve_exact(cells).map_err(|_| {
                Self::invalid(format!("the tensor {EMBEDDINGS} does not fit in memory"))
            })?;
        }
        self.table_q.extend_from_slice(rows);
        Ok(())
    }

    /// [`EmbeddingTable::Int8`]'s scales, one a row (ruri's int8 file).
    pub(crate) fn embedding_scales(&mut self, scales: Vec<f32>) {
        self.table_scales = scales;
    }

    /// Takes the layer tensors `other` prepared (of other layers than this one's).
    pub(crate) fn absorb(&mut self, other: Assembler) {
        for (mine, theirs) in self.layers.iter_mut().zip(other.layers) {
            let LayerParts {
                attn_norm,
                wqkv,
                wo,
                mlp_norm,
                wi,
                wi_raw,
                units,
                mlp_wo,
            } = theirs;
            mine.attn_norm = mine.attn_norm.take().or(attn_norm);
            mine.wqkv = mine.wqkv.take().or(wqkv);
            mine.wo = mine.wo.take().or(wo);
            mine.mlp_norm = mine.mlp_norm.take().or(mlp_norm);
            mine.wi = mine.wi.take().or(wi);
            mine.wi_raw = mine.wi_raw.take().or(wi_raw);
            mine.units = mine.units.take().or(units);
            mine.mlp_wo = mine.mlp_wo.take().or(mlp_wo);
        }
    }

    /// The next whole rows of the token-embedding table, in order.
    pub(crate) fn embedding_rows(&mut self, rows: &[f32]) -> Result<()> {
        let (h, vocab) = (self.config.hidden_size, self.config.vocab_size);
        // The whole table's size at once (no copy as it grows), fallibly: a streamed
        // header may claim more than the memory there is.
        let too_large = || {
            Self::invalid(format!(
                "the tensor {EMBEDDINGS} ({vocab} × {h}) does not fit in memory"
            ))
        };
        let cells = vocab.checked_mul(h).ok_or_else(too_large)?;
        match self.options.table {
            EmbeddingTable::F32 => {
                if self.table_f32.is_empty() {
                    self.table_f32
                        .try_reserve_exact(cells)
                        .map_err(|_| too_large())?;
                }
                self.table_f32.extend_from_slice(rows);
            }
            EmbeddingTable::Int8 => {
                if self.table_q.is_empty() {
                    self.table_q
                        .try_reserve_exact(cells)
                        .map_err(|_| too_large())?;
                    self.table_scales
                        .try_reserve_exact(vocab)
                        .map_err(|_| too_large())?;
                }
                for row in rows.chunks_exact(h) {
                    let at = self.table_q.len();
                    self.table_q.resize(at + h, 0);
                    let (s, _) = quantize_row(row, &mut self.table_q[at..]);
                    self.table_scales.push(s);
                }
            }
        }
        Ok(())
    }

    /// The model, once every tensor was received; `source`: the file to read embedding
    /// rows from (else the table received through [`embedding_rows`](Self::embedding_rows)).
    pub(crate) fn finish(self, source: Option<Safetensors>) -> Result<Model> {
        let missing = |what: String| Self::invalid(format!("the tensor {what} was not received"));
        let (vocab, h) = (self.config.vocab_size, self.config.hidden_size);
        let table = match (source, self.options.table) {
            (Some(weights), EmbeddingTable::F32) => Table::Source(weights),
            (_, EmbeddingTable::F32) if self.table_f32.len() == vocab * h => {
                Table::F32(self.table_f32)
            }
            (_, EmbeddingTable::Int8) if self.table_scales.len() == vocab => Table::Int8 {
                q: self.table_q,
                scales: self.table_scales,
            },
            _ => return Err(missing(EMBEDDINGS.into())),
        };
        if let Table::Int8 { q, .. } = &table {
            // Rows and scales may come apart (ruri's int8 file): both whole.
            if q.len() != vocab * h {
                return Err(missing(EMBEDDINGS.into()));
            }
        }
        let packed = |p: Option<Prepared>, what: String| match p {
            Some(Prepared::Packed(linear)) => Ok(linear),
            // Only an assembler `keeping_parts` holds parts, and it ends in `finish_parts`.
            Some(Prepared::Parts(_)) | None => Err(missing(what)),
        };
        let mut layers = Vec::with_capacity(self.layers.len());
        for (n, (parts, &kind)) in self
            .layers
            .into_iter()
            .zip(&self.config.layer_types)
            .enumerate()
        {
            let p = |t: &str| format!("layers.{n}.{t}");
            layers.push(Layer {
                // Layer 0 has none (transformers' `nn.Identity`).
                attn_norm: match (n, parts.attn_norm) {
                    (0, _) => None,
                    (_, Some(w)) => Some(w),
                    (_, None) => return Err(missing(p("attn_norm.weight"))),
                },
                wqkv: packed(parts.wqkv, p("attn.Wqkv.weight"))?,
                wo: packed(parts.wo, p("attn.Wo.weight"))?,
                mlp_norm: parts
                    .mlp_norm
                    .ok_or_else(|| missing(p("mlp_norm.weight")))?,
                wi: packed(parts.wi, p("mlp.Wi.weight"))?,
                mlp_wo: packed(parts.mlp_wo, p("mlp.Wo.weight"))?,
                kind,
            });
        }
        let config = &self.config;
        let head_dim = config.head_dim();
        let cached = config.max_position_embeddings.min(ROPE_CACHED);
        let LoadOptions {
            precision,
            kernel,
            attention,
            ..
        } = self.options;
        Ok(Model {
            emb_norm: self
                .emb_norm
                .ok_or_else(|| missing("embeddings.norm.weight".into()))?,
            final_norm: self
                .final_norm
                .ok_or_else(|| missing("final_norm.weight".into()))?,
            layers,
            rope_global: Rope::new(config.global_rope_theta, head_dim, cached),
            rope_local: Rope::new(config.local_rope_theta, head_dim, cached),
            eps: config.norm_eps as f32,
            kernel: (precision == Precision::Int8).then_some(kernel),
            kernel_choice: kernel,
            attention,
            config: self.config,
            table,
        })
    }
}

impl Assembler {
    /// The int8 weights unpacked (an assembler [`keeping_parts`](Self::keeping_parts), every
    /// tensor received, the table too when it is [`EmbeddingTable::Int8`]).
    pub(crate) fn finish_parts(self) -> Result<Quantized> {
        let missing = |what: String| Self::invalid(format!("the tensor {what} was not received"));
        let parts = |p: Option<Prepared>, what: String| match p {
            Some(Prepared::Parts(parts)) => Ok(parts),
            Some(Prepared::Packed(_)) | None => Err(missing(what)),
        };
        let (vocab, h) = (self.config.vocab_size, self.config.hidden_size);
        if self.options.table == EmbeddingTable::Int8
            && (self.table_scales.len() != vocab || self.table_q.len() != vocab * h)
        {
            return Err(missing(EMBEDDINGS.into()));
        }
        let mut layers = Vec::with_capacity(self.layers.len());
        for (n, l) in self.layers.into_iter().enumerate() {
            let p = |t: &str| format!("layers.{n}.{t}");
            layers.push(QuantizedLayer {
                attn_norm: match (n, l.attn_norm) {
                    (0, _) => None,
                    (_, Some(w)) => Some(w),
                    (_, None) => return Err(missing(p("attn_norm.weight"))),
                },
                mlp_norm: l.mlp_norm.ok_or_else(|| missing(p("mlp_norm.weight")))?,
                wqkv: parts(l.wqkv, p("attn.Wqkv.weight"))?,
                wo: parts(l.wo, p("attn.Wo.weight"))?,
                wi: parts(l.wi, p("mlp.Wi.weight"))?,
                mlp_wo: parts(l.mlp_wo, p("mlp.Wo.weight"))?,
            });
        }
        Ok(Quantized {
            emb_norm: self
                .emb_norm
                .ok_or_else(|| missing("embeddings.norm.weight".into()))?,
            final_norm: self
                .final_norm
                .ok_or_else(|| missing("final_norm.weight".into()))?,
            layers,
            table_q: self.table_q,
            table_scales: self.table_scales,
        })
    }
}

/// The whole encoder.
#[derive(Debug)]
pub(crate) struct Model {
    config: ModelConfig,
    table: Table,
    emb_norm: Vec<f32>,
    final_norm: Vec<f32>,
    layers: Vec<Layer>,
    rope_global: Rope,
    rope_local: Rope,
    eps: f32,
    kernel: Option<Kernel>,
    /// The kernel chosen, at either precision ([`Self::arithmetic`] reads it).
    kernel_choice: Kernel,
    attention: AttentionPrecision,
}

/// Tokens of the texts of one call, laid end to end.
pub(crate) struct Packed<'a> {
    pub(crate) ids: &'a [u32],
    /// Each token's position in its text (its column in the padded batch).
    pub(crate) positions: &'a [u32],
    /// Text `t` is tokens `offsets[t]..offsets[t + 1]`.
    pub(crate) offsets: &'a [usize],
}

impl Packed<'_> {
    fn text(&self, t: usize) -> Range<usize> {
        self.offsets[t]..self.offsets[t + 1]
    }

    fn texts(&self) -> usize {
        self.offsets.len() - 1
    }
}

impl Model {
    /// Reads and prepares every weight of `weights` (checked against `config`), in the
    /// order the [`Assembler`] prepares without holding a tensor back (each layer's `mlp.Wo`
    /// before its `mlp.Wi`). With `threads` > 1 the layers are split into that many runs
    /// (at most one a layer), each read and prepared on a thread of its own: quantizing and
    /// packing is most of a load, and the layers are independent.
    pub(crate) fn load(
        config: &ModelConfig,
        weights: Safetensors,
        options: LoadOptions,
        threads: usize,
    ) -> Result<Self> {
        let assembler = Self::assemble(config, &weights, options, threads, false)?;
        match options.table {
            // Read a row per token from `weights` (see `Table::Source`).
            EmbeddingTable::F32 => assembler.finish(Some(weights)),
            EmbeddingTable::Int8 => assembler.finish(None),
        }
    }

    /// [`load`](Self::load)'s int8 weights before packing, for ruri's int8 file (the table
    /// too when it is [`EmbeddingTable::Int8`]).
    pub(crate) fn quantize(
        config: &ModelConfig,
        weights: &Safetensors,
        options: LoadOptions,
        threads: usize,
    ) -> Result<Quantized> {
        Self::assemble(config, weights, options, threads, true)?.finish_parts()
    }

    /// Every tensor of `weights` prepared into an [`Assembler`] ([`EmbeddingTable::F32`]'s
    /// table excepted), the layers on up to `threads` threads; its int8 layers unpacked with
    /// `keep_parts`.
    fn assemble(
        config: &ModelConfig,
        weights: &Safetensors,
        options: LoadOptions,
        threads: usize,
        keep_parts: bool,
    ) -> Result<Assembler> {
        let layers = config.num_hidden_layers;
        let runs = threads.clamp(1, layers.max(1));
        let run = |r: usize| (r * layers / runs)..((r + 1) * layers / runs);
        let mut assembler = std::thread::scope(|scope| -> Result<Assembler> {
            let others: Vec<_> = (1..runs)
                .map(|r| {
                    let range = run(r);
                    scope.spawn(move || {
                        Self::load_layers(config, weights, options, range, keep_parts)
                    })
                })
                .collect();
            let mut assembler = Self::load_layers(config, weights, options, run(0), keep_parts)?;
            for other in others {
                let other = other
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
                assembler.absorb(other);
            }
            Ok(assembler)
        })?;
        // One fp32 buffer for every tensor while it is prepared: nothing but the prepared
        // weights is left behind (or fragments the heap).
        let mut w = Vec::new();
        let mut feed = |name: String, assembler: &mut Assembler| -> Result<()> {
            weights.read_into(&name, &mut w)?;
            assembler.tensor(&name, &mut w)
        };
        feed("embeddings.norm.weight".into(), &mut assembler)?;
        feed("final_norm.weight".into(), &mut assembler)?;
        if options.table == EmbeddingTable::Int8 {
            let (vocab, h) = (config.vocab_size, config.hidden_size);
            const ROWS: usize = 256;
            for first in (0..vocab).step_by(ROWS) {
                let rows = (vocab - first).min(ROWS);
                weights.read_rows_into(EMBEDDINGS, first, rows, &mut w)?;
                assembler.embedding_rows(&w[..rows * h])?;
            }
        }
        Ok(assembler)
    }

    /// The tensors of layers `range`, read and prepared in order into an [`Assembler`]
    /// of their own.
    fn load_layers(
        config: &ModelConfig,
        weights: &Safetensors,
        options: LoadOptions,
        range: Range<usize>,
        keep_parts: bool,
    ) -> Result<Assembler> {
        let mut assembler = Assembler::new(config, options);
        if keep_parts {
            assembler = assembler.keeping_parts();
        }
        // One fp32 buffer for every tensor while it is prepared: nothing but the prepared
        // weights is left behind (or fragments the heap).
        let mut w = Vec::new();
        let mut feed = |name: String| -> Result<()> {
            weights.read_into(&name, &mut w)?;
            assembler.tensor(&name, &mut w)
        };
        for n in range {
            let p = |t: &str| format!("layers.{n}.{t}");
            if n > 0 {
                feed(p("attn_norm.weight"))?;
            }
            feed(p("attn.Wqkv.weight"))?;
            feed(p("attn.Wo.weight"))?;
            feed(p("mlp_norm.weight"))?;
            feed(p("mlp.Wo.weight"))?;
            feed(p("mlp.Wi.weight"))?;
        }
        Ok(assembler)
    }

    pub(crate) fn hidden(&self) -> usize {
        self.config.hidden_size
    }

    pub(crate) fn vocab(&self) -> usize {
        self.config.vocab_size
    }

    pub(crate) fn kernel(&self) -> Option<Kernel> {
        self.kernel
    }

    pub(crate) fn attention(&self) -> AttentionPrecision {
        self.attention
    }

    /// How attention's products run: in f32, or bf16's or int13's products in the portable
    /// loops under [`Kernel::Scalar`] (plain Rust everywhere the instructions could differ,
    /// so that the tests compare the tiles with them through the whole model), else on the
    /// tiles where this CPU has them.
    fn arithmetic(&self) -> Arithmetic {
        use crate::kernels::{bf16, int13};
        let scalar = self.kernel_choice == Kernel::Scalar;
        match self.attention {
            AttentionPrecision::F32 => Arithmetic::F32,
            AttentionPrecision::Bf16 if scalar => Arithmetic::Bf16(bf16::Products::Portable),
            AttentionPrecision::Bf16 => Arithmetic::Bf16(bf16::Products::detect()),
            AttentionPrecision::Int13 if scalar => Arithmetic::Int13(int13::Products::Portable),
            AttentionPrecision::Int13 => Arithmetic::Int13(int13::Products::detect()),
        }
    }

    pub(crate) fn max_positions(&self) -> usize {
        self.config.max_position_embeddings
    }

    /// Bytes of prepared layer weights (the embedding table is not held).
    pub(crate) fn weight_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| {
                l.wqkv.heap_bytes() + l.wo.heap_bytes() + l.wi.heap_bytes() + l.mlp_wo.heap_bytes()
            })
            .sum()
    }

    /// Row `id` of the token-embedding table, into `row` (`id` checked by the caller).
    fn embedding(&self, id: u32, row: &mut Vec<f32>) -> Result<()> {
        let (id, h) = (id as usize, self.hidden());
        match &self.table {
            Table::Source(weights) => weights.read_rows_into(EMBEDDINGS, id, 1, row),
            Table::F32(t) => {
                row.clear();
                row.extend_from_slice(&t[id * h..(id + 1) * h]);
                Ok(())
            }
            Table::Int8 { q, scales } => {
                row.clear();
                let s = scales[id];
                row.extend(q[id * h..(id + 1) * h].iter().map(|&v| f32::from(v) * s));
                Ok(())
            }
        }
    }

    /// Mean-pooled (not normalized) vectors of the packed texts into `out`
    /// (`texts × hidden`). Ids and positions were checked by the caller.
    /// `pool`, when given, splits each layer's rows (and attention's heads) among its
    /// workers: for calls with fewer texts than workers.
    pub(crate) fn embed(
        &self,
        packed: &Packed<'_>,
        out: &mut [f32],
        pool: Option<&rayon::ThreadPool>,
        helper: Option<Arc<Helper>>,
    ) -> Result<()> {
        let h = self.hidden();
        let tokens = packed.ids.len();
        // transformers: tok_embeddings → LayerNorm (dropout off). From a cache line: the
        // float steps' loads of a row then never split two (BENCHMARKS.md, eighteenth step).
        let mut x = Aligned::<f32>::zeroed(tokens * h);
        let mut e = Vec::with_capacity(h);
        for (row, &id) in x.chunks_exact_mut(h).zip(packed.ids) {
            self.embedding(id, &mut e)?;
            simd_f32::layer_norm(&e[..h], &self.emb_norm, self.eps, row);
        }
        let mut scratch = Scratch::new(tokens, &self.config, helper);
        for layer in &self.layers {
            self.attention_block(layer, packed, &mut x, &mut scratch, pool);
            self.mlp_block(layer, &mut x, &mut scratch, pool);
        }
        // final_norm, then sentence-transformers' mean Pooling: Σ h·mask / max(Σ mask, 1e-9).
        let mut normed = vec![0.0f32; h];
        for t in 0..packed.texts() {
            let o = &mut out[t * h..(t + 1) * h];
            o.iter_mut().for_each(|v| *v = 0.0);
            let range = packed.text(t);
            let count = range.len() as f32;
            for r in range {
                simd_f32::layer_norm(
                    &x[r * h..(r + 1) * h],
                    &self.final_norm,
                    self.eps,
                    &mut normed,
                );
                for (a, &v) in o.iter_mut().zip(&normed) {
                    *a += v;
                }
            }
            let count = count.max(1e-9);
            o.iter_mut().for_each(|v| *v /= count);
        }
        Ok(())
    }

    /// `x += Wo(attention(Wqkv(attn_norm(x))))`.
    fn attention_block(
        &self,
        layer: &Layer,
        packed: &Packed<'_>,
        x: &mut [f32],
        s: &mut Scratch,
        pool: Option<&rayon::ThreadPool>,
    ) {
        let h = self.hidden();
        let tokens = packed.ids.len();
        // The first layer has no attn_norm (its input was normed after the embeddings).
        let norm_row = |r: usize, o: &mut [f32]| {
            let row = &x[r * h..(r + 1) * h];
            match &layer.attn_norm {
                Some(w) => simd_f32::layer_norm(row, w, self.eps, o),
                None => o.copy_from_slice(row),
            }
        };
        let (rope, past) = match layer.kind {
            AttentionKind::Global => (&self.rope_global, &mut s.rope_past[0]),
            AttentionKind::Local => (&self.rope_local, &mut s.rope_past[1]),
        };
        let (heads, d) = (self.config.num_attention_heads, self.config.head_dim());
        // Wqkv's output is viewed as (3, heads, head_dim): q, k, v, each head contiguous;
        // q's heads, then k's, are the first 2·heads head vectors of a row. Each chunk of
        // rows is rotated as soon as Wqkv has stored it, while it is in cache (rotated after
        // the whole call, a batch's rows came back from L3: RoPE was 1.7 % of the int8
        // workload's samples, 41 % of them on one load).
        let end = packed.positions.iter().max().map_or(0, |&p| p as usize + 1);
        rope.extend(past, d, end, pool);
        let past = &*past;
        let positions = &packed.positions;
        let rotate = |first: usize, rows: &mut [f32]| {
            for (row, &p) in rows.chunks_exact_mut(3 * h).zip(&positions[first..]) {
                rope.rotate(row, 2 * heads, d, p as usize, past);
            }
        };
        layer.wqkv.forward_rows_on(
            pool,
            tokens,
            &mut s.qkv,
            false,
            &mut s.linear,
            norm_row,
            rotate,
        );
        // transformers: `sliding_window = local_attention // 2`; a sliding layer lets query
        // i see key j iff |i − j| ≤ sliding_window (positions, not packed indices).
        let window = match layer.kind {
            AttentionKind::Global => usize::MAX,
            AttentionKind::Local => self.config.local_attention / 2,
        };
        for t in 0..packed.texts() {
            let range = packed.text(t);
            let positions = &packed.positions[range.clone()];
            let qkv = &mut s.qkv[range.start * 3 * h..range.end * 3 * h];
            let ctx = &mut s.ctx[range.start * h..range.end * h];
            let precision = self.arithmetic();
            attend(
                qkv,
                positions,
                (heads, d),
                window,
                precision,
                ctx,
                pool,
                &mut s.attention,
            );
        }
        layer
            .wo
            .forward_on(pool, &s.ctx, tokens, x, true, &mut s.linear);
    }

    /// `x += Wo(GeGLU(Wi(mlp_norm(x))))`: rows are independent, so with a pool each worker
    /// runs the whole MLP on its share of the rows (one join per layer).
    fn mlp_block(
        &self,
        layer: &Layer,
        x: &mut [f32],
        s: &mut Scratch,
        pool: Option<&rayon::ThreadPool>,
    ) {
        let h = self.hidden();
        let tokens = x.len() / h;
        let workers = pool.map_or(1, |p| p.current_num_threads());
        let mlp = |x: &mut [f32], s: &mut MlpScratch| {
            geglu_mlp(&layer.wi, &layer.mlp_wo, &layer.mlp_norm, self.eps, x, s)
        };
        match pool {
            Some(pool) if workers > 1 && tokens >= PARALLEL_MIN_ROWS => {
                let per = tokens.div_ceil(workers);
                let mlp = &mlp;
                pool.scope(|scope| {
                    for part in x.chunks_mut(per * h) {
                        scope.spawn(move |_| mlp(part, &mut MlpScratch::default()));
                    }
                });
            }
            _ => mlp(x, &mut s.mlp),
        }
    }
}

/// Per-call buffers, sized once.
struct Scratch {
    /// From a cache line, as `x` (rows of the hidden width stay on lines).
    qkv: Aligned<f32>,
    ctx: Aligned<f32>,
    linear: LinearScratch,
    mlp: MlpScratch,
    attention: AttentionScratch,
    /// The global and the local rotary angles past the cached positions.
    rope_past: [RopePast; 2],
}

impl Scratch {
    fn new(tokens: usize, c: &ModelConfig, helper: Option<Arc<Helper>>) -> Self {
        let h = c.hidden_size;
        let mut linear = LinearScratch::default();
        linear.helper = helper.clone();
        Self {
            qkv: Aligned::zeroed(tokens * 3 * h),
            ctx: Aligned::zeroed(tokens * h),
            linear,
            mlp: MlpScratch::with_helper(helper),
            attention: AttentionScratch::default(),
            rope_past: Default::default(),
        }
    }
}

/// Calls that need at least this many rotary angles past the cache have them computed, and
/// texts of at least this many tokens have their heads' outputs copied into the context
/// rows, on the pool's workers.
const ROTATE_SPLIT_MIN_TOKENS: usize = 512;

/// Texts shorter than this run their heads one after another even when a pool is given.
const HEAD_SPLIT_MIN_TOKENS: usize = 8;

/// Attention of one text (`qkv`: its rows of Wqkv's output, rotated) into `ctx` (its rows),
/// head by head, the heads spread over `pool`'s workers when given.
#[allow(clippy::too_many_arguments)]
fn attend(
    qkv: &[f32],
    positions: &[u32],
    (heads, d): (usize, usize),
    window: usize,
    precision: Arithmetic,
    ctx: &mut [f32],
    pool: Option<&rayon::ThreadPool>,
    scratch: &mut AttentionScratch,
) {
    let h = heads * d;
    let len = positions.len();
    if len == 0 {
        // A row without tokens (all padding): nothing to attend, and no head to slice.
        return;
    }
    // head_dim^-0.5 (a power of two for head_dim 16 and 64: exact).
    let scale = 1.0 / (d as f32).sqrt();
    // Wqkv's output is viewed as (3, heads, head_dim): q, k, v, each head contiguous. Heads
    // one after another read q and k in place, rows 3·h apart, and write their output in
    // place into ctx (copies of q, k, v and of the output took ≈ 3 % of a batch's time).
    let head_of = |head: usize| Head {
        q: &qkv[head * d..],
        k: &qkv[h + head * d..],
        v: &qkv[2 * h + head * d..],
        stride: 3 * h,
        d,
    };
    match pool {
        Some(pool) if heads > 1 && len >= HEAD_SPLIT_MIN_TOKENS => {
            // A long text (≥ 128 tokens alone), its heads on the workers: each head's q, k and
            // v copied into rows of their own first (as before in-place reading: for a
            // 2,308-token text it measured no faster, 1.02–1.04× main's time either way), and
            // its output into a buffer of its own (the heads' columns interleave in ctx's
            // rows), copied in afterwards.
            // bf16 and int13 attention pack q, k and v from where they are: no copies.
            let mut outs: Vec<Vec<f32>> = vec![Vec::new(); heads];
            let head_of = &head_of;
            pool.scope(|s| {
                for (head, out) in outs.iter_mut().enumerate() {
                    s.spawn(move |_| {
                        out.resize(len * d, 0.0);
                        let scratch = &mut AttentionScratch::default();
                        if precision != Arithmetic::F32 {
                            let own = head_of(head);
                            attend_head(&own, positions, window, scale, precision, scratch, out, d);
                            return;
                        }
                        let mut parts = vec![0.0; 3 * len * d];
                        for (j, row) in qkv.chunks_exact(3 * h).enumerate() {
                            for which in 0..3 {
                                let from = which * h + head * d;
                                parts[(which * len + j) * d..(which * len + j + 1) * d]
                                    .copy_from_slice(&row[from..from + d]);
                            }
                        }
                        let (q, rest) = parts.split_at(len * d);
                        let (k, v) = rest.split_at(len * d);
                        let own = Head {
                            q,
                            k,
                            v,
                            stride: d,
                            d,
                        };
                        attend_head(&own, positions, window, scale, precision, scratch, out, d);
                    });
                }
            });
            // Each head's output into its columns of ctx's rows; a long text's rows on the
            // workers.
            let outs = &outs;
            let copy = |rows: &mut [f32], first: usize| {
                for (i, row) in rows.chunks_exact_mut(h).enumerate() {
                    for (head, out) in outs.iter().enumerate() {
                        let from = &out[(first + i) * d..(first + i + 1) * d];
                        row[head * d..(head + 1) * d].copy_from_slice(from);
                    }
                }
            };
            if len >= ROTATE_SPLIT_MIN_TOKENS {
                let per = len.div_ceil(pool.current_num_threads());
                let copy = &copy;
                pool.scope(|scope| {
                    for (k, rows) in ctx.chunks_mut(per * h).enumerate() {
                        scope.spawn(move |_| copy(rows, k * per));
                    }
                });
            } else {
                copy(ctx, 0);
            }
        }
        _ => {
            for head in 0..heads {
                let out = &mut ctx[head * d..];
                let head = head_of(head);
                attend_head(&head, positions, window, scale, precision, scratch, out, h);
            }
        }
    }
}

/// The error for a token id outside the vocabulary.
pub(crate) fn bad_id(id: i64) -> Error {
    Error::InvalidOption {
        name: "input_ids",
        value: id.to_string(),
        reason: "token id outside the model's vocabulary (tokenizer and model.safetensors \
                 disagree)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Kernel;

    /// Positions past the rotary cache, in any order and again, rotate with the angles of
    /// [`Rope::angle`] (as the cache's own positions do), each computed once per call.
    #[test]
    fn angles_past_the_cache_are_the_same_angles() {
        let (d, heads, cached) = (8usize, 2usize, 4usize);
        let rope = Rope::new(10_000.0, d, cached);
        let row: Vec<f32> = (0..heads * d).map(|i| i as f32 * 0.37 - 1.3).collect();
        let direct = |position: usize| {
            let (sin, cos): (Vec<f32>, Vec<f32>) =
                (0..d / 2).map(|j| rope.angle(position, j)).unzip();
            let mut x = row.clone();
            simd_f32::rotate_heads(&mut x, d, &sin, &cos);
            x
        };
        let mut past = RopePast::default();
        for position in [2, 9, 5, 4, 9, 12, 3] {
            let mut x = row.clone();
            rope.apply_heads(&mut x, heads, d, position, &mut past);
            assert_eq!(x, direct(position), "position {position}");
        }
        // Positions 4..=12 past the cache, each once.
        assert_eq!(past.cos.len(), 9 * d / 2);

        // A long text's angles, on a pool's workers (521 new positions on 3 threads: chunks
        // of 174, 174 and 173), after a few computed alone: every angle in its place.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let end = 13 + ROTATE_SPLIT_MIN_TOKENS + 9;
        assert_eq!((end - 13) % 3, 2);
        rope.extend(&mut past, d, end, Some(&pool));
        assert_eq!(past.cos.len(), (end - cached) * d / 2);
        for position in cached..end {
            for j in 0..d / 2 {
                let at = (position - cached) * d / 2 + j;
                let (s, c) = rope.angle(position, j);
                assert_eq!((past.sin[at], past.cos[at]), (s, c), "position {position}");
            }
        }
    }

    /// Moving the MLP's writer units after the others changes no bit of the MLP's int8
    /// output: Wi's rows (both halves) and Wo's columns move together, and Wo's two
    /// products then read contiguous groups in place instead of gathering them.
    #[test]
    fn reordered_units_give_the_same_bits() {
        let (h, u, rows) = (8usize, 12usize, 3usize);
        let writers = vec![1usize, 4, 5, 9];
        let value = |i: usize| ((i * 7919) % 211) as f32 / 105.0 - 1.0;
        let wi: Vec<f32> = (0..2 * u * h).map(value).collect();
        let wo: Vec<f32> = (0..h * u)
            .map(|i| {
                let (j, c) = (i / u, i % u);
                match (writers.contains(&c), j) {
                    (true, 2) => 0.05,
                    (true, _) => 0.0,
                    _ => value(i + 3) * 0.3,
                }
            })
            .collect();
        assert_eq!(detect_writers(&wo, h, u), writers);
        let x: Vec<f32> = (0..rows * h).map(|i| value(i + 11)).collect();
        let mlp = |wi: &[f32], wo: &[f32], writers: Vec<usize>| {
            let mut scratch = LinearScratch::default();
            let wi = Linear::int8(
                Kernel::Scalar,
                &mut wi.to_vec(),
                2 * u,
                h,
                vec![],
                &mut Vec::new(),
            );
            let mut y = vec![0.0; rows * 2 * u];
            wi.forward(&x, rows, &mut y, false, &mut scratch);
            let mut act = vec![0.0; rows * u];
            for (a, y) in act.chunks_exact_mut(u).zip(y.chunks_exact(2 * u)) {
                let (input, gate) = y.split_at(u);
                simd_f32::geglu(input, gate, a);
            }
            let wo = Linear::int8_split(Kernel::Scalar, wo, h, u, writers, &mut Vec::new());
            let mut out = vec![0.5; rows * h];
            wo.forward(&act, rows, &mut out, true, &mut scratch);
            out
        };
        let mut order: Vec<usize> = (0..u).filter(|c| !writers.contains(c)).collect();
        order.extend(&writers);
        let (mut wi2, mut wo2) = (wi.clone(), wo.clone());
        permute_rows(&mut wi2, h, &order);
        permute_columns(&mut wo2, u, &order);
        for (new, &old) in order.iter().enumerate() {
            assert_eq!(wi2[new * h..(new + 1) * h], wi[old * h..(old + 1) * h]);
            let gate = |n: usize| (u + n) * h..(u + n + 1) * h;
            assert_eq!(wi2[gate(new)], wi[gate(old)]);
            for j in 0..h {
                assert_eq!(wo2[j * u + new], wo[j * u + old]);
            }
        }
        let moved: Vec<usize> = (u - writers.len()..u).collect();
        assert_eq!(detect_writers(&wo2, h, u), moved);
        let (a, b) = (mlp(&wi, &wo, writers), mlp(&wi2, &wo2, moved));
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}
