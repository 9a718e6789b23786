//! [`AttentionPrecision::Int13`](crate::AttentionPrecision::Int13)'s two products with AVX2,
//! for x86 CPUs without AVX-512 VNNI (where they would otherwise run the portable loops):
//! `vpmaddwd` multiplies 16 pairs of 16-bit integers and adds each pair into an i32 lane,
//! exactly, and `vpaddd` adds that to the sums, 16 multiply-adds for two instructions (an FMA
//! does 8 f32 ones). The sums are the integers `x86_int13`'s tiles and the portable loops
//! compute (none can overflow: `super::int13::TILE_MAX_D`, `SUM_CHUNK`), so the bits are
//! theirs. As the AVX-512 tiles do, the score tiles fold each row's max into lanes as they
//! store the scores (the softmax then reads no score twice), the weighted sums of a short
//! text (one chunk of key pairs) leave their tiles as the finished outputs, and a text
//! within the window has its softmax rows in one pass ([`softmax_whole`]). Its packers of
//! q, k and v ([`pack_queries`], [`pack_keys`], [`pack_values`]) run on x86 CPUs with AVX2
//! and without AVX-512BW (8 keys' pairs transposed in registers at a time).
//!
//! Each public function checks that the CPU has AVX2 and that every buffer holds what its
//! loops read or write; the `unsafe` blocks rely on nothing else.

use std::arch::x86_64::*;

use super::aligned::Aligned;
use super::bf16::LANES;
use super::int13::{Finish, FinishAt, LEVELS_F32, SUM_CHUNK, TILE_MAX_D, finish_tile};
use super::int13::{abs_bits, group_quantizers, prefetch_ahead, quantizers, weighted_sum_fits};
use super::int13::{scores_fit, sum_tiles};
use super::simd_f32::holds_rows;
use super::x86_bf16_avx2::{first_lanes, fold_max};

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

/// `super::int13::Products::scores` on the tiles; `d` at most `TILE_MAX_D`. With `row_max
/// = Some((max, keys))`, also each row's max over its first `keys` scores folded into
/// `max[r]`, lane by lane in the tiles (as `x86_int13`'s tiles fold it, with the same
/// result as `super::bf16::fold_row_maxes`).
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
    row_max: Option<(&mut [f32], usize)>,
) {
    assert!(available(), "AVX2 tiles on a CPU without them");
    let lengths = (q.len(), sq.len(), kt.len(), sk.len(), out.len());
    assert!(d <= TILE_MAX_D && scores_fit(lengths, rows, d, g_lo, groups));
    let half = d / 2;
    super::x86_bf16::by_row_lanes(rows, row_max, |r0, n, lanes| {
        // SAFETY: AVX2 (checked above); q holds rows r0..r0 + n ≤ rows of `half` pairs and
        // sq their scales, kt and sk the groups g_lo..g_lo + groups, out `rows` rows of
        // `groups · 16` (`scores_fit`, checked above), lanes (unless null) 16 maxes for
        // each of the n rows (`by_row_lanes`).
        unsafe {
            scores_tiles(
                q.as_ptr().add(r0 * half),
                sq.as_ptr().add(r0),
                n,
                half,
                kt.as_ptr().add(g_lo * half * LANES),
                sk.as_ptr().add(g_lo * LANES),
                groups,
                out.as_mut_ptr().add(r0 * groups * LANES),
                lanes,
            )
        }
    });
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
    (max, keys): (*mut f32, usize),
) {
    let width = groups * LANES;
    let mut g0 = 0;
    while g0 < groups {
        let ng = (groups - g0).min(NG);
        let mut r = 0;
        while r < rows {
            let mr = (rows - r).min(MR);
            // SAFETY: rows r..r + mr ≤ rows of q, sq and out (and of the maxes, if not
            // null), groups g0..g0 + ng ≤ groups of kt, sk and out's rows (the caller's
            // sizes).
            unsafe {
                let (qt, s) = (q.add(r * half), sq.add(r));
                let m = if max.is_null() {
                    max
                } else {
                    max.add(r * LANES)
                };
                let at = |n: usize| {
                    let g = g0 + n;
                    (
                        kt.add(g * half * LANES),
                        sk.add(g * LANES),
                        out.add(r * width + g * LANES),
                    )
                };
                let valid = |n: usize| keys.saturating_sub((g0 + n) * LANES);
                match (mr, ng) {
                    (MR, NG) => score_tile::<MR, NG>(qt, s, half, at(0), width, (m, valid(0))),
                    (MR, _) => (0..ng).for_each(|n| {
                        score_tile::<MR, 1>(qt, s, half, at(n), width, (m, valid(n)))
                    }),
                    (_, NG) => score_tile::<1, NG>(qt, s, half, at(0), width, (m, valid(0))),
                    _ => (0..ng)
                        .for_each(|n| score_tile::<1, 1>(qt, s, half, at(n), width, (m, valid(n)))),
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
/// rows of `width` at `out`; with `max` not null, each row's scores of its first `valid`
/// keys (from the tile's first group) folded lane by lane into the row's 16 lanes at
/// `max + 16·r` (`a > m ? a : m`: a NaN score is left out, as the softmax's own max does).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn score_tile<const R: usize, const N: usize>(
    q: *const u32,
    sq: *const f32,
    half: usize,
    (kt, sk, out): (*const u32, *const f32, *mut f32),
    width: usize,
    (max, valid): (*mut f32, usize),
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
    let mut scores = [[[_mm256_setzero_ps(); 2]; N]; R];
    for (r, (acc, scores)) in acc.iter().zip(&mut scores).enumerate() {
        for (n, (acc, scores)) in acc.iter().zip(scores).enumerate() {
            for (h, (&a, score)) in acc.iter().zip(scores).enumerate() {
                // SAFETY: the scales of the tile's keys and rows, and its scores (the caller's
                // sizes).
                unsafe {
                    let s = _mm256_loadu_ps(sk.add(n * LANES + h * W));
                    let scaled = _mm256_mul_ps(_mm256_cvtepi32_ps(a), s);
                    *score = _mm256_mul_ps(scaled, _mm256_set1_ps(*sq.add(r)));
                    _mm256_storeu_ps(out.add(r * width + n * LANES + h * W), *score);
                }
            }
        }
    }
    if max.is_null() {
        return;
    }
    // Each row's two vectors of lanes read once, the tile's groups folded in
    // (`x86_bf16_avx2::fold_max`), stored once.
    for (r, scores) in scores.iter().enumerate() {
        for h in 0..2 {
            // SAFETY: lanes 8h..8h + 8 of row r's 16 maxes (the caller's sizes).
            unsafe {
                let slot = max.add(r * LANES + h * W);
                let mut lanes = _mm256_loadu_ps(slot);
                for (n, score) in scores.iter().enumerate() {
                    let count = valid.saturating_sub(n * LANES + h * W);
                    lanes = fold_max(lanes, score[h], count);
                }
                _mm256_storeu_ps(slot, lanes);
            }
        }
    }
}

/// `super::int13::Products::weighted_sum` on the tiles; `d` a multiple of 8. With
/// `finish` (and at most `SUM_CHUNK` key pairs, so that every sum is an i32 tile's),
/// `super::int13::Products::weighted_average`'s outputs instead: each tile converts its
/// rows' sums and scales them as `super::int13::finish` does.
#[allow(clippy::too_many_arguments)]
pub(crate) fn weighted_sum(
    p: &[u16],
    rows: usize,
    p_row: usize,
    v: &[u32],
    pairs: usize,
    d: usize,
    out: &mut [i64],
    finish: Option<Finish<'_>>,
) {
    assert!(available(), "AVX2 tiles on a CPU without them");
    let lengths = (p.len(), v.len(), out.len());
    assert!(d.is_multiple_of(W) && weighted_sum_fits(lengths, rows, p_row, pairs, d));
    // An i64 sum has no conversion to f32 in AVX2: the tiles finish only whole sums of
    // one chunk.
    assert!(finish.is_none() || pairs <= SUM_CHUNK);
    let finish = finish.map(|f| f.at(rows, d));
    // SAFETY: AVX2 (checked above); p holds `rows` rows of `2 · pairs` weights `p_row`
    // apart, v `pairs` rows of `d` pairs, out `rows` rows of `d`, and with `finish`, its
    // `d` scales, `rows` inverses and `rows` rows of `d` outputs `out_stride` apart
    // (checked above).
    unsafe {
        weighted_sum_tiles(
            p.as_ptr(),
            rows,
            p_row,
            v.as_ptr(),
            pairs,
            d,
            out.as_mut_ptr(),
            finish,
        )
    }
}

/// The tiles in `super::int13::sum_tiles`' walk: each tile's i32 sums of a chunk, then
/// added to its i64 sums (stored on the first chunk); with `finish` (one chunk), the
/// outputs instead.
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn weighted_sum_tiles(
    p: *const u16,
    rows: usize,
    p_row: usize,
    v: *const u32,
    pairs: usize,
    d: usize,
    out: *mut i64,
    finish: Option<FinishAt>,
) {
    for t in sum_tiles(rows, pairs, d, MR, (NV * W, W)) {
        // SAFETY: the tile's rows ≤ rows of p and out, its pairs ≤ pairs of v, its
        // channels ≤ d (`sum_tiles` keeps every tile inside its shape; the caller's sizes);
        // with `finish`: the scales of the tile's channels, the inverses of its rows, its
        // outputs (the caller's sizes).
        unsafe {
            let w = p.add(t.r * p_row + 2 * t.j0);
            let (vt, o) = (v.add(t.j0 * d + t.c0), out.add(t.r * d + t.c0));
            let f = finish.map(|f| finish_tile(f, t.r, t.c0));
            let s = (p_row, d, t.pairs, t.first, f);
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
/// the i32 sums stored to, or added to, the i64 sums `out` (row `r` at `r · d`). With
/// `finish` (the only chunk), each sum is converted to f32 (to nearest even, as
/// `super::int13::finish`'s conversion of the same integer), times its channel's scale,
/// times its row's `1 / total`, and stored as an output instead.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn sum_tile<const R: usize, const N: usize>(
    w: *const u16,
    v: *const u32,
    out: *mut i64,
    (p_row, d, pairs, first, finish): (usize, usize, usize, bool, Option<FinishAt>),
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
            // SAFETY: the tile's own sums, 8 i64 a vector of channels, and with `finish` its
            // 8 channels' scales, its row's inverse and 8 outputs (the caller's sizes).
            unsafe {
                if let Some((scales, inv, y, stride)) = finish {
                    let s = _mm256_loadu_ps(scales.add(n * W));
                    let sums = _mm256_cvtepi32_ps(a);
                    let scaled = _mm256_mul_ps(_mm256_mul_ps(sums, s), _mm256_set1_ps(*inv.add(r)));
                    _mm256_storeu_ps(y.add(r * stride + n * W), scaled);
                    continue;
                }
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

/// `super::bf16`'s int13 softmax of a text within the window (every row's own keys the
/// first `len` of its `width` scores, its max given in `maxes`) in AVX2, as
/// `x86_int13::softmax_whole` runs it on AVX-512: each row's blocks of 16 in order, their
/// exps (`super::bf16::exp2_nonpositive`'s steps) added lane by lane to the row's partial
/// sums, the last block's lanes past `len` as zeros, weights `rint(4095 · e)`, zero weights
/// past the last block; each row's `1 / total` from its partial sums added in lane order,
/// 16 rows side by side. The portable rows' operations in their order: the same bits.
pub(crate) fn softmax_whole(
    s: &[f32],
    width: usize,
    rows: usize,
    len: usize,
    (c, maxes): (f32, &[f32]),
    p: &mut [u16],
    inv: &mut [f32],
) {
    assert!(available(), "AVX2 tiles on a CPU without them");
    assert!(width.is_multiple_of(LANES) && len <= width);
    let size = rows.checked_mul(width).expect("a block of scores");
    assert!(s.len() >= size && p.len() >= size && maxes.len() >= rows && inv.len() >= rows);
    // SAFETY: AVX2 (checked above); the body reads and writes through slices only.
    unsafe { softmax_whole_rows(s, width, rows, len, (c, maxes), p, inv) }
}

#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
fn softmax_whole_rows(
    s: &[f32],
    width: usize,
    rows: usize,
    len: usize,
    (c, maxes): (f32, &[f32]),
    p: &mut [u16],
    inv: &mut [f32],
) {
    let (blocks, whole) = (len.div_ceil(LANES), len / LANES);
    // The own lanes of a last block that `len` ends in, as masks of each half.
    let tail = [
        first_lanes(len % LANES),
        first_lanes((len % LANES).saturating_sub(W)),
    ];
    // Lane i of row r's partial sums at `columns[i][r % 16]`, for up to 16 rows.
    let mut columns = [[0.0f32; LANES]; LANES];
    for r in 0..rows {
        let cm = (_mm256_set1_ps(c), _mm256_set1_ps(maxes[r] * c));
        let scores = s[r * width..(r + 1) * width].as_chunks::<LANES>().0;
        let weights = p[r * width..(r + 1) * width].as_chunks_mut::<LANES>().0;
        let mut acc = [_mm256_setzero_ps(); 2];
        for b in 0..blocks {
            let mut e = exps(&scores[b], cm);
            if b == whole {
                e[0] = _mm256_and_ps(e[0], tail[0]);
                e[1] = _mm256_and_ps(e[1], tail[1]);
            }
            acc[0] = _mm256_add_ps(acc[0], e[0]);
            acc[1] = _mm256_add_ps(acc[1], e[1]);
            store_weights(&mut weights[b], e);
        }
        weights[blocks..].iter_mut().for_each(|w| w.fill(0));
        let mut partial = [0.0f32; LANES];
        let (lo, hi) = partial.split_at_mut(W);
        // SAFETY: each half of `partial` is 8 f32s.
        unsafe {
            _mm256_storeu_ps(lo.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(hi.as_mut_ptr(), acc[1]);
        }
        super::bf16::row_totals(&mut columns, &partial, (r, rows), inv);
    }
}

/// The exps of a block of 16 scores, `2^(x · c − max)` in `super::bf16::exp2_nonpositive`'s
/// steps (no fused multiply-add; `rint` by `vroundps`, as the 1.5 · 2²³ addition rounds
/// there; 2ⁿ from the exponent bits), two vectors of 8.
#[target_feature(enable = "avx2")]
#[inline]
fn exps(block: &[f32; LANES], (c, max): (__m256, __m256)) -> [__m256; 2] {
    let [b1, b2, b3, b4] = super::bf16::EXP2_COEFFICIENTS;
    let (b1, b2, b3, b4) = (
        _mm256_set1_ps(b1),
        _mm256_set1_ps(b2),
        _mm256_set1_ps(b3),
        _mm256_set1_ps(b4),
    );
    // `if −125.5 > y { −125.5 } else { y }`: vmaxps(a, b) is `a > b ? a : b` (a NaN y stays).
    let floor = _mm256_set1_ps(-125.5);
    let one = _mm256_set1_ps(1.0);
    let mut e = [_mm256_setzero_ps(); 2];
    for (h, e) in e.iter_mut().enumerate() {
        // SAFETY: 8 of the block's 16 scores.
        let x = unsafe { _mm256_loadu_ps(block.as_ptr().add(h * W)) };
        let y = _mm256_max_ps(floor, _mm256_sub_ps(_mm256_mul_ps(x, c), max));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(y);
        let f = _mm256_sub_ps(y, n);
        let mut p = _mm256_mul_ps(f, b4);
        p = _mm256_mul_ps(f, _mm256_add_ps(b3, p));
        p = _mm256_mul_ps(f, _mm256_add_ps(b2, p));
        p = _mm256_mul_ps(f, _mm256_add_ps(b1, p));
        // 2ⁿ for n in −126..=0 (a normal f32; a NaN y gives some finite n here and a NaN
        // product, as in the portable steps).
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        *e = _mm256_mul_ps(_mm256_add_ps(one, p), _mm256_castsi256_ps(bits));
    }
    e
}

/// The weights `rint(4095 · e)` of 16 exps into `w` (`vcvtps2dq` rounds to nearest even,
/// as the portable addition of 1.5 · 2²³ does; 0..=4,095 fit 16 bits).
#[target_feature(enable = "avx2")]
#[inline]
fn store_weights(w: &mut [u16; LANES], e: [__m256; 2]) {
    let levels = _mm256_set1_ps(super::int13::LEVELS_F32);
    let lo = _mm256_cvtps_epi32(_mm256_mul_ps(e[0], levels));
    let hi = _mm256_cvtps_epi32(_mm256_mul_ps(e[1], levels));
    // packus interleaves the halves by 128-bit lane: quads lo₀₋₃, hi₀₋₃, lo₄₋₇, hi₄₋₇.
    let words = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(lo, hi));
    // SAFETY: `w` is 16 u16s, 32 bytes.
    unsafe { _mm256_storeu_si256(w.as_mut_ptr().cast(), words) };
}

/// `super::int13::pack_queries` in AVX2 vectors (for CPUs without AVX-512BW); `d` a
/// multiple of 16. The portable packer's bytes.
pub(crate) fn pack_queries(
    q: &[f32],
    stride: usize,
    rows: usize,
    d: usize,
    out: &mut Vec<u32>,
    scales: &mut Vec<f32>,
) {
    assert!(available(), "AVX2 packers on a CPU without them");
    assert!(d.is_multiple_of(LANES) && holds_rows(q.len(), rows, stride, d));
    // SAFETY: AVX2 (checked above); the body reads and writes through slices only.
    unsafe { pack_queries_avx2(q, stride, rows, d, out, scales) }
}

#[target_feature(enable = "avx2")]
fn pack_queries_avx2(
    q: &[f32],
    stride: usize,
    rows: usize,
    d: usize,
    out: &mut Vec<u32>,
    scales: &mut Vec<f32>,
) {
    let half = d / 2;
    // Every value is written below: the buffers are sized, not cleared.
    out.resize(rows * half, 0);
    scales.resize(rows.next_multiple_of(LANES), 0.0);
    let mut t = [0.0f32; LANES];
    for (g, s) in scales.as_chunks_mut::<LANES>().0.iter_mut().enumerate() {
        let (first, n) = (g * LANES, (rows - g * LANES).min(LANES));
        group_quantizers(q, stride, (first, n), d, &mut t, s);
        for (i, &t) in t.iter().enumerate().take(n) {
            let r = first + i;
            let row = q[r * stride..r * stride + d].as_chunks::<LANES>().0;
            let o = out[r * half..(r + 1) * half].as_chunks_mut::<W>().0;
            for (o, x) in o.iter_mut().zip(row) {
                store_u32(o, quantize_pairs(x, _mm256_set1_ps(t)));
            }
        }
    }
    scales.truncate(rows);
}

/// `super::int13::pack_keys` in AVX2 vectors (for CPUs without AVX-512BW); `d` a multiple
/// of 16. The portable packer's bytes.
pub(crate) fn pack_keys(
    k: &[f32],
    stride: usize,
    len: usize,
    d: usize,
    out: &mut Aligned<u32>,
    scales: &mut Aligned<f32>,
) {
    assert!(available(), "AVX2 packers on a CPU without them");
    assert!(d.is_multiple_of(LANES) && holds_rows(k.len(), len, stride, d));
    // SAFETY: AVX2 (checked above); the body reads and writes through slices only.
    unsafe { pack_keys_avx2(k, stride, len, d, out, scales) }
}

#[target_feature(enable = "avx2")]
fn pack_keys_avx2(
    k: &[f32],
    stride: usize,
    len: usize,
    d: usize,
    out: &mut Aligned<u32>,
    scales: &mut Aligned<f32>,
) {
    let half = d / 2;
    let groups = len.div_ceil(LANES);
    // Every value is written below (zeros past the last key): sized, not cleared.
    out.resize_for_overwrite(groups * half * LANES);
    scales.resize_for_overwrite(groups * LANES);
    let mut t = [0.0f32; LANES];
    let groups_out = out.chunks_exact_mut(half * LANES);
    for ((g, s), lanes) in scales
        .as_chunks_mut::<LANES>()
        .0
        .iter_mut()
        .enumerate()
        .zip(groups_out)
    {
        let (first, n) = (g * LANES, (len - g * LANES).min(LANES));
        group_quantizers(k, stride, (first, n), d, &mut t, s);
        // 8 pairs of each of the group's keys in a vector (zeros past the last key); the
        // group's keys 0–7, then 8–15, transposed: a vector for each pair, its lanes the
        // keys, the two halves of the pair's 16 lanes.
        for (c, lanes) in lanes.chunks_exact_mut(W * LANES).enumerate() {
            let mut keys = [_mm256_setzero_si256(); LANES];
            for ((key, &t), j) in keys.iter_mut().zip(&t).take(n).zip(first..) {
                let x = &k[j * stride + 2 * c * W..j * stride + 2 * (c + 1) * W];
                let x: &[f32; LANES] = x.try_into().expect("16 values");
                *key = quantize_pairs(x, _mm256_set1_ps(t));
            }
            let (lo, hi) = keys.split_at(W);
            let (lo, hi) = (transpose8(lo), transpose8(hi));
            let pairs = lanes.as_chunks_mut::<W>().0;
            for (p, o) in pairs.chunks_exact_mut(2).enumerate() {
                store_u32(&mut o[0], lo[p]);
                store_u32(&mut o[1], hi[p]);
            }
        }
    }
}

/// `super::int13::pack_values` in AVX2 vectors (for CPUs without AVX-512BW); `d` a
/// multiple of 8. The portable packer's bytes.
pub(crate) fn pack_values(
    v: &[f32],
    stride: usize,
    len: usize,
    d: usize,
    out: &mut Aligned<u32>,
    scales: &mut Vec<f32>,
) {
    assert!(available(), "AVX2 packers on a CPU without them");
    assert!(d.is_multiple_of(W) && holds_rows(v.len(), len, stride, d));
    // SAFETY: AVX2 (checked above); the body reads and writes through slices only.
    unsafe { pack_values_avx2(v, stride, len, d, out, scales) }
}

#[target_feature(enable = "avx2")]
fn pack_values_avx2(
    v: &[f32],
    stride: usize,
    len: usize,
    d: usize,
    out: &mut Aligned<u32>,
    scales: &mut Vec<f32>,
) {
    let row = |j: usize| &v[j * stride..j * stride + d];
    // As the portable packer: the channels' scales, and past them their largest magnitudes'
    // bits, then their multipliers (every value written below: sized, not cleared).
    scales.resize(2 * d, 0.0);
    let (s, t) = scales.split_at_mut(d);
    // The maxes of up to MAX_VECTORS vectors of channels in registers, key after key.
    let abs = _mm256_set1_epi32(0x7fff_ffff);
    for (c, m) in t.chunks_mut(MAX_VECTORS * W).enumerate() {
        let lo = c * MAX_VECTORS * W;
        let mut acc = [_mm256_setzero_si256(); MAX_VECTORS];
        for j in 0..len {
            if c == 0 {
                prefetch_ahead(v, j, stride, d);
            }
            let x = row(j)[lo..lo + m.len()].as_chunks::<W>().0;
            for (a, x) in acc.iter_mut().zip(x) {
                *a = _mm256_max_epu32(*a, _mm256_and_si256(load_bits(x), abs));
            }
        }
        for (m, &a) in m.as_chunks_mut::<W>().0.iter_mut().zip(&acc) {
            store_f32(m, _mm256_castsi256_ps(a));
        }
    }
    debug_assert!(t.iter().all(|m| m.to_bits() == abs_bits(*m)));
    quantizers(t, s);
    s.iter_mut().for_each(|s| *s /= LEVELS_F32);
    out.resize_for_overwrite(len.div_ceil(2) * d);
    let t = t.as_chunks::<W>().0;
    let low = _mm256_set1_epi32(0xffff);
    for (p, o) in out.chunks_exact_mut(d).enumerate() {
        let even = row(2 * p).as_chunks::<W>().0;
        let odd = if 2 * p + 1 < len {
            Some(row(2 * p + 1).as_chunks::<W>().0)
        } else {
            None
        };
        for (c, o) in o.as_chunks_mut::<W>().0.iter_mut().enumerate() {
            let m = load_f32(&t[c]);
            let even = quantize(load_f32(&even[c]), m);
            // (A match, not a closure: a closure is compiled without this function's
            // features.)
            let odd = match odd {
                Some(x) => quantize(load_f32(&x[c]), m),
                None => _mm256_setzero_si256(),
            };
            let pairs = _mm256_or_si256(_mm256_and_si256(even, low), _mm256_slli_epi32::<16>(odd));
            store_u32(o, pairs);
        }
    }
    scales.truncate(d);
}

/// Vectors of channels whose largest magnitudes [`pack_values`] keeps in registers at once.
const MAX_VECTORS: usize = 8;

/// `super::int13::quantize` of 8 values: `x · t` clamped to ±L (as `f32::clamp`: a NaN
/// stays NaN), plus 1.5 · 2²³, the integer read from the sum's bits (in the low 16 bits of
/// each lane, as the portable packers' `as i16` reads it).
#[target_feature(enable = "avx2")]
#[inline]
fn quantize(x: __m256, t: __m256) -> __m256i {
    let magic = crate::math::ROUND_MAGIC;
    let y = _mm256_mul_ps(x, t);
    // vmaxps(a, b) is `a > b ? a : b` and vminps(a, b) `a < b ? a : b`: a NaN in y is kept.
    let y = _mm256_max_ps(_mm256_set1_ps(-LEVELS_F32), y);
    let y = _mm256_min_ps(_mm256_set1_ps(LEVELS_F32), y);
    let y = _mm256_add_ps(y, _mm256_set1_ps(magic));
    _mm256_sub_epi32(
        _mm256_castps_si256(y),
        _mm256_set1_epi32(magic.to_bits() as i32),
    )
}

/// 16 values quantized with the multiplier `t` as 8 pairs: `pair(x[2c], x[2c + 1])` in
/// lane `c` (each i32 cut to its low 16 bits, the 16 in order).
#[target_feature(enable = "avx2")]
#[inline]
fn quantize_pairs(x: &[f32; LANES], t: __m256) -> __m256i {
    let (a, b) = x.split_at(W);
    let low = _mm256_set1_epi32(0xffff);
    let a = _mm256_and_si256(quantize(load_f32(a.try_into().expect("8")), t), low);
    let b = _mm256_and_si256(quantize(load_f32(b.try_into().expect("8")), t), low);
    // packus takes the (now unsigned 16-bit) lanes exactly, interleaving the halves by
    // 128-bit lane: quads a₀₋₃, b₀₋₃, a₄₋₇, b₄₋₇.
    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(a, b))
}

/// The 8 × 8 transpose of 32-bit lanes: lane `i` of output `c` is lane `c` of input `i`.
#[target_feature(enable = "avx2")]
#[inline]
fn transpose8(rows: &[__m256i]) -> [__m256i; W] {
    let r: [__m256i; W] = rows.try_into().expect("8 vectors");
    // Pairs of rows interleaved by 32 bits, then by 64, then the 128-bit halves swapped.
    let a = [
        _mm256_unpacklo_epi32(r[0], r[1]),
        _mm256_unpackhi_epi32(r[0], r[1]),
        _mm256_unpacklo_epi32(r[2], r[3]),
        _mm256_unpackhi_epi32(r[2], r[3]),
        _mm256_unpacklo_epi32(r[4], r[5]),
        _mm256_unpackhi_epi32(r[4], r[5]),
        _mm256_unpacklo_epi32(r[6], r[7]),
        _mm256_unpackhi_epi32(r[6], r[7]),
    ];
    let b = [
        _mm256_unpacklo_epi64(a[0], a[2]),
        _mm256_unpackhi_epi64(a[0], a[2]),
        _mm256_unpacklo_epi64(a[1], a[3]),
        _mm256_unpackhi_epi64(a[1], a[3]),
        _mm256_unpacklo_epi64(a[4], a[6]),
        _mm256_unpackhi_epi64(a[4], a[6]),
        _mm256_unpacklo_epi64(a[5], a[7]),
        _mm256_unpackhi_epi64(a[5], a[7]),
    ];
    [
        _mm256_permute2x128_si256::<0x20>(b[0], b[4]),
        _mm256_permute2x128_si256::<0x20>(b[1], b[5]),
        _mm256_permute2x128_si256::<0x20>(b[2], b[6]),
        _mm256_permute2x128_si256::<0x20>(b[3], b[7]),
        _mm256_permute2x128_si256::<0x31>(b[0], b[4]),
        _mm256_permute2x128_si256::<0x31>(b[1], b[5]),
        _mm256_permute2x128_si256::<0x31>(b[2], b[6]),
        _mm256_permute2x128_si256::<0x31>(b[3], b[7]),
    ]
}

/// 8 f32.
#[target_feature(enable = "avx2")]
#[inline]
fn load_f32(x: &[f32; W]) -> __m256 {
    // SAFETY: 8 values.
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

/// 8 lanes' bits.
#[target_feature(enable = "avx2")]
#[inline]
fn load_bits(x: &[f32; W]) -> __m256i {
    // SAFETY: 8 values.
    unsafe { _mm256_loadu_si256(x.as_ptr().cast()) }
}

/// `v` into `o`.
#[target_feature(enable = "avx2")]
#[inline]
fn store_f32(o: &mut [f32; W], v: __m256) {
    // SAFETY: 8 values.
    unsafe { _mm256_storeu_ps(o.as_mut_ptr(), v) }
}

/// `v`'s lanes into `o`.
#[target_feature(enable = "avx2")]
#[inline]
fn store_u32(o: &mut [u32; W], v: __m256i) {
    // SAFETY: 8 values.
    unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), v) }
}
