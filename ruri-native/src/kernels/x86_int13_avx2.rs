//! [`AttentionPrecision::Int13`](crate::AttentionPrecision::Int13)'s two products with AVX2,
//! for x86 CPUs without AVX-512 VNNI (where they would otherwise run the portable loops):
//! `vpmaddwd` multiplies 16 pairs of 16-bit integers and adds each pair into an i32 lane,
//! exactly, and `vpaddd` adds that to the sums, 16 multiply-adds for two instructions (an FMA
//! does 8 f32 ones). The sums are the integers `x86_int13`'s tiles and the portable loops
//! compute (none can overflow: `super::int13::TILE_MAX_D`, `SUM_CHUNK`), so the bits are
//! theirs.
//!
//! Each public function checks that the CPU has AVX2 and that every buffer holds what its
//! loops read or write; the `unsafe` blocks rely on nothing else.

use std::arch::x86_64::*;

use super::bf16::LANES;
use super::int13::{TILE_MAX_D, scores_fit, sum_tiles, weighted_sum_fits};

/// i32 lanes of a vector.
const W: usize = 8;
/// Query rows per tile of scores and of weighted sums.
const MR: usize = 2;
/// Groups of 16 keys per tile of scores (two vectors each).
const NG: usize = 2;
/// Vectors of 8 channels per tile of weighted sums.
const NV: usize = 4;

/// Whether this CPU has AVX2.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// `super::int13::Products::scores` on the tiles; `d` at most `TILE_MAX_D`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores(
    q: &[u32],
    sq: &[f32],
    rows: usize,
    d: usize,
    kt: &[u32],
    sk: &[f32],
    g_lo: usize,
    groups: usize,
    out: &mut [f32],
) {
    assert!(available(), "AVX2 tiles on a CPU without them");
    let lengths = (q.len(), sq.len(), kt.len(), sk.len(), out.len());
    assert!(d <= TILE_MAX_D && scores_fit(lengths, rows, d, g_lo, groups));
    let half = d / 2;
    // SAFETY: AVX2 (checked above); q holds `rows` rows of `half` pairs and sq their scales,
    // kt and sk the groups g_lo..g_lo + groups, out `rows` rows of `groups · 16`
    // (`scores_fit`, checked above).
    unsafe {
        scores_tiles(
            q.as_ptr(),
            sq.as_ptr(),
            rows,
            half,
            kt.as_ptr().add(g_lo * half * LANES),
            sk.as_ptr().add(g_lo * LANES),
            groups,
            out.as_mut_ptr(),
        )
    }
}

#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_tiles(
    q: *const u32,
    sq: *const f32,
    rows: usize,
    half: usize,
    kt: *const u32,
    sk: *const f32,
    groups: usize,
    out: *mut f32,
) {
    let width = groups * LANES;
    let mut g0 = 0;
    while g0 < groups {
        let ng = (groups - g0).min(NG);
        let mut r = 0;
        while r < rows {
            let mr = (rows - r).min(MR);
            // SAFETY: rows r..r + mr ≤ rows of q, sq and out, groups g0..g0 + ng ≤ groups of
            // kt, sk and out's rows (the caller's sizes).
            unsafe {
                let (qt, s) = (q.add(r * half), sq.add(r));
                let at = |n: usize| {
                    let g = g0 + n;
                    (
                        kt.add(g * half * LANES),
                        sk.add(g * LANES),
                        out.add(r * width + g * LANES),
                    )
                };
                match (mr, ng) {
                    (MR, NG) => score_tile::<MR, NG>(qt, s, half, at(0), width),
                    (MR, _) => (0..ng).for_each(|n| score_tile::<MR, 1>(qt, s, half, at(n), width)),
                    (_, NG) => score_tile::<1, NG>(qt, s, half, at(0), width),
                    _ => (0..ng).for_each(|n| score_tile::<1, 1>(qt, s, half, at(n), width)),
                }
            }
            r += mr;
        }
        g0 += ng;
    }
}

/// `R` queries (`half` pairs each, consecutive; scales `sq`) against `N` groups of keys
/// (`half · 16` pairs apart, two vectors of 8 a pair; scales `sk`, 16 a group): each score
/// the exact i32 dot product, converted, times the key's scale, times the query's, stored in
/// rows of `width` at `out`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn score_tile<const R: usize, const N: usize>(
    q: *const u32,
    sq: *const f32,
    half: usize,
    (kt, sk, out): (*const u32, *const f32, *mut f32),
    width: usize,
) {
    let mut acc = [[[_mm256_setzero_si256(); 2]; N]; R];
    for c in 0..half {
        // SAFETY: c < half: pair c of each of the tile's groups (both vectors) and queries.
        unsafe {
            let k: [[__m256i; 2]; N] = std::array::from_fn(|n| {
                std::array::from_fn(|h| {
                    _mm256_loadu_si256(kt.add((n * half + c) * LANES + h * W).cast())
                })
            });
            for (r, acc) in acc.iter_mut().enumerate() {
                let qv = _mm256_set1_epi32(*q.add(r * half + c) as i32);
                for (acc, k) in acc.iter_mut().zip(&k) {
                    for (a, &k) in acc.iter_mut().zip(k) {
                        *a = _mm256_add_epi32(*a, _mm256_madd_epi16(qv, k));
                    }
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (n, acc) in acc.iter().enumerate() {
            for (h, &a) in acc.iter().enumerate() {
                // SAFETY: the scales of the tile's keys and rows, and its scores (the caller's
                // sizes).
                unsafe {
                    let s = _mm256_loadu_ps(sk.add(n * LANES + h * W));
                    let scaled = _mm256_mul_ps(_mm256_cvtepi32_ps(a), s);
                    let score = _mm256_mul_ps(scaled, _mm256_set1_ps(*sq.add(r)));
                    _mm256_storeu_ps(out.add(r * width + n * LANES + h * W), score);
                }
            }
        }
    }
}

/// `super::int13::Products::weighted_sum` on the tiles; `d` a multiple of 8.
pub(crate) fn weighted_sum(
    p: &[u16],
    rows: usize,
    p_row: usize,
    v: &[u32],
    pairs: usize,
    d: usize,
    out: &mut [i64],
) {
    assert!(available(), "AVX2 tiles on a CPU without them");
    let lengths = (p.len(), v.len(), out.len());
    assert!(d.is_multiple_of(W) && weighted_sum_fits(lengths, rows, p_row, pairs, d));
    // SAFETY: AVX2 (checked above); p holds `rows` rows of `2 · pairs` weights `p_row`
    // apart, v `pairs` rows of `d` pairs, out `rows` rows of `d` (checked above).
    unsafe {
        weighted_sum_tiles(
            p.as_ptr(),
            rows,
            p_row,
            v.as_ptr(),
            pairs,
            d,
            out.as_mut_ptr(),
        )
    }
}

/// The tiles in `super::int13::sum_tiles`' walk: each tile's i32 sums of a chunk, then
/// added to its i64 sums (stored on the first chunk).
#[target_feature(enable = "avx2")]
unsafe fn weighted_sum_tiles(
    p: *const u16,
    rows: usize,
    p_row: usize,
    v: *const u32,
    pairs: usize,
    d: usize,
    out: *mut i64,
) {
    for t in sum_tiles(rows, pairs, d, MR, (NV * W, W)) {
        // SAFETY: the tile's rows ≤ rows of p and out, its pairs ≤ pairs of v, its
        // channels ≤ d (`sum_tiles` keeps every tile inside its shape; the caller's sizes).
        unsafe {
            let w = p.add(t.r * p_row + 2 * t.j0);
            let (vt, o) = (v.add(t.j0 * d + t.c0), out.add(t.r * d + t.c0));
            let s = (p_row, d, t.pairs, t.first);
            match (t.full_rows, t.wide) {
                (true, true) => sum_tile::<MR, NV>(w, vt, o, s),
                (true, false) => sum_tile::<MR, 1>(w, vt, o, s),
                (false, true) => sum_tile::<1, NV>(w, vt, o, s),
                (false, false) => sum_tile::<1, 1>(w, vt, o, s),
            }
        }
    }
}

/// `R` rows × `N` vectors of 8 channels over `pairs` (≤ `SUM_CHUNK`) key pairs: weights `w`
/// (row `r`'s pair `j` at `r · p_row + 2j`), values `v` (pair `j`'s channels at `j · d`);
/// the i32 sums stored to, or added to, the i64 sums `out` (row `r` at `r · d`).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn sum_tile<const R: usize, const N: usize>(
    w: *const u16,
    v: *const u32,
    out: *mut i64,
    (p_row, d, pairs, first): (usize, usize, usize, bool),
) {
    let mut acc = [[_mm256_setzero_si256(); N]; R];
    for j in 0..pairs {
        // SAFETY: j < pairs: pair j's values of the tile's channels, and weights 2j and
        // 2j + 1 of each of its rows (read as one unaligned u32).
        unsafe {
            let x: [__m256i; N] =
                std::array::from_fn(|n| _mm256_loadu_si256(v.add(j * d + n * W).cast()));
            for (r, acc) in acc.iter_mut().enumerate() {
                let two = w.add(r * p_row + 2 * j).cast::<u32>().read_unaligned();
                let wv = _mm256_set1_epi32(two as i32);
                for (a, &x) in acc.iter_mut().zip(&x) {
                    *a = _mm256_add_epi32(*a, _mm256_madd_epi16(wv, x));
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (n, &a) in acc.iter().enumerate() {
            // SAFETY: the tile's own sums, 8 i64 a vector of channels (the caller's sizes).
            unsafe {
                let o = out.add(r * d + n * W);
                let lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(a));
                let hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256::<1>(a));
                let (lo, hi) = if first {
                    (lo, hi)
                } else {
                    (
                        _mm256_add_epi64(lo, _mm256_loadu_si256(o.cast())),
                        _mm256_add_epi64(hi, _mm256_loadu_si256(o.add(4).cast())),
                    )
                };
                _mm256_storeu_si256(o.cast(), lo);
                _mm256_storeu_si256(o.add(4).cast(), hi);
            }
        }
    }
}
