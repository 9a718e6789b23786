//! ModernBERT's encoder on packed tokens: the texts of a batch are laid end to end (no
//! padding reaches a linear layer), attention runs text by text, and mean pooling happens
//! as the final norm is applied. Each step names the transformers behaviour it matches.

use std::ops::Range;

use ruri_core::config::AttentionKind;
use ruri_core::{Error, ModelConfig, Result};

use crate::Precision;
use crate::attention::{AttentionScratch, Head, attend_head};
use crate::kernels::Kernel;
use crate::kernels::simd_f32;
use crate::linear::{Linear, LinearScratch, detect_outliers, detect_writers};
use crate::weights::Safetensors;

/// Rows of the MLP processed together: their intermediate activations stay in cache.
const MLP_CHUNK: usize = 64;
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
    /// the angles are computed once for all heads, into `buf`.
    fn apply_heads(
        &self,
        row: &mut [f32],
        heads: usize,
        d: usize,
        position: usize,
        buf: &mut Vec<f32>,
    ) {
        let half = d / 2;
        let (sin, cos): (&[f32], &[f32]) = if position * half + half <= self.cos.len() {
            let at = position * half..position * half + half;
            (&self.sin[at.clone()], &self.cos[at])
        } else {
            buf.clear();
            buf.resize(2 * half, 0.0);
            for j in 0..half {
                let (s, c) = self.angle(position, j);
                buf[j] = s;
                buf[half + j] = c;
            }
            buf.split_at(half)
        };
        for x in row.chunks_exact_mut(d).take(heads) {
            for j in 0..half {
                let (s, c) = (sin[j], cos[j]);
                let (a, b) = (x[j], x[j + half]);
                x[j] = a * c + (-b) * s;
                x[j + half] = b * c + a * s;
            }
        }
    }
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

/// The whole encoder.
#[derive(Debug)]
pub(crate) struct Model {
    config: ModelConfig,
    /// Also the token-embedding table, read a row per token when a call needs it: the
    /// table is never held (102,400 × 256 f32 would be 105 MB, and a cache of the rows a
    /// workload touches grows to tens of MB); the operating system's page cache keeps the
    /// file's hot pages, outside this process's memory.
    weights: Safetensors,
    emb_norm: Vec<f32>,
    final_norm: Vec<f32>,
    layers: Vec<Layer>,
    rope_global: Rope,
    rope_local: Rope,
    eps: f32,
    kernel: Option<Kernel>,
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
    /// Reads and prepares every weight of `weights` (checked against `config`).
    pub(crate) fn load(
        config: &ModelConfig,
        weights: Safetensors,
        precision: Precision,
        kernel: Kernel,
        outliers: bool,
    ) -> Result<Self> {
        let (h, i) = (config.hidden_size, config.intermediate_size);
        // One fp32 and one int8 buffer for every layer's weights while they are prepared:
        // nothing but the prepared weights is left behind (or fragments the heap).
        let scratch = std::cell::RefCell::new((Vec::<f32>::new(), Vec::<i8>::new()));
        // `reads_norm`: a layer fed by a LayerNorm (outlier input channels in f32); else a
        // layer whose writer columns, if any, get an int8 product of their own.
        // `units`: for the MLP, the order of its intermediate units (see below), applied to
        // Wi's rows (both halves) and to Wo's columns.
        let linear = |name: &str,
                      n: usize,
                      k: usize,
                      reads_norm: bool,
                      units: Option<&[usize]>|
         -> Result<Linear> {
            let (w, q) = &mut *scratch.borrow_mut();
            weights.read_into(name, w)?;
            if let Some(units) = units {
                if reads_norm {
                    permute_rows(w, k, units);
                } else {
                    permute_columns(w, k, units);
                }
            }
            Ok(match precision {
                Precision::Fp32 => Linear::fp32(w, n, k),
                Precision::Int8 if outliers && !reads_norm => {
                    let writers = detect_writers(w, n, k);
                    if writers.is_empty() {
                        Linear::int8(kernel, w, n, k, Vec::new(), q)
                    } else {
                        Linear::int8_split(kernel, w, n, k, writers, q)
                    }
                }
                Precision::Int8 => {
                    let found = if outliers && reads_norm {
                        detect_outliers(w, n, k)
                    } else {
                        Vec::new()
                    };
                    Linear::int8(kernel, w, n, k, found, q)
                }
            })
        };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for (n, &kind) in config.layer_types.iter().enumerate() {
            let p = |t: &str| format!("layers.{n}.{t}");
            // The MLP's writer units (see `detect_writers`) moved after the others, so that
            // both groups of Wo's input are contiguous and read in place: the same sums
            // (integer, and each group's max), in another order of units.
            let units = if precision == Precision::Int8 && outliers {
                let wo = weights.read(&p("mlp.Wo.weight"))?;
                let writers = detect_writers(&wo, h, i);
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
            layers.push(Layer {
                attn_norm: if n == 0 {
                    None
                } else {
                    Some(weights.read(&p("attn_norm.weight"))?)
                },
                // The norm-fed layers may read a massive-activation channel; the others read
                // attention outputs and GeGLU products.
                wqkv: linear(&p("attn.Wqkv.weight"), 3 * h, h, true, None)?,
                wo: linear(&p("attn.Wo.weight"), h, h, false, None)?,
                mlp_norm: weights.read(&p("mlp_norm.weight"))?,
                wi: linear(&p("mlp.Wi.weight"), 2 * i, h, true, units.as_deref())?,
                mlp_wo: linear(&p("mlp.Wo.weight"), h, i, false, units.as_deref())?,
                kind,
            });
        }
        let head_dim = config.head_dim();
        let cached = config.max_position_embeddings.min(ROPE_CACHED);
        Ok(Self {
            emb_norm: weights.read("embeddings.norm.weight")?,
            final_norm: weights.read("final_norm.weight")?,
            layers,
            rope_global: Rope::new(config.global_rope_theta, head_dim, cached),
            rope_local: Rope::new(config.local_rope_theta, head_dim, cached),
            eps: config.norm_eps as f32,
            kernel: (precision == Precision::Int8).then_some(kernel),
            config: config.clone(),
            weights,
        })
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

    /// Row `id` of the token-embedding table, into `row`.
    fn embedding(&self, id: u32, row: &mut Vec<f32>) -> Result<()> {
        self.weights
            .read_rows_into("embeddings.tok_embeddings.weight", id as usize, 1, row)
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
    ) -> Result<()> {
        let h = self.hidden();
        let tokens = packed.ids.len();
        // transformers: tok_embeddings → LayerNorm (dropout off).
        let mut x = vec![0.0f32; tokens * h];
        let mut e = Vec::with_capacity(h);
        for (row, &id) in x.chunks_exact_mut(h).zip(packed.ids) {
            self.embedding(id, &mut e)?;
            simd_f32::layer_norm(&e[..h], &self.emb_norm, self.eps, row);
        }
        let mut scratch = Scratch::new(tokens, &self.config);
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
        let input: &[f32] = match &layer.attn_norm {
            Some(w) => {
                for (o, row) in s.normed.chunks_exact_mut(h).zip(x.chunks_exact(h)) {
                    simd_f32::layer_norm(row, w, self.eps, o);
                }
                &s.normed
            }
            None => x,
        };
        layer
            .wqkv
            .forward_on(pool, input, tokens, &mut s.qkv, false, &mut s.linear);
        let rope = match layer.kind {
            AttentionKind::Global => &self.rope_global,
            AttentionKind::Local => &self.rope_local,
        };
        // transformers: `sliding_window = local_attention // 2`; a sliding layer lets query
        // i see key j iff |i − j| ≤ sliding_window (positions, not packed indices).
        let window = match layer.kind {
            AttentionKind::Global => usize::MAX,
            AttentionKind::Local => self.config.local_attention / 2,
        };
        let (heads, d) = (self.config.num_attention_heads, self.config.head_dim());
        for t in 0..packed.texts() {
            let range = packed.text(t);
            let positions = &packed.positions[range.clone()];
            let qkv = &mut s.qkv[range.start * 3 * h..range.end * 3 * h];
            // Wqkv's output is viewed as (3, heads, head_dim): q, k, v, each head contiguous.
            for (row, &p) in qkv.chunks_exact_mut(3 * h).zip(positions) {
                // q's heads, then k's: the first 2·heads head vectors of the row.
                rope.apply_heads(row, 2 * heads, d, p as usize, &mut s.angles);
            }
            let ctx = &mut s.ctx[range.start * h..range.end * h];
            attend(
                qkv,
                positions,
                heads,
                d,
                window,
                ctx,
                pool,
                &mut s.attention,
            );
        }
        layer
            .wo
            .forward_on(pool, &s.ctx, tokens, x, true, &mut s.linear);
    }

    /// `x += Wo(GeGLU(Wi(mlp_norm(x))))`, in chunks of rows.
    fn mlp_block(
        &self,
        layer: &Layer,
        x: &mut [f32],
        s: &mut Scratch,
        pool: Option<&rayon::ThreadPool>,
    ) {
        let (h, i) = (self.hidden(), self.config.intermediate_size);
        let tokens = x.len() / h;
        for start in (0..tokens).step_by(MLP_CHUNK) {
            let rows = (tokens - start).min(MLP_CHUNK);
            let xs = &mut x[start * h..(start + rows) * h];
            for (o, row) in s.normed.chunks_exact_mut(h).zip(xs.chunks_exact(h)) {
                simd_f32::layer_norm(row, &layer.mlp_norm, self.eps, o);
            }
            layer
                .wi
                .forward_on(pool, &s.normed, rows, &mut s.wi, false, &mut s.linear);
            // ModernBertMLP: Wi's output chunked into (input, gate); GELU(input) · gate.
            for (a, y) in s
                .act
                .chunks_exact_mut(i)
                .zip(s.wi.chunks_exact(2 * i))
                .take(rows)
            {
                let (input, gate) = y.split_at(i);
                simd_f32::geglu(input, gate, a);
            }
            layer
                .mlp_wo
                .forward_on(pool, &s.act, rows, xs, true, &mut s.linear);
        }
    }
}

/// Per-call buffers, sized once.
struct Scratch {
    normed: Vec<f32>,
    qkv: Vec<f32>,
    ctx: Vec<f32>,
    wi: Vec<f32>,
    act: Vec<f32>,
    linear: LinearScratch,
    attention: AttentionScratch,
    /// sin and cos of one position past the rotary cache.
    angles: Vec<f32>,
}

impl Scratch {
    fn new(tokens: usize, c: &ModelConfig) -> Self {
        let h = c.hidden_size;
        Self {
            normed: vec![0.0; tokens.max(MLP_CHUNK) * h],
            qkv: vec![0.0; tokens * 3 * h],
            ctx: vec![0.0; tokens * h],
            wi: vec![0.0; MLP_CHUNK * 2 * c.intermediate_size],
            act: vec![0.0; MLP_CHUNK * c.intermediate_size],
            linear: LinearScratch::default(),
            attention: AttentionScratch::default(),
            angles: Vec::new(),
        }
    }
}

/// Texts shorter than this run their heads one after another even when a pool is given.
const HEAD_SPLIT_MIN_TOKENS: usize = 8;

/// Attention of one text (`qkv`: its rows of Wqkv's output, rotated) into `ctx` (its rows),
/// head by head, the heads spread over `pool`'s workers when given.
#[allow(clippy::too_many_arguments)]
fn attend(
    qkv: &[f32],
    positions: &[u32],
    heads: usize,
    d: usize,
    window: usize,
    ctx: &mut [f32],
    pool: Option<&rayon::ThreadPool>,
    scratch: &mut AttentionScratch,
) {
    let h = heads * d;
    let len = positions.len();
    // head_dim^-0.5 (a power of two for head_dim 16 and 64: exact).
    let scale = 1.0 / (d as f32).sqrt();
    // Wqkv's output is viewed as (3, heads, head_dim): q, k, v, each head contiguous.
    let one = |head: usize, scratch: &mut AttentionScratch, out: &mut Vec<f32>| {
        let mut parts = std::mem::take(&mut scratch.parts);
        parts.resize(3 * len * d, 0.0);
        for (j, row) in qkv.chunks_exact(3 * h).enumerate() {
            for which in 0..3 {
                parts[(which * len + j) * d..(which * len + j + 1) * d]
                    .copy_from_slice(&row[which * h + head * d..which * h + (head + 1) * d]);
            }
        }
        out.resize(len * d, 0.0);
        let (q, rest) = parts.split_at(len * d);
        let (k, v) = rest.split_at(len * d);
        attend_head(&Head { q, k, v, d }, positions, window, scale, scratch, out);
        scratch.parts = parts;
    };
    let scatter = |head: usize, out: &[f32], ctx: &mut [f32]| {
        for (row, o) in ctx.chunks_exact_mut(h).zip(out.chunks_exact(d)) {
            row[head * d..(head + 1) * d].copy_from_slice(o);
        }
    };
    match pool {
        Some(pool) if heads > 1 && len >= HEAD_SPLIT_MIN_TOKENS => {
            let mut outs: Vec<Vec<f32>> = vec![Vec::new(); heads];
            pool.scope(|s| {
                for (head, out) in outs.iter_mut().enumerate() {
                    let one = &one;
                    s.spawn(move |_| one(head, &mut AttentionScratch::default(), out));
                }
            });
            for (head, out) in outs.iter().enumerate() {
                scatter(head, out, ctx);
            }
        }
        _ => {
            let mut out = std::mem::take(&mut scratch.out);
            for head in 0..heads {
                one(head, scratch, &mut out);
                scatter(head, &out, ctx);
            }
            scratch.out = out;
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
