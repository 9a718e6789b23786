//! AVX-512 BF16 tiles of bf16 attention's two products ([`super::bf16`] defines them):
//! `vdpbf16ps` adds two products of bfloat16 pairs to each f32 lane, the odd pair's first,
//! each product exact and each sum rounded once and flushed, which is [`super::bf16::dot_pair`]
//! (measured bit for bit on Zen 4 by `tools/spike/bf16-dot`; the SDM's pseudo-code says so).
//! Also the softmax's exps and weights ([`softmax_blocks`]): the same IEEE steps, with
//! `vrndscaleps`, `vscalefps` and `vcvtne2ps2bf16` in place of the portable code's integer
//! steps (its rounding by the 1.5 · 2²³ addition, its 2ⁿ from exponent bits, its rounding
//! to bfloat16 in integers and narrowing stores): fewer instructions, the same bits
//! (BENCHMARKS.md, sixteenth step).
//! A CPU whose instructions disagreed would change the bits, so [`available`] runs the tiles
//! against the portable code once, on operands that tell the orders, the flushing and the
//! rounding apart, and uses them only if every bit agrees.
//!
//! And the two products again with AVX-512F's FMA ([`fma_scores`], [`fma_weighted_sum`]),
//! for CPUs where `vdpbf16ps` is slower than FMA (the Intel Xeon measured: half FMA's
//! multiply-adds a cycle) or missing (AVX-512 CPUs before Cooper Lake): the same bits
//! wherever the operands of a call are not too small together (then no sum can be subnormal,
//! and FMA's one rounding is `dot_pair`'s; the proof is above [`fma_available`]); other calls
//! give way to the `vdpbf16ps` tiles or the portable loops.
//!
//! Each public function checks that the CPU has the instructions (not [`available`], whose
//! check runs them) and that every buffer holds what its loops read or write; the `unsafe`
//! blocks rely on nothing else.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::bf16::{FMA_MIN_EXPONENTS, LANES, Widened, min_exponent, scores_fit, weighted_sum_fits};

/// Query rows per tile of scores and of weighted sums.
const MR: usize = 4;
/// Vectors of keys (scores) or channels (weighted sum) per tile.
const NV: usize = 4;
/// Key pairs of values per pass of the weighted sum: `PAIR_CHUNK × d` packed pairs stay in
/// L1 while every tile of rows goes over them.
const PAIR_CHUNK: usize = 32;

/// Whether this CPU has AVX-512 BF16 and its `vdpbf16ps` gives the portable code's bits
/// (checked once per process).
pub(crate) fn available() -> bool {
    static AGREES: OnceLock<bool> = OnceLock::new();
    *AGREES.get_or_init(|| has_instructions() && agrees_with_portable())
}

/// Scores, weighted sums and the softmax's blocks of the tiles against [`super::bf16`]'s:
/// the products on operands in the normal range and near underflow (subnormal sums,
/// products below f32's range), the softmax on random scores and on [`SOFTMAX_EDGES`]:
/// every bit.
fn agrees_with_portable() -> bool {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    // Packed pairs of random sign and mantissa, biased exponents in `lo..lo + span`.
    let mut pairs = |n: usize, lo: u64, span: u64| -> Vec<u32> {
        (0..n)
            .map(|_| {
                let mut half = || {
                    let r = next();
                    let exp = (lo + r % span) as u32;
                    (((r >> 8) & 1) as u32) << 15 | exp << 7 | ((r >> 16) & 0x7f) as u32
                };
                half() | (half() << 16)
            })
            .collect()
    };
    let (rows, d, groups) = (MR + 1, 64, NV + 1);
    let len = groups * LANES;
    for (lo, span) in [(115, 25), (1, 100)] {
        let q = pairs(rows * d / 2, lo, span);
        let kt = pairs(groups * d / 2 * LANES, lo, span);
        let v = pairs(len / 2 * d, lo, span);
        let (mut tiles, mut portable) = (vec![0.0; rows * len], vec![0.0; rows * len]);
        scores(&q, rows, d, &kt, 0, groups, &mut tiles, None);
        super::bf16::scores_portable(&q, rows, d, &kt, 0, groups, &mut portable);
        let p: Vec<u16> = pairs(rows * len / 2, lo, span)
            .into_iter()
            .flat_map(|x| [x as u16, (x >> 16) as u16])
            .collect();
        let (mut w_tiles, mut w_portable) = (vec![0.0; rows * d], vec![0.0; rows * d]);
        weighted_sum(&p, rows, len, &v, len / 2, d, &mut w_tiles, d);
        super::bf16::weighted_sum_portable(&p, rows, len, &v, len / 2, d, &mut w_portable, d);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        if bits(&tiles) != bits(&portable) || bits(&w_tiles) != bits(&w_portable) {
            return false;
        }
    }
    // The softmax's blocks, an odd count: random scores (y from −128 to 0 in steps of 1/32)
    // and the edges.
    let mut scores: Vec<[f32; LANES]> = (0..4)
        .map(|_| std::array::from_fn(|_| (next() % 4096) as f32 / 8.0 - 500.0))
        .collect();
    scores.push(SOFTMAX_EDGES);
    let ((mut w_tiles, mut w_portable), (mut t_tiles, mut t_portable)) = (
        (vec![[0u16; LANES]; 5], vec![[1u16; LANES]; 5]),
        ([0.5f32; LANES], [0.5f32; LANES]),
    );
    softmax_blocks(&scores, &mut w_tiles, (0.25, 3.0), &mut t_tiles);
    super::bf16::softmax_blocks_portable(&scores, &mut w_portable, (0.25, 3.0), &mut t_portable);
    w_tiles == w_portable && t_tiles.map(f32::to_bits) == t_portable.map(f32::to_bits)
}

/// Scores at the softmax's edges for `c = 0.25`, `max = 3` (`y = x/4 − 3`): y = 0 (an exp
/// of 1), the ties −0.5, −1.5, −2.5, −3.5, −4.5 (to even: both ways), the clamp −125.5 and
/// one ulp either side of it, −126, far below, −∞, and a few small steps.
const SOFTMAX_EDGES: [f32; LANES] = [
    12.0,
    10.0,
    6.0,
    2.0,
    -2.0,
    -6.0,
    -490.0,
    -490.0 - 1.0 / 32_768.0,
    -490.0 + 1.0 / 32_768.0,
    -492.0,
    -4000.0,
    f32::NEG_INFINITY,
    11.5,
    11.0,
    0.0,
    -1.0,
];

/// Whether the CPU has the instructions (the tiles' precondition; [`available`] also checks
/// their bits, by running them).
fn has_instructions() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bf16")
}

/// [`super::bf16::Products::scores`] in tiles of [`MR`] queries × [`NV`] groups of keys;
/// with `row_max`, each tile also folds its rows' scores of the first `keys` keys into lanes
/// of maxes, which then fold into `row_max[r]` (a max, which needs no order), so that the
/// softmax need not read them again.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores(
    q: &[u32],
    rows: usize,
    d: usize,
    kt: &[u32],
    g_lo: usize,
    groups: usize,
    out: &mut [f32],
    row_max: Option<(&mut [f32], usize)>,
) {
    assert!(
        has_instructions(),
        "AVX-512 BF16 tiles on a CPU without them"
    );
    let half = d / 2;
    assert!(scores_fit(
        (q.len(), kt.len(), out.len()),
        rows,
        d,
        g_lo,
        groups
    ));
    by_row_lanes(rows, row_max, |r0, n, lanes| {
        // SAFETY: AVX-512F and BF16 (checked above); q's and out's rows r0..r0 + n ≤ rows and
        // kt's groups g_lo..g_lo + groups (`scores_fit`); `lanes` null or 16 f32s a row.
        unsafe {
            scores_tiles(
                q.as_ptr().add(r0 * half),
                n,
                half,
                kt.as_ptr(),
                (g_lo, groups),
                out.as_mut_ptr().add(r0 * groups * LANES),
                lanes,
            )
        }
    });
}

/// Runs `tiles(r0, n, (lanes, keys))` on the rows: without `row_max` once on all of them
/// with a null `lanes`; with it, on blocks of [`ROW_LANES`] rows, each with 16 lanes of maxes
/// a row (at −∞) that then fold into `max[r0..r0 + n]` (a max needs no order, and no
/// reduction across lanes runs in every tile).
pub(super) fn by_row_lanes(
    rows: usize,
    row_max: Option<(&mut [f32], usize)>,
    mut tiles: impl FnMut(usize, usize, (*mut f32, usize)),
) {
    let Some((max, keys)) = row_max else {
        tiles(0, rows, (std::ptr::null_mut(), 0));
        return;
    };
    assert!(max.len() >= rows);
    for r0 in (0..rows).step_by(ROW_LANES) {
        let n = (rows - r0).min(ROW_LANES);
        let mut lanes = [[f32::NEG_INFINITY; LANES]; ROW_LANES];
        tiles(r0, n, (lanes.as_mut_ptr().cast(), keys));
        for (m, lanes) in max[r0..r0 + n].iter_mut().zip(&lanes) {
            *m = lanes.iter().fold(*m, |m, &x| if x > m { x } else { m });
        }
    }
}

/// Rows whose maxes [`scores`] keeps lane by lane at once (a block of queries): attention's
/// widest block, so that the FMA tiles widen a block's keys once for all its queries (16
/// split the 32-query blocks of a long text in two, and widened every key twice:
/// BENCHMARKS.md, twentieth step).
const ROW_LANES: usize = crate::attention::WIDE_BLOCK;

#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_tiles(
    q: *const u32,
    rows: usize,
    half: usize,
    kt: *const u32,
    (g_lo, groups): (usize, usize),
    out: *mut f32,
    (max, keys): (*mut f32, usize),
) {
    let width = groups * LANES;
    let group = half * LANES;
    let mut g0 = 0;
    while g0 < groups {
        let nv = (groups - g0).min(NV);
        let mut r = 0;
        while r < rows {
            let mr = if rows - r >= MR { MR } else { 1 };
            // SAFETY: rows r..r + mr and groups g0..g0 + nv are inside the buffers (the
            // caller's checks, see `scores`); each call reads `half` pairs of its queries and
            // of each of its groups, writes its own scores, and (`m` not null) reads and
            // writes the 16 lanes of maxes of each of its rows (`max` holds 16 · rows).
            unsafe {
                let (qt, k, o) = (
                    q.add(r * half),
                    kt.add((g_lo + g0) * group),
                    out.add(r * width + g0 * LANES),
                );
                let m = if max.is_null() {
                    max
                } else {
                    max.add(r * LANES)
                };
                // The tile's keys that count towards the max.
                let valid = |n: usize| keys.saturating_sub((g0 + n) * LANES);
                match (mr, nv) {
                    (MR, NV) => score_tile::<MR, NV>(qt, half, k, group, o, width, (m, valid(0))),
                    (MR, _) => (0..nv).for_each(|n| {
                        let (k, o) = (k.add(n * group), o.add(n * LANES));
                        score_tile::<MR, 1>(qt, half, k, group, o, width, (m, valid(n)))
                    }),
                    (_, NV) => score_tile::<1, NV>(qt, half, k, group, o, width, (m, valid(0))),
                    _ => (0..nv).for_each(|n| {
                        let (k, o) = (k.add(n * group), o.add(n * LANES));
                        score_tile::<1, 1>(qt, half, k, group, o, width, (m, valid(n)))
                    }),
                }
            }
            r += mr;
        }
        g0 += nv;
    }
}

/// `R` queries (`half` packed pairs each, consecutive) against `N` groups of keys (`group`
/// values apart), each score folded over the pairs in order from +0, stored in rows of
/// `width`; with `max` not null, each row's scores of its first `valid` keys folded lane by
/// lane into the row's 16 lanes at `max + 16·r` (`a > m ? a : m`: a NaN score is left out,
/// as the softmax's own max does).
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
unsafe fn score_tile<const R: usize, const N: usize>(
    q: *const u32,
    half: usize,
    kt: *const u32,
    group: usize,
    out: *mut f32,
    width: usize,
    (max, valid): (*mut f32, usize),
) {
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    for c in 0..half {
        // SAFETY: c < half: pair c of each of the tile's groups and queries (see the caller).
        unsafe {
            let mut k = [_mm512_setzero_si512(); N];
            for (n, k) in k.iter_mut().enumerate() {
                *k = _mm512_loadu_si512(kt.add(n * group + c * LANES).cast());
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let qv = bh(_mm512_set1_epi32(*q.add(r * half + c) as i32));
                for (a, &k) in acc.iter_mut().zip(&k) {
                    *a = _mm512_dpbf16_ps(*a, qv, bh(k));
                }
            }
        }
    }
    // SAFETY: the tile's scores and maxes (see the caller).
    unsafe { store_scores(&acc, out, width, (max, valid)) }
}

/// A tile's scores stored in rows of `width` at `out`; with `max` not null, each row's scores
/// of its first `valid` keys folded lane by lane into the row's 16 lanes at `max + 16·r`
/// (`a > m ? a : m`: a NaN score is left out, as the softmax's own max does).
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn store_scores<const R: usize, const N: usize>(
    acc: &[[__m512; N]; R],
    out: *mut f32,
    width: usize,
    (max, valid): (*mut f32, usize),
) {
    for (r, acc) in acc.iter().enumerate() {
        for (n, &a) in acc.iter().enumerate() {
            // SAFETY: score row r, keys 16·n..16·n + 16 of the tile's groups (see the caller).
            unsafe { _mm512_storeu_ps(out.add(r * width + n * LANES), a) };
        }
    }
    if max.is_null() {
        return;
    }
    for (r, acc) in acc.iter().enumerate() {
        // SAFETY: the 16 lanes of row r of the tile's maxes (see the caller).
        let (slot, mut lanes) = unsafe {
            let slot = max.add(r * LANES);
            (slot, _mm512_loadu_ps(slot))
        };
        for (n, &a) in acc.iter().enumerate() {
            let count = valid.saturating_sub(n * LANES).min(LANES);
            let mask = ((1u32 << count) - 1) as __mmask16;
            // max(a, lanes) is `a > lanes ? a : lanes`: a NaN score keeps the lane.
            lanes = _mm512_mask_max_ps(lanes, mask, a, lanes);
        }
        // SAFETY: as above.
        unsafe { _mm512_storeu_ps(slot, lanes) };
    }
}

/// The softmax's blocks of own keys ([`super::bf16`]'s `softmax`, the blocks with no other
/// keys): lane `i` of each block in turn, `e = exp2_nonpositive(x · c − max)` in the same
/// IEEE steps (no fused multiply-add), added to `partial[i]`, and its weight rounded to
/// bfloat16 by `vcvtne2ps2bf16`, two blocks an instruction: to nearest even, as `weight` does
/// for the normal values the exp gives. (A NaN score gives a NaN weight either way, perhaps
/// with other bits, and makes the row's total, so every output of the row, NaN.)
pub(crate) fn softmax_blocks(
    blocks: &[[f32; LANES]],
    weights: &mut [[u16; LANES]],
    (c, max): (f32, f32),
    partial: &mut [f32; LANES],
) {
    assert!(
        has_instructions(),
        "AVX-512 BF16 tiles on a CPU without them"
    );
    assert_eq!(blocks.len(), weights.len());
    // SAFETY: the CPU has AVX-512F and BF16 (checked above); the loop reads blocks[..n] and
    // writes weights[..n], n = blocks.len() = weights.len() (checked above).
    unsafe {
        softmax_tiles(
            blocks.as_ptr().cast(),
            weights.as_mut_ptr().cast(),
            blocks.len(),
            (c, max),
            partial,
        )
    }
}

#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn softmax_tiles(
    x: *const f32,
    w: *mut u16,
    n: usize,
    (c, max): (f32, f32),
    partial: &mut [f32; LANES],
) {
    let cm = (_mm512_set1_ps(c), _mm512_set1_ps(max));
    // SAFETY: `partial` is 16 f32s.
    let mut acc = unsafe { _mm512_loadu_ps(partial.as_ptr()) };
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: blocks i..i + 4 ≤ n.
        let e = unsafe { exps::<4>(x.add(i * LANES), cm, &mut acc) };
        for k in [0, 2] {
            let pair = _mm512_cvtne2ps_pbh(e[k + 1], e[k]);
            // SAFETY: weights of blocks i + k and i + k + 1 < n, 64 bytes.
            unsafe { _mm512_storeu_si512(w.add((i + k) * LANES).cast(), words(pair)) };
        }
        i += 4;
    }
    while i < n {
        // SAFETY: block i < n.
        let [e] = unsafe { exps::<1>(x.add(i * LANES), cm, &mut acc) };
        // SAFETY: weights of block i < n, 32 bytes.
        unsafe { _mm256_storeu_si256(w.add(i * LANES).cast(), words256(_mm512_cvtneps_pbh(e))) };
        i += 1;
    }
    // SAFETY: `partial` is 16 f32s.
    unsafe { _mm512_storeu_ps(partial.as_mut_ptr(), acc) };
}

/// The exps of the `K` blocks of scores at `x`, `2^(x · c − max)` in the portable steps, step
/// by step across the blocks (independent chains side by side), each added to `acc` in
/// block order.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn exps<const K: usize>(
    x: *const f32,
    (c, max): (__m512, __m512),
    acc: &mut __m512,
) -> [__m512; K] {
    let b = super::bf16::EXP2_COEFFICIENTS.map(|b| _mm512_set1_ps(b));
    // SAFETY: the caller's K blocks.
    let x: [__m512; K] = std::array::from_fn(|k| unsafe { _mm512_loadu_ps(x.add(k * LANES)) });
    // `if −125.5 > y { −125.5 } else { y }`: vmaxps(a, b) is `a > b ? a : b`.
    let floor = _mm512_set1_ps(-125.5);
    let y = x.map(|x| _mm512_max_ps(floor, _mm512_sub_ps(_mm512_mul_ps(x, c), max)));
    // n = rint(y), ties to even: the portable `(y + 1.5·2²³) − 1.5·2²³`, exactly.
    let n = y.map(|y| _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(y));
    let f: [__m512; K] = std::array::from_fn(|k| _mm512_sub_ps(y[k], n[k]));
    let mut p = f.map(|f| _mm512_mul_ps(f, b[3]));
    for b in [b[2], b[1], b[0]] {
        p = std::array::from_fn(|k| _mm512_mul_ps(f[k], _mm512_add_ps(b, p[k])));
    }
    // p · 2ⁿ, exact (a normal result: n ≥ −126, and −126 only with p ≥ 1), as the
    // portable product with 2ⁿ from the exponent bits is.
    let one = _mm512_set1_ps(1.0);
    let e: [__m512; K] = std::array::from_fn(|k| _mm512_scalef_ps(_mm512_add_ps(one, p[k]), n[k]));
    for e in e {
        *acc = _mm512_add_ps(*acc, e);
    }
    e
}

/// 32 bfloat16s as the integer vector a store takes (the same bits).
#[inline(always)]
fn words(x: __m512bh) -> __m512i {
    // SAFETY: both are 512 bits of plain data; every bit pattern is a valid value of either.
    unsafe { std::mem::transmute::<__m512bh, __m512i>(x) }
}

/// 16 bfloat16s as the integer vector a store takes (the same bits).
#[inline(always)]
fn words256(x: __m256bh) -> __m256i {
    // SAFETY: both are 256 bits of plain data; every bit pattern is a valid value of either.
    unsafe { std::mem::transmute::<__m256bh, __m256i>(x) }
}

/// A vector of 16 packed pairs as the bfloat16 vector `vdpbf16ps` takes (the same bits).
#[inline(always)]
fn bh(x: __m512i) -> __m512bh {
    // SAFETY: both are 512 bits of plain data; every bit pattern is a valid value of either.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
}

/// [`super::bf16::Products::weighted_sum`] in tiles of [`MR`] rows × [`NV`] vectors of channels (or
/// one vector: `d` must be a multiple of 16), over chunks of [`PAIR_CHUNK`] key pairs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn weighted_sum(
    p: &[u16],
    rows: usize,
    p_row: usize,
    v: &[u32],
    pairs: usize,
    d: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(
        has_instructions(),
        "AVX-512 BF16 tiles on a CPU without them"
    );
    assert!(d.is_multiple_of(LANES));
    let lengths = (p.len(), v.len(), out.len());
    assert!(weighted_sum_fits(
        lengths, rows, p_row, pairs, d, out_stride
    ));
    if rows == 0 || d == 0 {
        return;
    }
    if pairs == 0 {
        for r in 0..rows {
            out[r * out_stride..r * out_stride + d].fill(0.0);
        }
        return;
    }
    // SAFETY: the CPU has AVX-512F and BF16 (checked above). Tile (r, c0, j0) reads
    // p[(r..r + mr) · p_row + 2·j0..][..2·kn] (j0 + kn ≤ pairs), v[(j0..j0 + kn) · d + c0..][..w]
    // (c0 + w ≤ d) and reads and writes out[(r..r + mr) · out_stride + c0..][..w]: inside the
    // sizes checked above.
    unsafe {
        weighted_sum_tiles(
            p.as_ptr(),
            rows,
            p_row,
            v.as_ptr(),
            pairs,
            d,
            out.as_mut_ptr(),
            out_stride,
        )
    }
}

#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn weighted_sum_tiles(
    p: *const u16,
    rows: usize,
    p_row: usize,
    v: *const u32,
    pairs: usize,
    d: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let mut j0 = 0;
    while j0 < pairs {
        let kn = PAIR_CHUNK.min(pairs - j0);
        let first = j0 == 0;
        let mut r = 0;
        while r < rows {
            let mr = if rows - r >= MR { MR } else { 1 };
            let mut c0 = 0;
            while c0 < d {
                let wide = d - c0 >= NV * LANES;
                // SAFETY: rows r..r + mr, pairs j0..j0 + kn and
                // channels c0..c0 + 16·(NV or 1) are inside the buffers (see
                // `weighted_sum`).
                unsafe {
                    let (pt, vt, ot) = (
                        p.add(r * p_row + 2 * j0),
                        v.add(j0 * d + c0),
                        out.add(r * out_stride + c0),
                    );
                    match (mr, wide) {
                        (MR, true) => {
                            sum_tile::<MR, NV>(pt, p_row, vt, d, kn, ot, out_stride, first)
                        }
                        (MR, false) => {
                            sum_tile::<MR, 1>(pt, p_row, vt, d, kn, ot, out_stride, first)
                        }
                        (_, true) => sum_tile::<1, NV>(pt, p_row, vt, d, kn, ot, out_stride, first),
                        (_, false) => sum_tile::<1, 1>(pt, p_row, vt, d, kn, ot, out_stride, first),
                    }
                }
                c0 += if wide { NV * LANES } else { LANES };
            }
            r += mr;
        }
        j0 += kn;
    }
}

/// `R` rows × `N` vectors of channels: from +0 (`first`) or the sums stored so far (an f32
/// stored and loaded is the same value), folded over `pairs` key pairs in order (row `r`'s
/// weights at `p + r · p_row`, two a pair).
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn sum_tile<const R: usize, const N: usize>(
    p: *const u16,
    p_row: usize,
    v: *const u32,
    d: usize,
    pairs: usize,
    out: *mut f32,
    out_stride: usize,
    first: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    if !first {
        for (r, acc) in acc.iter_mut().enumerate() {
            for (n, a) in acc.iter_mut().enumerate() {
                // SAFETY: the tile's own outputs (see the caller).
                *a = unsafe { _mm512_loadu_ps(out.add(r * out_stride + n * LANES)) };
            }
        }
    }
    for j in 0..pairs {
        // SAFETY: j < pairs: pair j of the tile's rows and values (see the caller).
        unsafe {
            let mut x = [_mm512_setzero_si512(); N];
            for (n, x) in x.iter_mut().enumerate() {
                *x = _mm512_loadu_si512(v.add(j * d + n * LANES).cast());
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                // Weights 2j and 2j + 1 as one pair (any alignment).
                let pair = p.add(r * p_row + 2 * j).cast::<i32>().read_unaligned();
                let pv = bh(_mm512_set1_epi32(pair));
                for (a, &x) in acc.iter_mut().zip(&x) {
                    *a = _mm512_dpbf16_ps(*a, pv, bh(x));
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (n, &a) in acc.iter().enumerate() {
            // SAFETY: the tile's own outputs (see the caller).
            unsafe { _mm512_storeu_ps(out.add(r * out_stride + n * LANES), a) };
        }
    }
}

// ---------------------------------------------------------------------------------------
// The same two products with FMA (AVX-512F only).
//
// `dot_pair` adds each exact product of two bfloat16s to the f32 sum with one rounding, and
// flushes a subnormal sum to a zero of its sign. `vfmadd231ps` on the values widened to f32
// rounds `a · b + acc` once too (the product is exact either way), but keeps a subnormal
// sum. So these tiles run only on calls where no sum can be subnormal: where the smallest
// (unbiased) exponents of the nonzero values on the two sides of the products add up to
// ea + eb ≥ −112 (`FMA_MIN_EXPONENTS`, biased). Then every nonzero product is a multiple of
// 2⁻¹²⁶ (it is `A · B · 2^(ea + eb − 14)` with 8-bit significands `A`, `B`), so every sum is
// (below 2⁻¹⁰² it is exact, above its ulp is a multiple of 2⁻¹²⁵), and a nonzero multiple of
// 2⁻¹²⁶ is normal: nothing to flush, the same bits as `dot_pair`'s. (Typical operands are
// far from it: q, k, v of 2⁻²⁰ and more leave room for weights down to 2⁻⁹², keys 64 nats
// below a query's best.) A call past it returns `false` before it writes anything, and the
// caller runs its other loops.
// ---------------------------------------------------------------------------------------

/// Whether this is an Intel CPU (CPUID's vendor string), where [`super::bf16::Products::detect`] prefers
/// FMA to `vdpbf16ps`.
pub(crate) fn intel() -> bool {
    // (`__cpuid` is a safe function in the Rust that builds here, an unsafe one in older
    // releases: hence the allowance.)
    #[allow(unused_unsafe)]
    // SAFETY: CPUID leaf 0 exists on every x86-64 CPU.
    let id = unsafe { std::arch::x86_64::__cpuid(0) };
    (id.ebx, id.edx, id.ecx) == (0x756e_6547, 0x4965_6e69, 0x6c65_746e)
}

/// Whether this CPU has what the FMA tiles need: AVX-512F.
fn has_fma_instructions() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

/// Whether the FMA tiles may run on this CPU, and give the portable code's bits (checked once
/// per process, as [`available`] does for `vdpbf16ps`): on operands in the normal range they
/// must agree bit for bit, on operands near underflow they must decline.
pub(crate) fn fma_available() -> bool {
    static AGREES: OnceLock<bool> = OnceLock::new();
    *AGREES.get_or_init(|| has_fma_instructions() && fma_agrees_with_portable())
}

fn fma_agrees_with_portable() -> bool {
    super::bf16::fma_tiles_agree(fma_scores, fma_weighted_sum)
}

/// [`scores`] with FMA, where the operands allow it (see above): `false`, with nothing
/// written, where the queries' and keys' smallest exponents are too small together.
/// `keys_min`: the keys' [`min_exponent`] (over `kt` or more: a smaller one only declines
/// more calls).
#[allow(clippy::too_many_arguments)]
pub(crate) fn fma_scores(
    q: &[u32],
    rows: usize,
    d: usize,
    (kt, keys_min): (&[u32], u32),
    g_lo: usize,
    groups: usize,
    (out, widened): (&mut [f32], &mut Widened),
    row_max: Option<(&mut [f32], usize)>,
) -> bool {
    assert!(
        has_fma_instructions(),
        "AVX-512 tiles on a CPU without them"
    );
    assert!(scores_fit(
        (q.len(), kt.len(), out.len()),
        rows,
        d,
        g_lo,
        groups
    ));
    let half = d / 2;
    let group = half * LANES;
    let (q, kt) = (
        &q[..rows * half],
        &kt[g_lo * group..(g_lo + groups) * group],
    );
    if min_exponent(q) + keys_min < FMA_MIN_EXPONENTS {
        return false;
    }
    // The queries widened (rows of d), and lines for a block of up to NV groups of keys
    // widened pair by pair: 16 odd elements, then 16 even.
    let (qf, kf) = widened.take(q, NV.min(groups) * half * 2);
    by_row_lanes(rows, row_max, |r0, n, lanes| {
        // SAFETY: AVX-512F (checked above); qf's rows r0..r0 + n < rows, kt's `groups` groups
        // into kf (NV.min(groups) · 2 · half lines), out's rows r0..r0 + n (`scores_fit`).
        unsafe {
            fma_scores_tiles(
                qf.as_ptr().add(r0 * d),
                n,
                half,
                kt.as_ptr(),
                groups,
                kf.as_mut_ptr(),
                out.as_mut_ptr().add(r0 * groups * LANES),
                lanes,
            )
        }
    });
    true
}

#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn fma_scores_tiles(
    qf: *const f32,
    rows: usize,
    half: usize,
    kt: *const u32,
    groups: usize,
    kf: *mut f32,
    out: *mut f32,
    (max, keys): (*mut f32, usize),
) {
    let (d, width, group) = (2 * half, groups * LANES, half * LANES);
    let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
    let mut g0 = 0;
    while g0 < groups {
        let nv = (groups - g0).min(NV);
        for i in 0..nv * half {
            // SAFETY: pair-vector i of groups g0..g0 + nv (< groups) of kt, and its two
            // widened vectors in kf (min(groups, NV) · half · 32 f32s, and nv ≤ both).
            unsafe {
                let x = _mm512_loadu_si512(kt.add((g0 * half + i) * LANES).cast());
                let o = _mm512_castsi512_ps(_mm512_and_si512(x, high));
                let e = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(x));
                _mm512_storeu_ps(kf.add(2 * i * LANES), o);
                _mm512_storeu_ps(kf.add((2 * i + 1) * LANES), e);
            }
        }
        let mut r = 0;
        while r < rows {
            let mr = if rows - r >= MR { MR } else { 1 };
            // SAFETY: rows r..r + mr of qf (d values each) and of out, groups g0..g0 + nv of
            // out's rows and of kf's widened block, and (max not null) the rows' 16 lanes of
            // maxes (the caller's sizes).
            unsafe {
                let (qt, o) = (qf.add(r * d), out.add(r * width + g0 * LANES));
                let m = if max.is_null() {
                    max
                } else {
                    max.add(r * LANES)
                };
                let valid = |n: usize| keys.saturating_sub((g0 + n) * LANES);
                let kg = 2 * group;
                match (mr, nv) {
                    (MR, NV) => fma_score_tile::<MR, NV>(qt, half, kf, kg, o, width, (m, valid(0))),
                    (MR, _) => (0..nv).for_each(|n| {
                        let (k, o) = (kf.add(n * kg), o.add(n * LANES));
                        fma_score_tile::<MR, 1>(qt, half, k, kg, o, width, (m, valid(n)))
                    }),
                    (_, NV) => fma_score_tile::<1, NV>(qt, half, kf, kg, o, width, (m, valid(0))),
                    _ => (0..nv).for_each(|n| {
                        let (k, o) = (kf.add(n * kg), o.add(n * LANES));
                        fma_score_tile::<1, 1>(qt, half, k, kg, o, width, (m, valid(n)))
                    }),
                }
            }
            r += mr;
        }
        g0 += nv;
    }
}

/// `R` widened queries (`2 · half` values each, consecutive) against `N` widened groups of
/// keys (`kg` values apart; pair c's 16 odd elements at `32c`, its even ones at `32c + 16`):
/// each score from +0, pair by pair, the odd products first, one FMA each.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn fma_score_tile<const R: usize, const N: usize>(
    q: *const f32,
    half: usize,
    k: *const f32,
    kg: usize,
    out: *mut f32,
    width: usize,
    max: (*mut f32, usize),
) {
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    for c in 0..half {
        // SAFETY: c < half: pair c of each of the tile's widened groups and queries.
        unsafe {
            for h in 0..2 {
                let k: [__m512; N] =
                    std::array::from_fn(|n| _mm512_loadu_ps(k.add(n * kg + (2 * c + h) * LANES)));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let qv = _mm512_set1_ps(*q.add(r * 2 * half + 2 * c + h));
                    for (a, &k) in acc.iter_mut().zip(&k) {
                        *a = _mm512_fmadd_ps(qv, k, *a);
                    }
                }
            }
        }
    }
    // SAFETY: the tile's scores and maxes (see the caller).
    unsafe { store_scores(&acc, out, width, max) }
}

/// [`weighted_sum`] with FMA, where the operands allow it (see above): `false`, with nothing
/// written, where the weights' and values' smallest exponents are too small together, or `d`
/// is not a multiple of 16. `values_min`: the values' [`min_exponent`] (over `v` or more: a
/// smaller one only declines more calls).
#[allow(clippy::too_many_arguments)]
pub(crate) fn fma_weighted_sum(
    p: &[u16],
    rows: usize,
    p_row: usize,
    (v, values_min): (&[u32], u32),
    pairs: usize,
    d: usize,
    (out, out_stride): (&mut [f32], usize),
    widened: &mut Widened,
) -> bool {
    assert!(
        has_fma_instructions(),
        "AVX-512 tiles on a CPU without them"
    );
    let lengths = (p.len(), v.len(), out.len());
    assert!(weighted_sum_fits(
        lengths, rows, p_row, pairs, d, out_stride
    ));
    match super::bf16::fma_weighted_sum_start(p, rows, p_row, values_min, pairs, d, out, out_stride)
    {
        Some(true) => {}
        Some(false) => return true,
        None => return false,
    }
    // Lines for a chunk's values widened (d is a multiple of 16: whole lines).
    let (_, vf) = widened.take(&[], PAIR_CHUNK.min(pairs) * 2 * d / LANES);
    // SAFETY: AVX-512F (checked above); p, v and out hold what `weighted_sum_fits` says
    // (checked above), vf PAIR_CHUNK.min(pairs) pairs of two widened rows of d.
    unsafe {
        fma_weighted_sum_tiles(
            p.as_ptr(),
            rows,
            p_row,
            v.as_ptr(),
            pairs,
            d,
            vf.as_mut_ptr(),
            out.as_mut_ptr(),
            out_stride,
        )
    };
    true
}

#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn fma_weighted_sum_tiles(
    p: *const u16,
    rows: usize,
    p_row: usize,
    v: *const u32,
    pairs: usize,
    d: usize,
    vf: *mut f32,
    out: *mut f32,
    out_stride: usize,
) {
    let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
    // A tile's weights of a chunk, widened: row i's odd weights (keys 2j + 1) at
    // `2 · PAIR_CHUNK · i`, its even ones PAIR_CHUNK further.
    let mut wf = [0.0f32; MR * 2 * PAIR_CHUNK];
    let mut j0 = 0;
    while j0 < pairs {
        let kn = PAIR_CHUNK.min(pairs - j0);
        let first = j0 == 0;
        // The chunk's values widened: pair j's odd row (key 2j + 1) at `2j · d`, its even
        // row at `(2j + 1) · d`.
        for j in 0..kn {
            for c in (0..d).step_by(LANES) {
                // SAFETY: pair j0 + j < pairs of v, channels c..c + 16 ≤ d; rows 2j and
                // 2j + 1 < 2 · kn of vf.
                unsafe {
                    let x = _mm512_loadu_si512(v.add((j0 + j) * d + c).cast());
                    let o = _mm512_castsi512_ps(_mm512_and_si512(x, high));
                    _mm512_storeu_ps(vf.add(2 * j * d + c), o);
                    let e = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(x));
                    _mm512_storeu_ps(vf.add((2 * j + 1) * d + c), e);
                }
            }
        }
        let mut r = 0;
        while r < rows {
            let mr = if rows - r >= MR { MR } else { 1 };
            for i in 0..mr {
                for h in 0..kn.div_ceil(LANES) {
                    let n = (kn - h * LANES).min(LANES);
                    let mask = if n == LANES { !0 } else { (1u16 << n) - 1 };
                    // SAFETY: weights 2·(j0 + 16h)..2·(j0 + 16h + n) of row r + i < rows
                    // (j0 + 16h + n ≤ pairs: the mask loads n pairs, 4 bytes each, from any
                    // alignment), written to wf's row i (32 f32s a half, 16h + n ≤ kn ≤ 32).
                    unsafe {
                        let src = p.add((r + i) * p_row + 2 * (j0 + h * LANES));
                        let x = _mm512_maskz_loadu_epi32(mask, src.cast());
                        let o = _mm512_castsi512_ps(_mm512_and_si512(x, high));
                        let e = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(x));
                        let row = wf.as_mut_ptr().add(i * 2 * PAIR_CHUNK + h * LANES);
                        _mm512_storeu_ps(row, o);
                        _mm512_storeu_ps(row.add(PAIR_CHUNK), e);
                    }
                }
            }
            let mut c0 = 0;
            while c0 < d {
                let wide = d - c0 >= NV * LANES;
                // SAFETY: rows r..r + mr of out and wf, pairs 0..kn of vf's chunk, channels
                // c0..c0 + 16·(NV or 1) ≤ d (see `fma_weighted_sum`).
                unsafe {
                    let (wt, vt, ot) = (wf.as_ptr(), vf.add(c0), out.add(r * out_stride + c0));
                    let s = (out_stride, first);
                    match (mr, wide) {
                        (MR, true) => fma_sum_tile::<MR, NV>(wt, vt, d, kn, ot, s),
                        (MR, false) => fma_sum_tile::<MR, 1>(wt, vt, d, kn, ot, s),
                        (_, true) => fma_sum_tile::<1, NV>(wt, vt, d, kn, ot, s),
                        (_, false) => fma_sum_tile::<1, 1>(wt, vt, d, kn, ot, s),
                    }
                }
                c0 += if wide { NV * LANES } else { LANES };
            }
            r += mr;
        }
        j0 += kn;
    }
}

/// `R` rows × `N` vectors of channels: from +0 (`first`) or the sums stored so far, folded
/// over `pairs` key pairs in order, the odd key's product first, one FMA each (weights
/// widened as [`fma_weighted_sum_tiles`] keeps them; values `vf`: pair j's odd row at
/// `2j · d`, its even row at `(2j + 1) · d`).
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn fma_sum_tile<const R: usize, const N: usize>(
    w: *const f32,
    vf: *const f32,
    d: usize,
    pairs: usize,
    out: *mut f32,
    (out_stride, first): (usize, bool),
) {
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    if !first {
        for (r, acc) in acc.iter_mut().enumerate() {
            for (n, a) in acc.iter_mut().enumerate() {
                // SAFETY: the tile's own outputs (see the caller).
                *a = unsafe { _mm512_loadu_ps(out.add(r * out_stride + n * LANES)) };
            }
        }
    }
    for j in 0..pairs {
        for h in 0..2 {
            // SAFETY: j < pairs: row 2j + h of the chunk's widened values, N vectors from the
            // tile's channels, and weight j of half h of each of the tile's rows.
            unsafe {
                let x: [__m512; N] =
                    std::array::from_fn(|n| _mm512_loadu_ps(vf.add((2 * j + h) * d + n * LANES)));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let wv = _mm512_set1_ps(*w.add(r * 2 * PAIR_CHUNK + h * PAIR_CHUNK + j));
                    for (a, &x) in acc.iter_mut().zip(&x) {
                        *a = _mm512_fmadd_ps(wv, x, *a);
                    }
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (n, &a) in acc.iter().enumerate() {
            // SAFETY: the tile's own outputs (see the caller).
            unsafe { _mm512_storeu_ps(out.add(r * out_stride + n * LANES), a) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::aligned::Aligned;
    use super::*;
    use proptest::prelude::*;

    fn packed(seed: u64, n: usize, lo: u32, span: u32) -> Vec<u32> {
        super::super::bf16::random_pairs(&mut (seed | 1), n, lo, span)
    }

    #[test]
    fn this_cpu_uses_the_tiles_if_it_has_them() {
        if has_instructions() {
            assert!(
                available(),
                "vdpbf16ps disagrees with the portable definition"
            );
        } else {
            assert!(!available());
        }
    }

    #[test]
    fn this_cpu_uses_the_fma_tiles_if_it_has_them() {
        if has_fma_instructions() {
            assert!(
                fma_available(),
                "the FMA tiles disagree with the portable definition"
            );
        } else {
            assert!(!fma_available());
        }
    }

    #[test]
    fn the_fma_tiles_run_down_to_the_bound() {
        if has_fma_instructions() {
            super::super::bf16::tests::the_tiles_run_down_to_the_bound(
                fma_scores,
                fma_weighted_sum,
            );
        }
    }

    /// The softmax's edges are the values they are said to be, and NaN scores: their lanes
    /// stay NaN in the tiles' totals (a swapped clamp would turn them into finite weights),
    /// the other lanes keep every bit.
    #[test]
    fn the_softmax_tiles_keep_the_edges_and_nans() {
        let y = SOFTMAX_EDGES.map(|x| x * 0.25 - 3.0);
        assert_eq!(&y[..7], &[0.0, -0.5, -1.5, -2.5, -3.5, -4.5, -125.5]);
        assert_eq!(y[7], (-125.5f32).next_down());
        assert_eq!(y[8], (-125.5f32).next_up());
        if !has_instructions() {
            return;
        }
        let mut with_nans = SOFTMAX_EDGES;
        for i in [2, 9, 15] {
            with_nans[i] = f32::NAN;
        }
        for blocks in [
            vec![SOFTMAX_EDGES],
            vec![SOFTMAX_EDGES, with_nans, SOFTMAX_EDGES],
        ] {
            let n = blocks.len();
            let (mut w_tiles, mut w_portable) = (vec![[0u16; LANES]; n], vec![[1u16; LANES]; n]);
            let (mut t_tiles, mut t_portable) = ([0.0f32; LANES], [0.0f32; LANES]);
            softmax_blocks(&blocks, &mut w_tiles, (0.25, 3.0), &mut t_tiles);
            super::super::bf16::softmax_blocks_portable(
                &blocks,
                &mut w_portable,
                (0.25, 3.0),
                &mut t_portable,
            );
            for i in 0..LANES {
                let nan = blocks.iter().any(|b| b[i].is_nan());
                assert_eq!(t_tiles[i].is_nan(), nan, "lane {i}");
                if !nan {
                    assert_eq!(t_tiles[i].to_bits(), t_portable[i].to_bits(), "lane {i}");
                    for b in 0..n {
                        assert_eq!(w_tiles[b][i], w_portable[b][i], "block {b}, lane {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn at_the_bound_a_cancelling_sum_keeps_the_definitions_bits() {
        if has_fma_instructions() {
            super::super::bf16::tests::a_cancelling_sum_keeps_the_definitions_bits(
                fma_scores,
                fma_weighted_sum,
            );
        }
    }

    /// On a head's typical operands (q, k and v within ±½ from xorshift, 300 keys, the
    /// weights from the softmax of their scores) the FMA tiles run, and give the portable
    /// bits: the attention tests' sharper operands may make them decline.
    #[test]
    fn the_fma_tiles_run_on_typical_operands() {
        use super::super::bf16::{self, tests::values};
        if !has_fma_instructions() {
            return;
        }
        let (rows, len, d) = (16, 300, 64);
        let (q, k, v) = (
            values(1, rows * d, 1.0),
            values(2, len * d, 1.0),
            values(3, len * d, 1.0),
        );
        let (mut qp, mut kt, mut vp) = (
            vec![0; rows * d / 2],
            Aligned::default(),
            Aligned::default(),
        );
        bf16::pack_queries(&q, d, rows, d, &mut qp);
        bf16::pack_keys(&k, d, len, d, &mut kt);
        bf16::pack_values(&v, d, len, d, &mut vp);
        let groups = len.div_ceil(LANES);
        let width = groups * LANES;
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let (mut s, mut portable) = (vec![0.0; rows * width], vec![0.0; rows * width]);
        let run = bf16::fma_scores_on(fma_scores, &qp, rows, d, &kt, (0, groups), &mut s);
        assert!(run);
        bf16::scores_portable(&qp, rows, d, &kt, 0, groups, &mut portable);
        assert_eq!(bits(&s), bits(&portable));
        let (mut p, mut inv) = (vec![0u16; rows * width], vec![0.0; rows]);
        let own = vec![(0, len); rows];
        bf16::softmax(
            bf16::Products::Portable,
            &s,
            width,
            &own,
            0.125,
            None,
            &mut p,
            &mut inv,
        );
        let pairs = len.div_ceil(2);
        let (mut out, mut portable) = (vec![0.0; rows * d], vec![0.0; rows * d]);
        let run = bf16::fma_sums_on(
            fma_weighted_sum,
            &p,
            rows,
            width,
            &vp,
            (pairs, d),
            (&mut out, d),
        );
        assert!(run);
        bf16::weighted_sum_portable(&p, rows, width, &vp, pairs, d, &mut portable, d);
        assert_eq!(bits(&out), bits(&portable));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// The tiles give the portable code's bits on every shape around the tiles' edges,
        /// in the normal range and near underflow.
        #[test]
        fn tiles_give_the_portable_bits(
            rows in prop_oneof![1usize..10, 15usize..40],
            groups in 1usize..7,
            g_lo in 0usize..2,
            d in prop_oneof![Just(16usize), Just(48usize), Just(64usize), Just(80usize), Just(128usize)],
            pairs in 1usize..80,
            seed in any::<u64>(),
            range in prop_oneof![Just((115u32, 25u32)), Just((1u32, 100u32))],
        ) {
            if !has_instructions() {
                return Ok(());
            }
            let half = d / 2;
            let (lo, span) = range;
            let q = packed(seed, rows * half, lo, span);
            let kt = packed(seed ^ 1, (g_lo + groups) * half * LANES, lo, span);
            let width = groups * LANES;
            let (mut tiles, mut portable) = (vec![1.0; rows * width], vec![2.0; rows * width]);
            let mut maxes = vec![f32::NEG_INFINITY; rows];
            let keys = groups * LANES - pairs % 16;
            scores(&q, rows, d, &kt, g_lo, groups, &mut tiles, Some((&mut maxes, keys)));
            super::super::bf16::scores_portable(&q, rows, d, &kt, g_lo, groups, &mut portable);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&tiles), bits(&portable));
            // The tiles' row maxes: each row's max over its first `keys` scores.
            for (r, &m) in maxes.iter().enumerate() {
                let row = &portable[r * groups * LANES..r * groups * LANES + keys];
                let want = row.iter().fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
                prop_assert_eq!(m.to_bits(), want.to_bits());
            }

            let p_row = 2 * pairs + 6;
            let p: Vec<u16> = packed(seed ^ 2, rows * p_row / 2, lo, span)
                .into_iter()
                .flat_map(|x| [x as u16, (x >> 16) as u16])
                .collect();
            let v = packed(seed ^ 3, pairs * d, lo, span);
            let stride = d + 5;
            let (mut tiles, mut portable) = (vec![1.0; rows * stride], vec![1.0; rows * stride]);
            weighted_sum(&p, rows, p_row, &v, pairs, d, &mut tiles, stride);
            super::super::bf16::weighted_sum_portable(&p, rows, p_row, &v, pairs, d, &mut portable, stride);
            prop_assert_eq!(bits(&tiles), bits(&portable));
        }

        /// The FMA tiles give the portable code's bits wherever they run, over shapes around
        /// the tiles' edges, with zeros among the operands; and decline, writing nothing,
        /// where the two sides' smallest exponents add up to less than ea + eb = −112: every
        /// operand's smallest is 2⁻⁴⁷ (its first value that counts), and perhaps one value of
        /// 2⁻⁸⁷ to 2⁻⁴⁸ where it counts (in q, in the call's keys, in the weights' first
        /// `pairs` pairs of a row, in v): −112 is reached from 2⁻⁶⁵ up.
        #[test]
        fn fma_tiles_give_the_portable_bits_or_decline(
            rows in prop_oneof![1usize..10, 15usize..40],
            groups in 1usize..7,
            g_lo in 0usize..2,
            d in prop_oneof![Just(16usize), Just(48usize), Just(64usize), Just(80usize), Just(128usize), Just(24usize)],
            pairs in 0usize..80,
            seed in any::<u64>(),
            small in prop_oneof![Just(None), (0usize..4, any::<prop::sample::Index>(), 40u32..80).prop_map(Some)],
        ) {
            if !has_fma_instructions() {
                return Ok(());
            }
            let half = d / 2;
            // Biased exponents 80 to 119 (2⁻⁴⁷ to 2⁻⁸): the sums stay finite.
            let mut operands = [
                packed(seed, rows * half, 80, 40),
                packed(seed ^ 1, (g_lo + groups) * half * LANES, 80, 40),
                packed(seed ^ 2, rows * (pairs + 3), 80, 40),
                packed(seed ^ 3, pairs * d, 80, 40),
            ];
            // Zeros here and there (even elements).
            for (i, x) in operands.iter_mut().enumerate() {
                for j in (i..x.len()).step_by(7) {
                    x[j] &= 0xffff_0000;
                }
            }
            // Where each operand's values count: index i of them is `at(which, i)`.
            let counted = [rows * half, groups * half * LANES, rows * pairs, pairs * d];
            let at = |which: usize, i: usize| match which {
                1 => g_lo * half * LANES + i,
                2 => i / pairs * (pairs + 3) + i % pairs,
                _ => i,
            };
            let set_exponent = |x: &mut u32, e: u32| *x = (*x & 0x807f_ffff) | e << 23;
            for which in 0..4 {
                if counted[which] > 0 {
                    set_exponent(&mut operands[which][at(which, 0)], 80);
                }
            }
            // Perhaps one smaller value, and whether its products can go below the bound.
            let (mut q_or_k_small, mut w_or_v_small) = (false, false);
            if let Some((which, i, e)) = small
                && counted[which] > 0
            {
                let i = at(which, i.index(counted[which]));
                set_exponent(&mut operands[which][i], e);
                let declines = e + 80 < 2 * 127 - 112;
                *(if which < 2 { &mut q_or_k_small } else { &mut w_or_v_small }) = declines;
            }
            let [q, kt, p, v] = operands;
            let p: Vec<u16> = p.into_iter().flat_map(|x| [x as u16, (x >> 16) as u16]).collect();
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();

            let width = groups * LANES;
            let (mut fma, mut portable) = (vec![1.0; rows * width], vec![2.0; rows * width]);
            let mut maxes = vec![f32::NEG_INFINITY; rows];
            let keys = width - pairs % 16;
            // One scratch for both products: reused, of another size each time.
            let mut widened = Widened::default();
            let (k, out) = ((&kt[..], min_exponent(&kt)), (&mut fma[..], &mut widened));
            let ran = fma_scores(&q, rows, d, k, g_lo, groups, out, Some((&mut maxes, keys)));
            super::super::bf16::scores_portable(&q, rows, d, &kt, g_lo, groups, &mut portable);
            prop_assert_eq!(ran, !q_or_k_small);
            if ran {
                prop_assert_eq!(bits(&fma), bits(&portable));
                for (r, &m) in maxes.iter().enumerate() {
                    let row = &portable[r * width..r * width + keys];
                    let want = row.iter().fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
                    prop_assert_eq!(m.to_bits(), want.to_bits());
                }
            } else {
                prop_assert!(fma.iter().all(|&x| x == 1.0));
                prop_assert!(maxes.iter().all(|&m| m == f32::NEG_INFINITY));
            }

            let p_row = 2 * (pairs + 3);
            let stride = d + 5;
            let (mut fma, mut portable) = (vec![1.0; rows * stride], vec![1.0; rows * stride]);
            let (values, out) = ((&v[..], min_exponent(&v)), (&mut fma[..], stride));
            let ran = fma_weighted_sum(&p, rows, p_row, values, pairs, d, out, &mut widened);
            super::super::bf16::weighted_sum_portable(&p, rows, p_row, &v, pairs, d, &mut portable, stride);
            prop_assert_eq!(ran, d % 16 == 0 && !w_or_v_small);
            if ran {
                prop_assert_eq!(bits(&fma), bits(&portable));
            } else {
                prop_assert!(fma.iter().all(|&x| x == 1.0));
            }
        }
    }
}
