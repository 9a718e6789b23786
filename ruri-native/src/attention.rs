//! Eager attention of one text, head by head, in blocks of queries: `softmax(q·kᵀ / √d) · v`
//! with keys limited to `|pᵢ − pⱼ| ≤ window`, in f32 (transformers upcasts there too).
//!
//! The order of every sum is fixed and independent of the vector width: a score is summed
//! over `d` one term after another (the SIMD lanes are different keys), the softmax total in
//! [`crate::math::sum`]'s lanes over the query's own keys, and the output over keys one after
//! another (the lanes are different channels). So the hot loops may be compiled for AVX2 or
//! AVX-512, or register-blocked by hand (`crate::kernels::simd_f32`), without changing a
//! bit: no instruction fuses a multiply and an add, and nothing is reassociated. A block of
//! queries sums over the union of their windows, with zero probabilities outside each
//! query's own (a zero term changes no sum). Nothing `len × len` is held: a block's scores
//! are `QUERY_BLOCK × keys in its windows`.

use crate::kernels::simd_f32;

/// Queries whose scores are computed together: each chunk of keys is loaded once for all,
/// and a block's scores (`QUERY_BLOCK × keys in its windows`) stay in L2 on long texts.
pub(crate) const QUERY_BLOCK: usize = 16;
/// Scores are computed in groups of this many keys (one AVX-512 vector).
const KEY_GRAIN: usize = simd_f32::KEY_GROUP;

/// One head of one text, read in place: row `j` of `q`, `k` and `v` (q already rotated, k
/// too) is `d` values at `j · stride` (Wqkv's output rows, each slice starting at the head's
/// first column).
pub(crate) struct Head<'a> {
    pub(crate) q: &'a [f32],
    pub(crate) k: &'a [f32],
    pub(crate) v: &'a [f32],
    pub(crate) stride: usize,
    pub(crate) d: usize,
}

/// Buffers of [`attend_head`] and its caller, kept between heads and layers.
#[derive(Debug, Default)]
pub(crate) struct AttentionScratch {
    kt: Vec<f32>,
    v: Vec<f32>,
    scores: Vec<f32>,
}

/// Attention of one head over `positions` (ascending), into `out`: row `i` is `d` values
/// at `i · out_stride` (the head's columns of the context rows, written in place).
pub(crate) fn attend_head(
    head: &Head<'_>,
    positions: &[u32],
    window: usize,
    scale: f32,
    scratch: &mut AttentionScratch,
    out: &mut [f32],
    out_stride: usize,
) {
    let (len, d, stride) = (positions.len(), head.d, head.stride);
    // Keys transposed in groups of KEY_GRAIN (`[group][channel][key]`, zero-padded): the
    // score loop runs along a group's keys, and a group is one contiguous `d × KEY_GRAIN`
    // block, read front to back.
    let groups = len.div_ceil(KEY_GRAIN);
    // Every lane of a real key is written below and the padding lanes of the last group
    // zeroed, so the buffer is only grown, never cleared (with the scores' buffer below:
    // `attend_head` 2.8 → 1.6 % and memset 1.5 → 0.9 % of a Zen 4 profile; too little for an
    // A/B on a shared machine to resolve).
    let kt_len = groups * d * KEY_GRAIN;
    if scratch.kt.len() < kt_len {
        scratch.kt.resize(kt_len, 0.0);
    }
    let kt = &mut scratch.kt[..kt_len];
    simd_f32::transpose_keys(head.k, stride, len, d, kt);
    let kt = &*kt;
    // Values are read again by every block of queries, so they are copied into rows of their
    // own first, unless they are already (read in place, rows 3·h apart, a 2,308-token text
    // took 1.2× as long: its re-reads of the values missed the caches). q is read once per
    // row and k once, to transpose it: both in place.
    let v = if stride == d {
        head.v
    } else {
        scratch.v.clear();
        for j in 0..len {
            scratch
                .v
                .extend_from_slice(&head.v[j * stride..j * stride + d]);
        }
        &scratch.v
    };
    // A text within the window (every text of up to `window` + 1 positions): every query
    // sees every key, and no search is needed.
    let whole = match (positions.first(), positions.last()) {
        (Some(&first), Some(&last)) => last.saturating_sub(first) as usize <= window,
        _ => true,
    };
    let window_of = |i: usize| {
        if whole {
            return (0, len);
        }
        let pi = positions[i] as usize;
        let lo = positions.partition_point(|&p| pi.saturating_sub(p as usize) > window);
        let hi = positions.partition_point(|&p| (p as usize) <= pi.saturating_add(window));
        (lo, hi)
    };
    let mut first = 0;
    while first < len {
        let rows = (len - first).min(QUERY_BLOCK);
        // Positions ascend, so the block's windows span [lo of its first, hi of its last);
        // its scores start at a whole group (the extra keys get probability zero).
        let (lo, _) = window_of(first);
        let lo = lo / KEY_GRAIN * KEY_GRAIN;
        let (_, hi) = window_of(first + rows - 1);
        let width = (hi - lo).div_ceil(KEY_GRAIN) * KEY_GRAIN;
        // `scores` writes every one of the block's `rows × width` values: grown, not cleared.
        if scratch.scores.len() < rows * width {
            scratch.scores.resize(rows * width, 0.0);
        }
        let scores = &mut scratch.scores[..rows * width];
        let q = &head.q[first * stride..];
        simd_f32::scores(
            q,
            stride,
            rows,
            d,
            kt,
            lo / KEY_GRAIN,
            width / KEY_GRAIN,
            scores,
        );
        // Zero outside each query's own keys: the block's weighted sum runs over the union
        // [lo, hi), and a zero term changes no sum.
        let mut own = [(0, 0); QUERY_BLOCK];
        for (r, o) in own[..rows].iter_mut().enumerate() {
            let (own_lo, own_hi) = window_of(first + r);
            *o = (own_lo - lo, own_hi - lo);
        }
        simd_f32::softmax_rows(scores, width, &own[..rows], scale);
        let o = &mut out[first * out_stride..];
        for r in 0..rows {
            o[r * out_stride..r * out_stride + d].fill(0.0);
        }
        simd_f32::weighted_sum_rows(
            scores,
            rows,
            width,
            &v[lo * d..],
            d,
            hi - lo,
            d,
            o,
            out_stride,
        );
        first += rows;
    }
}
