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
//! are `QUERY_BLOCK × keys in its windows`. A short text within the window computes the
//! same sums on its scores transposed (a column per query), which spares its softmax the
//! sums and maxima across a vector's lanes ([`attend_head`] chooses; the bits are the same).
//!
//! With [`crate::AttentionPrecision::Bf16`] every text takes the same blocks with the
//! arithmetic of `crate::kernels::bf16` instead ([`attend_bf16`]).

use crate::kernels::aligned::Aligned;
use crate::kernels::bf16;
use crate::kernels::int13;
use crate::kernels::simd_f32;

/// How a head's two products are computed: [`crate::AttentionPrecision`], and for bf16 and
/// int13 where their products run (the same bits anywhere).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arithmetic {
    F32,
    Bf16(bf16::Products),
    Int13(int13::Products),
}

/// Queries whose scores are computed together: each chunk of keys is loaded once for all,
/// and a block's scores (`QUERY_BLOCK × keys in its windows`) stay in L2 on long texts.
pub(crate) const QUERY_BLOCK: usize = 16;
/// Queries of a block of bf16 attention on FMA tiles over a whole text (every query sees
/// every key): each block widens its keys and values to f32 once for all its queries, and
/// twice [`QUERY_BLOCK`] halves that work per query (BENCHMARKS.md, eighteenth step).
pub(crate) const WIDE_BLOCK: usize = 2 * QUERY_BLOCK;
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
    kt: Aligned<f32>,
    v: Aligned<f32>,
    scores: Aligned<f32>,
    /// bf16 attention's packed keys, values and queries, its softmax weights, and each
    /// row's `1 / total` (`kernels::bf16`).
    kt16: Aligned<u32>,
    v16: Aligned<u32>,
    /// The FMA tiles' widened operands, kept from call to call (`kernels::bf16::Widened`).
    widened: bf16::Widened,
    q16: Vec<u32>,
    p16: Aligned<u16>,
    inv: [f32; WIDE_BLOCK],
    /// int13 attention's scales (queries, keys, values) and a block's exact weighted sums
    /// (`kernels::int13`); its packed operands are kt16, v16 and q16's.
    q_scales: Vec<f32>,
    k_scales: Aligned<f32>,
    v_scales: Vec<f32>,
    sums: Vec<i64>,
}

/// Texts of at most this many positions, all within the window of each other, take
/// [`attend_columns`]; longer ones the blocks of rows (measured on texts of up to 48
/// positions; the long texts' tuning was done with rows).
const COLUMNS_MAX_LEN: usize = 256;

const _: () = assert!(
    QUERY_BLOCK == KEY_GRAIN,
    "a block of queries is one group of lanes"
);

/// Attention of one head over `positions` (ascending), into `out`: row `i` is `d` values
/// at `i · out_stride` (the head's columns of the context rows, written in place).
///
/// `arithmetic`: f32, or bf16's or int13's products where they run (every text then takes
/// [`attend_bf16`] or [`attend_int13`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_head(
    head: &Head<'_>,
    positions: &[u32],
    window: usize,
    scale: f32,
    arithmetic: Arithmetic,
    scratch: &mut AttentionScratch,
    out: &mut [f32],
    out_stride: usize,
) {
    if let Arithmetic::Bf16(products) = arithmetic {
        attend_bf16(
            head, positions, window, scale, products, scratch, out, out_stride,
        );
    } else if let Arithmetic::Int13(products) = arithmetic {
        attend_int13(
            head, positions, window, scale, products, scratch, out, out_stride,
        );
    } else if positions.len() <= COLUMNS_MAX_LEN && within_window(positions, window) {
        attend_columns(head, positions.len(), scale, scratch, out, out_stride);
    } else {
        attend_rows(head, positions, window, scale, scratch, out, out_stride);
    }
}

/// Whether every position sees every other (`positions` ascending).
fn within_window(positions: &[u32], window: usize) -> bool {
    match (positions.first(), positions.last()) {
        (Some(&first), Some(&last)) => last.saturating_sub(first) as usize <= window,
        _ => true,
    }
}

/// [`attend_rows`] for a text whose queries all see all its `len` keys, with the same bits,
/// on the scores transposed: for each block of queries, `scores[j][i]` is key `j` against
/// query `i` of the block ([`simd_f32::scores`] with the keys as its rows and the block's
/// queries transposed into one group of lanes), so that the softmax runs down the columns
/// ([`simd_f32::softmax_columns`]: every lane a query, no max or sum across lanes, which a
/// short row's softmax spent most of its time on) and the weighted sums read the
/// probabilities by column. Each score, total and output is the same sum in the same order
/// as in rows.
fn attend_columns(
    head: &Head<'_>,
    len: usize,
    scale: f32,
    scratch: &mut AttentionScratch,
    out: &mut [f32],
    out_stride: usize,
) {
    let (d, stride) = (head.d, head.stride);
    // The block's queries transposed (`kt`'s buffer: no keys are transposed here), and its
    // `len × KEY_GRAIN` scores: every value is written before it is read, so both buffers
    // are only grown.
    if scratch.kt.len() < d * KEY_GRAIN {
        scratch.kt.resize(d * KEY_GRAIN, 0.0);
    }
    if scratch.scores.len() < len * KEY_GRAIN {
        scratch.scores.resize(len * KEY_GRAIN, 0.0);
    }
    let qt = &mut scratch.kt[..d * KEY_GRAIN];
    let scores = &mut scratch.scores[..len * KEY_GRAIN];
    let mut first = 0;
    while first < len {
        let rows = (len - first).min(QUERY_BLOCK);
        simd_f32::transpose_keys(&head.q[first * stride..], stride, rows, d, qt);
        simd_f32::scores(head.k, stride, len, d, qt, 0, 1, scores);
        simd_f32::softmax_columns(scores, len, scale);
        let o = &mut out[first * out_stride..];
        for r in 0..rows {
            o[r * out_stride..r * out_stride + d].fill(0.0);
        }
        // The values read in place: a short text's rows stay in the caches.
        simd_f32::weighted_sum_rows(
            scores, rows, 1, KEY_GRAIN, head.v, stride, len, d, o, out_stride,
        );
        first += rows;
    }
}

/// Attention of one head in blocks of queries, each over the keys in its queries' windows.
fn attend_rows(
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
        scratch.v.resize(len * d, 0.0);
        for (j, row) in scratch.v.chunks_exact_mut(d.max(1)).enumerate() {
            row.copy_from_slice(&head.v[j * stride..j * stride + d]);
        }
        &scratch.v[..]
    };
    for_each_block(positions, window, QUERY_BLOCK, |b| {
        let (first, rows, lo, hi, width) = (b.first, b.rows, b.lo, b.hi, b.width);
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
        simd_f32::softmax_rows(scores, width, &b.own[..rows], scale);
        let o = &mut out[first * out_stride..];
        for r in 0..rows {
            o[r * out_stride..r * out_stride + d].fill(0.0);
        }
        simd_f32::weighted_sum_rows(
            scores,
            rows,
            width,
            1,
            &v[lo * d..],
            d,
            hi - lo,
            d,
            o,
            out_stride,
        );
    });
}

/// A block of queries and the keys it runs over.
struct Block {
    /// Its first query and how many (at most [`QUERY_BLOCK`], or [`WIDE_BLOCK`]).
    first: usize,
    rows: usize,
    /// The union of its queries' windows, `[lo, hi)`, `lo` rounded down to a whole group of
    /// [`KEY_GRAIN`] keys (the extra keys get probability zero) and `width` the keys from
    /// `lo` on, rounded up to whole groups.
    lo: usize,
    hi: usize,
    width: usize,
    /// Each query's own keys, from `lo`.
    own: [(usize, usize); WIDE_BLOCK],
}

/// Calls `f` on each block of `block` queries (at most [`WIDE_BLOCK`]) of a text
/// (`positions` ascending) in order.
fn for_each_block(positions: &[u32], window: usize, block: usize, mut f: impl FnMut(&Block)) {
    assert!((1..=WIDE_BLOCK).contains(&block));
    let len = positions.len();
    // A text within the window (every text of up to `window` + 1 positions): every query
    // sees every key, and no search is needed.
    let whole = within_window(positions, window);
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
        let rows = (len - first).min(block);
        // Positions ascend, so the block's windows span [lo of its first, hi of its last).
        let (lo, _) = window_of(first);
        let lo = lo / KEY_GRAIN * KEY_GRAIN;
        let (_, hi) = window_of(first + rows - 1);
        let width = (hi - lo).div_ceil(KEY_GRAIN) * KEY_GRAIN;
        let mut own = [(0, 0); WIDE_BLOCK];
        for (r, o) in own[..rows].iter_mut().enumerate() {
            let (own_lo, own_hi) = window_of(first + r);
            *o = (own_lo - lo, own_hi - lo);
        }
        f(&Block {
            first,
            rows,
            lo,
            hi,
            width,
            own,
        });
        first += rows;
    }
}

/// [`crate::AttentionPrecision::Bf16`]'s attention of one head (`kernels::bf16` defines the
/// arithmetic), in the blocks of [`attend_rows`], for texts of every length: q, k, v packed
/// as bfloat16 pairs, the softmax's weights as bfloat16, the two products by `products`, the
/// outputs normalized last.
#[allow(clippy::too_many_arguments)]
fn attend_bf16(
    head: &Head<'_>,
    positions: &[u32],
    window: usize,
    scale: f32,
    products: bf16::Products,
    scratch: &mut AttentionScratch,
    out: &mut [f32],
    out_stride: usize,
) {
    let (len, d, stride) = (positions.len(), head.d, head.stride);
    let AttentionScratch {
        kt16,
        v16,
        widened,
        q16,
        p16,
        scores,
        inv,
        ..
    } = scratch;
    bf16::pack_keys(head.k, stride, len, d, kt16);
    bf16::pack_values(head.v, stride, len, d, v16);
    let head_operands = products.head(kt16, v16, len);
    let half = d / 2;
    let whole = within_window(positions, window);
    // Every row's bits are the same in any block (its sums run over its own keys, in order,
    // and a call that gives way to other tiles gives way for all its rows with the same
    // bits).
    let block = if whole && products.widens() {
        WIDE_BLOCK
    } else {
        QUERY_BLOCK
    };
    q16.resize(block * half, 0);
    for_each_block(positions, window, block, |b| {
        let (first, rows, lo, hi, width) = (b.first, b.rows, b.lo, b.hi, b.width);
        // Every value of the block's scores and probabilities is written before it is read:
        // grown, not cleared.
        if scores.len() < rows * width {
            scores.resize(rows * width, 0.0);
        }
        if p16.len() < rows * width {
            p16.resize(rows * width, 0);
        }
        let s = &mut scores[..rows * width];
        let p = &mut p16[..rows * width];
        bf16::pack_queries(&head.q[first * stride..], stride, rows, d, q16);
        let groups = width / bf16::LANES;
        // A text within the window: every query's own keys are the text's (from `lo` = 0),
        // so the tiles fold each row's max as they compute its scores.
        let mut maxes = [f32::NEG_INFINITY; WIDE_BLOCK];
        let row_max = whole.then_some((&mut maxes[..rows], len));
        let keys = (lo / bf16::LANES, groups);
        products.scores(q16, rows, d, &head_operands, keys, (s, widened), row_max);
        let maxes = whole.then_some(&maxes[..rows]);
        bf16::softmax(products, s, width, &b.own[..rows], scale, maxes, p, inv);
        // Key pairs from `lo` (even) to `hi`, the last one completed by a zero weight.
        let pairs = (hi - lo).div_ceil(2);
        let o = &mut out[first * out_stride..];
        let values = (lo / 2, pairs);
        let o_rows = (&mut *o, out_stride);
        products.weighted_sum(p, rows, width, &head_operands, values, d, o_rows, widened);
        // Normalized at the end.
        for (r, &inv) in inv[..rows].iter().enumerate() {
            for x in &mut o[r * out_stride..r * out_stride + d] {
                *x *= inv;
            }
        }
    });
}

/// [`crate::AttentionPrecision::Int13`]'s attention of one head (`kernels::int13` defines
/// the arithmetic), in the blocks of [`attend_rows`], for texts of every length: q, k and v
/// quantized and packed as 16-bit pairs, the softmax's weights as integers, the two
/// products by `products`, the outputs scaled and normalized last.
#[allow(clippy::too_many_arguments)]
fn attend_int13(
    head: &Head<'_>,
    positions: &[u32],
    window: usize,
    scale: f32,
    products: int13::Products,
    scratch: &mut AttentionScratch,
    out: &mut [f32],
    out_stride: usize,
) {
    let (len, d, stride) = (positions.len(), head.d, head.stride);
    let AttentionScratch {
        kt16,
        v16,
        q16,
        p16,
        scores,
        inv,
        q_scales,
        k_scales,
        v_scales,
        sums,
        ..
    } = scratch;
    int13::pack_keys(head.k, stride, len, d, kt16, k_scales);
    int13::pack_values(head.v, stride, len, d, v16, v_scales);
    let whole = within_window(positions, window);
    // Every row's bits are the same in any block (its sums are exact integers over its own
    // keys); a text within the window takes 32 queries a block, which read the keys and
    // values half as often.
    let block = if whole { WIDE_BLOCK } else { QUERY_BLOCK };
    if sums.len() < block * d {
        sums.resize(block * d, 0);
    }
    for_each_block(positions, window, block, |b| {
        let (first, rows, lo, hi, width) = (b.first, b.rows, b.lo, b.hi, b.width);
        // Every value of the block's scores and weights is written before it is read:
        // grown, not cleared.
        if scores.len() < rows * width {
            scores.resize(rows * width, 0.0);
        }
        if p16.len() < rows * width {
            p16.resize(rows * width, 0);
        }
        let s = &mut scores[..rows * width];
        let p = &mut p16[..rows * width];
        int13::pack_queries(&head.q[first * stride..], stride, rows, d, q16, q_scales);
        let groups = width / bf16::LANES;
        let (queries, keys) = ((&q16[..], &q_scales[..]), (&kt16[..], &k_scales[..]));
        // A text within the window: every query's own keys are the text's (from `lo` = 0),
        // so the tiles fold each row's max as they compute its scores.
        let mut maxes = [f32::NEG_INFINITY; WIDE_BLOCK];
        let row_max = whole.then_some((&mut maxes[..rows], len));
        let range = (lo / bf16::LANES, groups);
        products.scores(queries, rows, d, keys, range, s, row_max);
        let maxes = whole.then_some(&maxes[..rows]);
        bf16::softmax_int13(products, s, width, &b.own[..rows], scale, maxes, p, inv);
        // Key pairs from `lo` (even) to `hi`, the last one completed by a zero weight.
        let pairs = (hi - lo).div_ceil(2);
        let sums = &mut sums[..rows * d];
        let finish = int13::Finish {
            scales: v_scales,
            inv: &inv[..rows],
            out: &mut out[first * out_stride..],
            out_stride,
        };
        products.weighted_average(p, rows, width, v16, (lo / 2, pairs), d, sums, finish);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::bf16::tests::values;
    use proptest::prelude::*;

    /// What the outputs' buffers start with, outside every value [`values`] makes and
    /// every weighted average of them (the spreads here are at most 40): a column that still
    /// holds it was not written. (7.5 was in the range: a one-hot attention copied a value of
    /// exactly 7.5 and failed the check, once in CI.)
    const UNWRITTEN: f32 = 1000.5;

    /// A head read in place from rows of `3 · h` values (q, k, v side by side, as in Wqkv's
    /// output), with the head's columns at `offset`.
    fn attend(
        qkv: &[f32],
        h: usize,
        offset: usize,
        d: usize,
        len: usize,
        columns: bool,
    ) -> Vec<f32> {
        let head = Head {
            q: &qkv[offset..],
            k: &qkv[h + offset..],
            v: &qkv[2 * h + offset..],
            stride: 3 * h,
            d,
        };
        let positions: Vec<u32> = (0..len as u32).collect();
        // Out rows of `h`, the head's columns at `offset`; the other columns must stay.
        let mut out = vec![UNWRITTEN; len * h];
        let mut scratch = AttentionScratch::default();
        let out_part = &mut out[offset..];
        if columns {
            attend_columns(&head, len, 0.125, &mut scratch, out_part, h);
        } else {
            attend_rows(&head, &positions, len, 0.125, &mut scratch, out_part, h);
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Texts within the window: the transposed scores give the rows' bits, on every
        /// length around the blocks' edges, with heads whose width is a multiple of the
        /// AVX-512 tiles' and one that is not (the portable loops).
        #[test]
        fn columns_give_the_bits_of_rows(
            len in prop_oneof![1usize..=40, Just(47usize), Just(129usize), Just(256usize)],
            d in prop_oneof![Just(64usize), Just(32usize), Just(24usize)],
            seed in any::<u64>(),
            sharp in prop_oneof![Just(1.0f32), Just(40.0f32)],
        ) {
            let h = 2 * d + 16;
            let qkv = values(seed, len * 3 * h, sharp);
            for offset in [0, d] {
                let rows = attend(&qkv, h, offset, d, len, false);
                let columns = attend(&qkv, h, offset, d, len, true);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&columns), bits(&rows), "len {} d {} offset {}", len, d, offset);
                // The head's columns were written, the others kept.
                for row in columns.chunks_exact(h) {
                    prop_assert!(row[..offset].iter().chain(&row[offset + d..]).all(|&x| x == UNWRITTEN));
                    prop_assert!(row[offset..offset + d].iter().all(|&x| x != UNWRITTEN && x.is_finite()));
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// bf16 attention: the same bits from the portable loops and from each set of tiles
        /// this CPU runs (`vdpbf16ps`, FMA), on texts within and beyond the window, with gaps in the
        /// positions (a packed text's positions need not be consecutive), heads of widths
        /// the tiles take and one they do not; and every output finite, the other columns
        /// kept.
        #[test]
        fn bf16_products_give_the_same_bits_everywhere(
            len in prop_oneof![1usize..=40, Just(97usize), Just(300usize)],
            d in prop_oneof![Just(64usize), Just(16usize), Just(24usize)],
            window in prop_oneof![Just(8usize), Just(64usize), Just(usize::MAX / 2)],
            gaps in any::<bool>(),
            seed in any::<u64>(),
            sharp in prop_oneof![Just(1.0f32), Just(6.0f32)],
        ) {
            let h = 2 * d + 16;
            // Mild scores (weights near the max: the FMA tiles take the weighted sums of 128
            // keys and more) and sharp ones (weights far below it: they may give them up);
            // values of
            // magnitudes 2⁻¹⁰ to 2¹⁰, so that the sums round and their order shows.
            let mut qkv = values(seed, len * 3 * h, sharp);
            for (i, x) in qkv.iter_mut().enumerate().filter(|(i, _)| i % (3 * h) >= 2 * h) {
                *x *= 2f32.powi((i * 7 % 21) as i32 - 10);
            }
            let positions: Vec<u32> = (0..len as u32)
                .map(|i| if gaps { i * 3 + i % 2 } else { i })
                .collect();
            let run = |products: bf16::Products| {
                let head = Head {
                    q: &qkv[d..],
                    k: &qkv[h + d..],
                    v: &qkv[2 * h + d..],
                    stride: 3 * h,
                    d,
                };
                let mut out = vec![UNWRITTEN; len * h];
                let mut scratch = AttentionScratch::default();
                attend_head(
                    &head,
                    &positions,
                    window,
                    0.125,
                    Arithmetic::Bf16(products),
                    &mut scratch,
                    &mut out[d..],
                    h,
                );
                out
            };
            let portable = run(bf16::Products::Portable);
            for row in portable.chunks_exact(h) {
                prop_assert!(row[..d].iter().chain(&row[2 * d..]).all(|&x| x == UNWRITTEN));
                prop_assert!(row[d..2 * d].iter().all(|x| x.is_finite()));
            }
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for products in bf16::Products::all().into_iter().skip(1) {
                let tiles = run(products);
                prop_assert_eq!(bits(&tiles), bits(&portable), "{:?}", products);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// int13 attention: the same bits from the portable loops and from the tiles this
        /// CPU runs (scores, softmax and weighted sums), on texts within and beyond the
        /// window, with gaps in the positions, heads of widths the tiles take and ones
        /// they do not (past the tiles' i32 scores too); every output finite and near f32
        /// attention's, the other columns kept.
        #[test]
        fn int13_products_give_the_same_bits_everywhere(
            len in prop_oneof![1usize..=40, Just(97usize), Just(300usize)],
            d in prop_oneof![Just(64usize), Just(16usize), Just(24usize), Just(160usize)],
            window in prop_oneof![Just(8usize), Just(64usize), Just(usize::MAX / 2)],
            gaps in any::<bool>(),
            seed in any::<u64>(),
            sharp in prop_oneof![Just(1.0f32), Just(6.0f32)],
        ) {
            let h = 2 * d + 16;
            let qkv = values(seed, len * 3 * h, sharp);
            let positions: Vec<u32> = (0..len as u32)
                .map(|i| if gaps { i * 3 + i % 2 } else { i })
                .collect();
            let run = |arithmetic: Arithmetic| {
                let head = Head {
                    q: &qkv[d..],
                    k: &qkv[h + d..],
                    v: &qkv[2 * h + d..],
                    stride: 3 * h,
                    d,
                };
                let mut out = vec![UNWRITTEN; len * h];
                let mut scratch = AttentionScratch::default();
                attend_head(&head, &positions, window, 0.125, arithmetic, &mut scratch, &mut out[d..], h);
                out
            };
            let portable = run(Arithmetic::Int13(int13::Products::Portable));
            let exact = run(Arithmetic::F32);
            for (row, f32_row) in portable.chunks_exact(h).zip(exact.chunks_exact(h)) {
                prop_assert!(row[..d].iter().chain(&row[2 * d..]).all(|&x| x == UNWRITTEN));
                prop_assert!(row[d..2 * d].iter().all(|x| x.is_finite()));
                // Each output is a weighted average of values within ±sharp/2: the 13-bit
                // operands keep it within 2 % of the row's largest output (or of 1).
                let spread = f32_row[d..2 * d].iter().fold(1.0f32, |m, x| m.max(x.abs()));
                for (a, b) in row[d..2 * d].iter().zip(&f32_row[d..2 * d]) {
                    prop_assert!((a - b).abs() <= 0.02 * spread, "{} against f32 {}", a, b);
                }
            }
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for products in int13::Products::all().into_iter().skip(1) {
                let tiles = run(Arithmetic::Int13(products));
                prop_assert_eq!(bits(&tiles), bits(&portable), "{:?}", products);
            }
        }
    }

    #[test]
    fn short_texts_within_the_window_take_the_columns() {
        assert!(within_window(&[3, 10, 131], 128));
        assert!(!within_window(&[3, 10, 132], 128));
        assert!(within_window(&[], 0));
    }
}
