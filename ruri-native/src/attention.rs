//! Eager attention of one text, head by head, in blocks of queries: `softmax(q·kᵀ / √d) · v`
//! with keys limited to `|pᵢ − pⱼ| ≤ window`, in f32 (transformers upcasts there too).
//!
//! The order of every sum is fixed and independent of the vector width: a score is summed
//! over `d` one term after another (the SIMD lanes are different keys), the softmax total in
//! [`math::sum`]'s lanes over the query's own keys, and the output over keys one after
//! another (the lanes are different channels). So the hot loops may be compiled for AVX2 or
//! AVX-512 (`crate::kernels::simd_f32`) without changing a bit: no instruction fuses a
//! multiply and an add, and nothing is reassociated. Nothing `len × len` is held: a block's
//! scores are `QUERY_BLOCK × keys in its windows`.

use crate::kernels::simd_f32;
use crate::math::{self, exp};

/// Queries whose scores are computed together (each key row is loaded once for all).
pub(crate) const QUERY_BLOCK: usize = 4;
/// Scores are computed in multiples of this many keys (one AVX-512 vector).
const KEY_GRAIN: usize = 16;

/// One head of one text: `q`, `k`, `v` are `len × d` (q already rotated, k too), `out` is
/// `len × d`. `kt` and `scores` are scratch.
pub(crate) struct Head<'a> {
    pub(crate) q: &'a [f32],
    pub(crate) k: &'a [f32],
    pub(crate) v: &'a [f32],
    pub(crate) d: usize,
}

/// Buffers of [`attend_head`] and its caller, kept between heads and layers.
#[derive(Debug, Default)]
pub(crate) struct AttentionScratch {
    kt: Vec<f32>,
    scores: Vec<f32>,
    /// The caller's copies of one head's q, k and v.
    pub(crate) parts: Vec<f32>,
    /// The caller's output of one head.
    pub(crate) out: Vec<f32>,
}

/// Attention of one head over `positions` (ascending), into `out` (`len × d`).
pub(crate) fn attend_head(
    head: &Head<'_>,
    positions: &[u32],
    window: usize,
    scale: f32,
    scratch: &mut AttentionScratch,
    out: &mut [f32],
) {
    let (len, d) = (positions.len(), head.d);
    // Keys transposed, d × stride: the score loop runs along keys. Rows are padded with
    // zero keys so that every block computes a multiple of KEY_GRAIN scores (whole vectors,
    // no scalar remainder); the padded scores are never read.
    let stride = len.div_ceil(KEY_GRAIN) * KEY_GRAIN + KEY_GRAIN;
    scratch.kt.clear();
    scratch.kt.resize(d * stride, 0.0);
    for j in 0..len {
        for c in 0..d {
            scratch.kt[c * stride + j] = head.k[j * d + c];
        }
    }
    let window_of = |i: usize| {
        let pi = positions[i] as usize;
        let lo = positions.partition_point(|&p| pi.saturating_sub(p as usize) > window);
        let hi = positions.partition_point(|&p| (p as usize) <= pi.saturating_add(window));
        (lo, hi)
    };
    for first in (0..len).step_by(QUERY_BLOCK) {
        let rows = (len - first).min(QUERY_BLOCK);
        // Positions ascend, so the block's windows span [lo of its first, hi of its last).
        let (lo, _) = window_of(first);
        let (_, hi) = window_of(first + rows - 1);
        let width = (hi - lo).div_ceil(KEY_GRAIN) * KEY_GRAIN;
        scratch.scores.clear();
        scratch.scores.resize(QUERY_BLOCK * width, 0.0);
        let q = &head.q[first * d..(first + rows) * d];
        simd_f32::scores(
            q,
            rows,
            d,
            &scratch.kt,
            stride,
            lo,
            width,
            &mut scratch.scores,
        );
        for r in 0..rows {
            let (own_lo, own_hi) = window_of(first + r);
            let s = &mut scratch.scores[r * width..(r + 1) * width];
            let own = &mut s[own_lo - lo..own_hi - lo];
            let mut max = f32::NEG_INFINITY;
            for v in own.iter_mut() {
                *v *= scale;
                max = max.max(*v);
            }
            for v in own.iter_mut() {
                *v = exp(*v - max);
            }
            let total = math::sum(own);
            for v in own.iter_mut() {
                *v /= total;
            }
            let o = &mut out[(first + r) * d..(first + r + 1) * d];
            o.iter_mut().for_each(|x| *x = 0.0);
            simd_f32::weighted_sum(own, &head.v[own_lo * d..own_hi * d], d, o);
        }
    }
}
