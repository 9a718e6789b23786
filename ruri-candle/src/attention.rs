//! Attention masks and the two ways of computing attention: dense (every query against every
//! key, under an additive mask) and banded (local layers only: each block of queries against
//! its three neighbouring key blocks).
//!
//! Everything here is f32 whatever the model dtype: transformers' ModernBERT applies rotary
//! embeddings in f32 (`apply_rotary_pos_emb` upcasts q and k) and runs the softmax in f32
//! (`softmax(..., dtype=torch.float32)`); candle builds its masks in f32 too, so mixing them
//! with bf16 scores is where bf16 ModernBERT ports go wrong.

use candle_core::{DType, Device, Result, Tensor};

/// Additive mask value for a forbidden (query, key) pair. Finite, as transformers'
/// `torch.finfo(dtype).min`: a row with no allowed key (a padding query whose whole window is
/// padding) then gives a finite uniform average instead of NaN, and NaN cannot leak from
/// padding rows into real tokens through `0 · NaN` in the next layer's value product.
const FORBIDDEN: f32 = f32::MIN;

/// Largest score matrix (elements) that global attention builds at once; longer inputs are
/// processed in query chunks so memory stays bounded (4 × 128 MiB in f32 at most).
const MAX_SCORE_ELEMENTS: usize = 1 << 25;

/// How local layers compute attention for one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LocalStrategy {
    /// The whole sequence lies inside every window: local attention is global attention.
    SameAsGlobal,
    /// `seq × seq` scores under a band mask.
    Dense,
    /// Blocks of `half_window` queries against three key blocks: O(seq · window).
    Banded,
}

impl LocalStrategy {
    /// Picks the cheapest exact strategy for `seq_len` tokens and a half window of `half`.
    pub(crate) fn choose(seq_len: usize, half: usize, banded_from: usize) -> Self {
        if seq_len <= half + 1 {
            // |i − j| ≤ seq_len − 1 ≤ half for every pair: the band removes nothing.
            LocalStrategy::SameAsGlobal
        } else if seq_len >= banded_from {
            LocalStrategy::Banded
        } else {
            LocalStrategy::Dense
        }
    }
}

/// The masks of one batch, built once on the device and shared by every layer.
#[derive(Debug)]
pub(crate) struct Masks {
    /// `batch × 1 × 1 × seq`: 0 on real keys, [`FORBIDDEN`] on padding.
    global: Tensor,
    local: LocalMask,
    half: usize,
}

#[derive(Debug)]
enum LocalMask {
    SameAsGlobal,
    /// `batch × 1 × seq × seq`.
    Dense(Tensor),
    /// `batch × 1 × blocks × block × 3·block`, with the padded length.
    Banded {
        mask: Tensor,
        padded_len: usize,
    },
}

/// 0/1 (f32) → additive mask: 1 ↦ 0, 0 ↦ [`FORBIDDEN`].
fn to_additive(allowed: &Tensor) -> Result<Tensor> {
    // 1·MAX + MIN is exactly 0 in f32; 0·MAX + MIN is MIN.
    allowed.affine(f32::MAX as f64, FORBIDDEN as f64)
}

/// `|i − j| ≤ half` for queries `i` and keys `j` (0/1 f32, `rows × cols`), with key `j`
/// standing at column `j − key_offset` relative to query row `i`.
fn band(rows: usize, cols: usize, key_offset: i64, half: usize, device: &Device) -> Result<Tensor> {
    let i = Tensor::arange(0f32, rows as f32, device)?.reshape((rows, 1))?;
    let j = (Tensor::arange(0f32, cols as f32, device)? - key_offset as f64)?.reshape((1, cols))?;
    let distance = i.broadcast_sub(&j)?.abs()?;
    distance.le(half as f64)?.to_dtype(DType::F32)
}

impl Masks {
    /// `attention_mask`: `batch × seq` (u32 0/1) on the device. Local layers see keys with
    /// `|i − j| ≤ half`, as transformers' `create_bidirectional_sliding_window_mask` with
    /// `sliding_window = local_attention / 2`.
    pub(crate) fn new(
        attention_mask: &Tensor,
        half: usize,
        strategy: LocalStrategy,
    ) -> Result<Self> {
        let (batch, seq) = attention_mask.dims2()?;
        let device = attention_mask.device();
        let keys = attention_mask.to_dtype(DType::F32)?;
        let global = to_additive(&keys)?.reshape((batch, 1, 1, seq))?;
        let local = match strategy {
            LocalStrategy::SameAsGlobal => LocalMask::SameAsGlobal,
            LocalStrategy::Dense => {
                let band = band(seq, seq, 0, half, device)?.reshape((1, 1, seq, seq))?;
                let allowed = band.broadcast_mul(&keys.reshape((batch, 1, 1, seq))?)?;
                LocalMask::Dense(to_additive(&allowed)?)
            }
            LocalStrategy::Banded => {
                let w = half.max(1);
                let blocks = seq.div_ceil(w);
                let padded_len = blocks * w;
                // Keys padded by one block of nothing on each side (and up to the block
                // multiple), then cut into each query block's window of blocks i−1, i, i+1.
                let keys = keys.pad_with_zeros(1, w, padded_len - seq + w)?;
                let windows = key_windows(&keys.unsqueeze(1)?, blocks, w)?; // b × 1 × blocks × 3w
                let windows = windows.squeeze(1)?.unsqueeze(1)?.unsqueeze(3)?; // b × 1 × blocks × 1 × 3w
                // Query a of a block against window column c: key position − query position
                // is c − w − a.
                let band = band(w, 3 * w, w as i64, half, device)?.reshape((1, 1, 1, w, 3 * w))?;
                let allowed = windows.broadcast_mul(&band)?;
                LocalMask::Banded {
                    mask: to_additive(&allowed)?,
                    padded_len,
                }
            }
        };
        Ok(Self {
            global,
            local,
            half,
        })
    }

    /// Global attention (`batch × heads × seq × head_dim`, f32 q scaled, k, v).
    pub(crate) fn global(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        dense(q, k, v, &self.global)
    }

    /// Local attention, by the strategy chosen for this batch.
    pub(crate) fn local(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        match &self.local {
            LocalMask::SameAsGlobal => dense(q, k, v, &self.global),
            LocalMask::Dense(mask) => dense(q, k, v, mask),
            LocalMask::Banded { mask, padded_len } => {
                banded(q, k, v, mask, self.half.max(1), *padded_len)
            }
        }
    }
}

/// Splits `x` (`b × h × (blocks + 2)·w × d`, padded by one block each side) into the windows
/// of each query block: `b × h × blocks × 3w × d` (or `b × h × blocks × 3w` for rank 3).
fn key_windows(x: &Tensor, blocks: usize, w: usize) -> Result<Tensor> {
    let len = blocks * w;
    let parts = (0..3)
        .map(|shift| {
            let part = x.narrow(2, shift * w, len)?;
            let mut dims = part.dims().to_vec();
            dims.splice(2..3, [blocks, w]);
            part.reshape(dims)
        })
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&parts, 3)
}

/// softmax(q·kᵀ + mask)·v, in query chunks when the score matrix would be large.
fn dense(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Result<Tensor> {
    dense_in_chunks(q, k, v, mask, MAX_SCORE_ELEMENTS)
}

fn dense_in_chunks(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    max_score_elements: usize,
) -> Result<Tensor> {
    let (b, h, s, _) = q.dims4()?;
    let kt = k.t()?;
    let per_query = b * h * s;
    let chunk = (max_score_elements / per_query.max(1)).max(1);
    if chunk >= s {
        return attend(q, &kt, v, mask);
    }
    let mask_rows = mask.dim(2)?;
    let mut outs = Vec::with_capacity(s.div_ceil(chunk));
    let mut start = 0;
    while start < s {
        let len = chunk.min(s - start);
        let mask = if mask_rows == 1 {
            mask.clone()
        } else {
            mask.narrow(2, start, len)?
        };
        outs.push(attend(&q.narrow(2, start, len)?, &kt, v, &mask)?);
        start += len;
    }
    Tensor::cat(&outs, 2)
}

fn attend(q: &Tensor, kt: &Tensor, v: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let scores = q.matmul(kt)?.broadcast_add(mask)?;
    let probs = candle_nn::ops::softmax_last_dim(&scores)?;
    probs.matmul(v)
}

/// Banded local attention: query block i (w = half window queries) against key blocks
/// i−1, i, i+1, which hold every key within `|i − j| ≤ half`. Costs O(seq · 3w) instead of
/// O(seq²) and gives the dense result up to summation order (masked keys weigh exactly 0).
fn banded(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    w: usize,
    padded_len: usize,
) -> Result<Tensor> {
    let (b, h, s, d) = q.dims4()?;
    let blocks = padded_len / w;
    // candle's matmul takes one flat batch dimension: fold (b, h, blocks) for the products
    // and unfold for the mask, which broadcasts over heads.
    let n = b * h * blocks;
    let q = q.pad_with_zeros(2, 0, padded_len - s)?.reshape((n, w, d))?;
    let k = key_windows(&k.pad_with_zeros(2, w, padded_len - s + w)?, blocks, w)?.reshape((
        n,
        3 * w,
        d,
    ))?;
    let v = key_windows(&v.pad_with_zeros(2, w, padded_len - s + w)?, blocks, w)?.reshape((
        n,
        3 * w,
        d,
    ))?;
    let scores = q
        .matmul(&k.t()?)?
        .reshape((b, h, blocks, w, 3 * w))?
        .broadcast_add(mask)?;
    let probs = candle_nn::ops::softmax_last_dim(&scores)?.reshape((n, w, 3 * w))?;
    probs
        .matmul(&v)?
        .reshape((b, h, padded_len, d))?
        .narrow(2, 0, s)
}

/// Rotary tables (`seq × head_dim/2`, f32) for one θ, as transformers'
/// `ModernBertRotaryEmbedding`: `inv_freq = 1 / θ^(2i/d)`, angle = position · inv_freq in f32.
pub(crate) fn rope_tables(
    seq: usize,
    head_dim: usize,
    theta: f64,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let inv_freq: Vec<f32> = (0..head_dim / 2)
        .map(|i| (1.0 / theta.powf((2 * i) as f64 / head_dim as f64)) as f32)
        .collect();
    let inv_freq = Tensor::from_vec(inv_freq, (1, head_dim / 2), device)?;
    let positions = Tensor::arange(0u32, seq as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((seq, 1))?;
    let angles = positions.broadcast_mul(&inv_freq)?;
    Ok((angles.cos()?, angles.sin()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(shape: (usize, usize, usize, usize), seed: u64) -> Tensor {
        // A small LCG: deterministic values in [-2, 2) without a rand dependency.
        let n = shape.0 * shape.1 * shape.2 * shape.3;
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let data: Vec<f32> = (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect();
        Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    /// Banded local attention equals the dense band-masked path at lengths below, at and
    /// above block multiples, with right padding, for every real query.
    #[test]
    fn banded_equals_dense() {
        let half = 8;
        for (case, &(seq, real)) in [
            (17, &[17, 5][..]),
            (24, &[24, 24][..]),
            (25, &[25, 1][..]),
            (40, &[33, 40][..]),
            (63, &[63, 20][..]),
            (64, &[64, 9][..]),
        ]
        .iter()
        .enumerate()
        {
            let batch = real.len();
            let q = random((batch, 2, seq, 4), 3 * case as u64);
            let k = random((batch, 2, seq, 4), 3 * case as u64 + 1);
            let v = random((batch, 2, seq, 4), 3 * case as u64 + 2);
            let mask: Vec<u32> = real
                .iter()
                .flat_map(|&r| (0..seq).map(move |i| u32::from(i < r)))
                .collect();
            let keys = Tensor::from_vec(mask, (batch, seq), &Device::Cpu).unwrap();
            let dense = Masks::new(&keys, half, LocalStrategy::Dense)
                .unwrap()
                .local(&q, &k, &v)
                .unwrap();
            let banded = Masks::new(&keys, half, LocalStrategy::Banded)
                .unwrap()
                .local(&q, &k, &v)
                .unwrap();
            assert_eq!(dense.dims(), banded.dims());
            // Padding queries whose whole window is padding average different sets of
            // forbidden keys; their rows are never used (keys mask them, pooling drops them).
            let real_queries = keys
                .to_dtype(DType::F32)
                .unwrap()
                .reshape((batch, 1, seq, 1))
                .unwrap();
            let dense = dense.broadcast_mul(&real_queries).unwrap();
            let banded = banded.broadcast_mul(&real_queries).unwrap();
            let diff = max_abs_diff(&dense, &banded);
            assert!(diff <= 1e-5, "seq {seq} real {real:?}: max |Δ| {diff}");
        }
    }

    /// The dense band mask is |i − j| ≤ half on real keys: a key just outside the window
    /// changes nothing, one just inside does.
    #[test]
    fn window_is_inclusive() {
        let band = band(5, 5, 0, 2, &Device::Cpu)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(band[0], [1.0, 1.0, 1.0, 0.0, 0.0]);
        assert_eq!(band[2], [1.0, 1.0, 1.0, 1.0, 1.0]);
        assert_eq!(band[4], [0.0, 0.0, 1.0, 1.0, 1.0]);
    }

    /// Query chunking (long inputs) gives the unchunked result, for the global mask
    /// (broadcast over queries) and the dense local one (a row per query).
    #[test]
    fn chunked_equals_whole() {
        let (b, h, s, d) = (2, 2, 150, 4);
        let q = random((b, h, s, d), 7);
        let k = random((b, h, s, d), 8);
        let v = random((b, h, s, d), 9);
        let mask: Vec<u32> = (0..b * s).map(|i| u32::from(i < 2 * s - 40)).collect();
        let keys = Tensor::from_vec(mask, (b, s), &Device::Cpu).unwrap();
        let masks = Masks::new(&keys, 8, LocalStrategy::Dense).unwrap();
        let LocalMask::Dense(local) = &masks.local else {
            panic!("asked for a dense local mask")
        };
        for mask in [&masks.global, local] {
            let whole = dense_in_chunks(&q, &k, &v, mask, usize::MAX).unwrap();
            let chunked = dense_in_chunks(&q, &k, &v, mask, b * h * s * 37).unwrap();
            assert!(max_abs_diff(&whole, &chunked) <= 1e-6);
        }
    }

    #[test]
    fn strategy_choice() {
        assert_eq!(
            LocalStrategy::choose(65, 64, 256),
            LocalStrategy::SameAsGlobal
        );
        assert_eq!(LocalStrategy::choose(66, 64, 256), LocalStrategy::Dense);
        assert_eq!(LocalStrategy::choose(256, 64, 256), LocalStrategy::Banded);
    }
}
