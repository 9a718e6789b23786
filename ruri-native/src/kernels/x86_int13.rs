//! AVX-512 VNNI tiles of [`AttentionPrecision::Int13`](crate::AttentionPrecision::Int13)'s
//! two products ([`super::int13`] defines them): `vpdpwssd` adds the two products of a pair
//! of 16-bit integers to each i32 lane, 32 multiply-adds an instruction, exactly. The sums are
//! integers that cannot overflow (`super::int13::TILE_MAX_D`, `SUM_CHUNK`), so any order of
//! them gives the portable loops' bits; the scores' conversion and scaling are the same IEEE
//! steps in the same order.
//!
//! Each public function checks that the CPU has the instructions and that every buffer holds
//! what its loops read or write; the `unsafe` blocks rely on nothing else.

use std::arch::x86_64::*;

use super::aligned::Aligned;
use super::bf16::LANES;
use super::int13::{FinishAt, abs_bits, finish_tile, group_quantizers, prefetch_ahead, quantizers};
use super::int13::{LEVELS_F32, TILE_MAX_D, scores_fit, sum_tiles, weighted_sum_fits};
use super::simd_f32::holds_rows;

/// Query rows per tile of scores and of weighted sums.
const MR: usize = 4;
/// Vectors of keys (scores) or of channels (weighted sums) per tile.
const NV: usize = 4;

/// Whether this CPU has the instructions the tiles use.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && std::arch::is_x86_feature_detected!("avx512vnni")
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
    row_max: Option<(&mut [f32], usize)>,
) {
    assert!(available(), "AVX-512 VNNI tiles on a CPU without them");
    let lengths = (q.len(), sq.len(), kt.len(), sk.len(), out.len());
    assert!(d <= TILE_MAX_D && scores_fit(lengths, rows, d, g_lo, groups));
    let half = d / 2;
    super::x86_bf16::by_row_lanes(rows, row_max, |r0, n, lanes| {
        // SAFETY: AVX-512F/BW/VNNI (checked above); q holds rows r0..r0 + n < rows of `half`
        // pairs and sq their scales, kt and sk the groups g_lo..g_lo + groups, out `rows`
        // rows of `groups · 16` (`scores_fit`, checked above), lanes (not null) 16 maxes for
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

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
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
        let nv = (groups - g0).min(NV);
        let mut r = 0;
        while r < rows {
            let mr = if rows - r >= MR { MR } else { 1 };
            // SAFETY: rows r..r + mr < rows of q, sq and out (and of the maxes, if not
            // null), groups g0..g0 + nv < groups of kt, sk and out's rows (the caller's
            // sizes).
            unsafe {
                let (qt, s) = (q.add(r * half), sq.add(r));
                let (k, ks) = (kt.add(g0 * half * LANES), sk.add(g0 * LANES));
                let o = out.add(r * width + g0 * LANES);
                let m = if max.is_null() {
                    max
                } else {
                    max.add(r * LANES)
                };
                let valid = |n: usize| keys.saturating_sub((g0 + n) * LANES);
                let at = |n: usize| (k.add(n * half * LANES), ks.add(n * LANES), o.add(n * LANES));
                match (mr, nv) {
                    (MR, NV) => score_tile::<MR, NV>(qt, s, half, at(0), width, (m, valid(0))),
                    (MR, _) => (0..nv).for_each(|n| {
                        score_tile::<MR, 1>(qt, s, half, at(n), width, (m, valid(n)))
                    }),
                    (_, NV) => score_tile::<1, NV>(qt, s, half, at(0), width, (m, valid(0))),
                    _ => (0..nv)
                        .for_each(|n| score_tile::<1, 1>(qt, s, half, at(n), width, (m, valid(n)))),
                }
            }
            r += mr;
        }
        g0 += nv;
    }
}

/// `R` queries (`half` pairs each, consecutive; scales `sq`) against `N` groups of keys
/// (`half · 16` pairs apart; scales `sk`, 16 a group): each score the exact i32 dot
/// product, converted, times the key's scale, times the query's; stored in rows of `width`
/// at `out`, and with `max` not null folded into the rows' lanes of maxes (see
/// `x86_bf16::store_scores`).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn score_tile<const R: usize, const N: usize>(
    q: *const u32,
    sq: *const f32,
    half: usize,
    (kt, sk, out): (*const u32, *const f32, *mut f32),
    width: usize,
    max: (*mut f32, usize),
) {
    let mut acc = [[_mm512_setzero_si512(); N]; R];
    for c in 0..half {
        // SAFETY: c < half: pair c of each of the tile's groups and queries.
        unsafe {
            let k: [__m512i; N] =
                std::array::from_fn(|n| _mm512_loadu_si512(kt.add((n * half + c) * LANES).cast()));
            for (r, acc) in acc.iter_mut().enumerate() {
                let qv = _mm512_set1_epi32(*q.add(r * half + c) as i32);
                for (a, &k) in acc.iter_mut().zip(&k) {
                    *a = _mm512_dpwssd_epi32(*a, qv, k);
                }
            }
        }
    }
    // SAFETY: the scales of the tile's groups and of its rows (the caller's sizes).
    let (ks, qs): ([__m512; N], [__m512; R]) = unsafe {
        (
            std::array::from_fn(|n| _mm512_loadu_ps(sk.add(n * LANES))),
            std::array::from_fn(|r| _mm512_set1_ps(*sq.add(r))),
        )
    };
    let scores: [[__m512; N]; R] = std::array::from_fn(|r| {
        std::array::from_fn(|n| {
            _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][n]), ks[n]), qs[r])
        })
    });
    // SAFETY: the tile's scores and maxes (the caller's sizes).
    unsafe { super::x86_bf16::store_scores(&scores, out, width, max) }
}

/// The softmax's blocks of own keys (`super::bf16`'s `softmax_int13`, the blocks with no
/// other keys): lane `i` of each block in turn, `e = exp2_nonpositive(x · c − max)` in
/// `x86_bf16`'s steps (the portable ones' bits, BENCHMARKS.md sixteenth step), added to
/// `partial[i]`, and its weight `rint(4095 · e)` by `vcvtps2dq` (to nearest even, as the
/// portable steps round) narrowed to 16 bits. (A NaN score gives some weight either way,
/// and makes the row's total, so every output of the row, NaN.)
pub(crate) fn softmax_blocks(
    blocks: &[[f32; LANES]],
    weights: &mut [[u16; LANES]],
    (c, max): (f32, f32),
    partial: &mut [f32; LANES],
) {
    assert!(available(), "AVX-512 tiles on a CPU without them");
    assert_eq!(blocks.len(), weights.len());
    // SAFETY: the CPU has AVX-512F (checked above); the loop reads blocks[..n] and writes
    // weights[..n], n = blocks.len() = weights.len() (checked above).
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

#[target_feature(enable = "avx512f")]
unsafe fn softmax_tiles(
    x: *const f32,
    w: *mut u16,
    n: usize,
    (c, max): (f32, f32),
    partial: &mut [f32; LANES],
) {
    let cm = (_mm512_set1_ps(c), _mm512_set1_ps(max));
    let levels = _mm512_set1_ps(super::int13::LEVELS_F32);
    let weights = |e: __m512| _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(e, levels)));
    // SAFETY: `partial` is 16 f32s.
    let mut acc = unsafe { _mm512_loadu_ps(partial.as_ptr()) };
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: blocks i..i + 4 ≤ n.
        let e = unsafe { super::x86_bf16::exps::<4>(x.add(i * LANES), cm, &mut acc) };
        for (k, &e) in e.iter().enumerate() {
            // SAFETY: weights of block i + k < n, 32 bytes.
            unsafe { _mm256_storeu_si256(w.add((i + k) * LANES).cast(), weights(e)) };
        }
        i += 4;
    }
    while i < n {
        // SAFETY: block i < n.
        let [e] = unsafe { super::x86_bf16::exps::<1>(x.add(i * LANES), cm, &mut acc) };
        // SAFETY: weights of block i < n, 32 bytes.
        unsafe { _mm256_storeu_si256(w.add(i * LANES).cast(), weights(e)) };
        i += 1;
    }
    // SAFETY: `partial` is 16 f32s.
    unsafe { _mm512_storeu_ps(partial.as_mut_ptr(), acc) };
}

/// The softmax's block that holds other keys beside own ones (`super::bf16`'s masked block:
/// a short text's one block, a window's first and last): lane `i` is own where bit `i` of
/// `own` is set. Each lane's `e` is [`softmax_blocks`]' step, then 0 where not own, added to
/// `partial[i]` (a 0 leaves a total of non-negative exps as it was) and its weight into
/// `w[i]` (0 where not own), as the portable block does lane by lane.
pub(crate) fn softmax_masked_block(
    block: &[f32; LANES],
    own: u16,
    (c, max): (f32, f32),
    w: &mut [u16; LANES],
    partial: &mut [f32; LANES],
) {
    assert!(available(), "AVX-512 tiles on a CPU without them");
    // SAFETY: the CPU has AVX-512F and BW (checked above); `block`, `w` and `partial` are
    // arrays of 16 lanes, which is what the function reads and writes.
    unsafe { softmax_masked_tile(block, own, (c, max), w, partial) }
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn softmax_masked_tile(
    block: &[f32; LANES],
    own: u16,
    (c, max): (f32, f32),
    w: &mut [u16; LANES],
    partial: &mut [f32; LANES],
) {
    let cm = (_mm512_set1_ps(c), _mm512_set1_ps(max));
    let mut unused = _mm512_setzero_ps();
    // SAFETY: one block of 16 scores.
    let [e] = unsafe { super::x86_bf16::exps::<1>(block.as_ptr(), cm, &mut unused) };
    let e = _mm512_maskz_mov_ps(own, e);
    // SAFETY: `partial` is 16 f32s.
    let acc = unsafe { _mm512_loadu_ps(partial.as_ptr()) };
    // SAFETY: as above.
    unsafe { _mm512_storeu_ps(partial.as_mut_ptr(), _mm512_add_ps(acc, e)) };
    let levels = _mm512_set1_ps(super::int13::LEVELS_F32);
    let weights = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(e, levels)));
    // SAFETY: `w` is 16 u16s, 32 bytes.
    unsafe { _mm256_storeu_si256(w.as_mut_ptr().cast(), weights) };
}

/// `super::bf16`'s `softmax_int13` of `rows` rows whose own keys are all the same first
/// `len` of the row (a text within the window: every query sees every key), with each row's
/// max given: each row's blocks in order as [`softmax_blocks`] (the last one masked as
/// [`softmax_masked_block`] where `len` ends inside it), zero weights past them; then the
/// totals of 16 rows side by side, each row's lanes added in order from 0, and `1 / total`:
/// the same operations in the same order as the portable rows, with no step between the
/// blocks (the portable driver's own bookkeeping was the largest part of a query's
/// softmax).
#[allow(clippy::too_many_arguments)]
pub(crate) fn softmax_whole(
    s: &[f32],
    width: usize,
    rows: usize,
    len: usize,
    (c, maxes): (f32, &[f32]),
    p: &mut [u16],
    inv: &mut [f32],
) {
    assert!(available(), "AVX-512 tiles on a CPU without them");
    assert!(width.is_multiple_of(LANES) && len <= width);
    let size = rows.checked_mul(width).expect("a block of scores");
    assert!(s.len() >= size && p.len() >= size && maxes.len() >= rows && inv.len() >= rows);
    // SAFETY: AVX-512F/BW (checked above); the body reads and writes through slices only.
    unsafe { softmax_whole_tiles(s, width, rows, len, (c, maxes), p, inv) }
}

#[target_feature(enable = "avx512f,avx512bw")]
#[allow(clippy::too_many_arguments)]
fn softmax_whole_tiles(
    s: &[f32],
    width: usize,
    rows: usize,
    len: usize,
    (c, maxes): (f32, &[f32]),
    p: &mut [u16],
    inv: &mut [f32],
) {
    let blocks = len.div_ceil(LANES);
    // The own lanes of the last block.
    let tail = match len % LANES {
        0 => u16::MAX,
        n => (1u16 << n) - 1,
    };
    for first in (0..rows).step_by(LANES) {
        let n = (rows - first).min(LANES);
        let mut partials = [_mm512_setzero_si512(); LANES];
        for (i, partial) in partials.iter_mut().enumerate().take(n) {
            let r = first + i;
            let cm = (_mm512_set1_ps(c), _mm512_set1_ps(maxes[r] * c));
            let row = &s[r * width..(r + 1) * width];
            let w = &mut p[r * width..(r + 1) * width];
            let mut acc = _mm512_setzero_ps();
            // The blocks whose every lane is own (all but a last one that `len` ends in): four
            // at a time, their exps added to `acc` in block order, then one at a time.
            let whole = if tail == u16::MAX { blocks } else { blocks - 1 };
            let (scores, w_blocks) = (row.as_chunks::<LANES>().0, w.as_chunks_mut::<LANES>().0);
            let mut b = 0;
            while b + 4 <= whole {
                // SAFETY: AVX-512F (this function's); blocks b..b + 4 of the row's scores.
                let e = unsafe {
                    super::x86_bf16::exps::<4>(scores[b..b + 4].as_ptr().cast(), cm, &mut acc)
                };
                for (k, e) in e.into_iter().enumerate() {
                    store_weights(&mut w_blocks[b + k], e);
                }
                b += 4;
            }
            while b < blocks {
                let mut unused = _mm512_setzero_ps();
                // SAFETY: AVX-512F (this function's); block b of the row's scores.
                let [e] =
                    unsafe { super::x86_bf16::exps::<1>(scores[b].as_ptr(), cm, &mut unused) };
                let e = if b < whole {
                    e
                } else {
                    _mm512_maskz_mov_ps(tail, e)
                };
                acc = _mm512_add_ps(acc, e);
                store_weights(&mut w_blocks[b], e);
                b += 1;
            }
            w_blocks[blocks..].iter_mut().for_each(|w| w.fill(0));
            *partial = _mm512_castps_si512(acc);
        }
        // Lane i of column j is row i's partial sum j (rows past n: zeros, not kept).
        let columns = transpose(partials);
        let mut totals = _mm512_setzero_ps();
        for column in columns {
            totals = _mm512_add_ps(totals, _mm512_castsi512_ps(column));
        }
        let inverses = _mm512_div_ps(_mm512_set1_ps(1.0), totals);
        let out = &mut inv[first..first + n];
        let lanes = if n == LANES {
            u16::MAX
        } else {
            (1u16 << n) - 1
        };
        // SAFETY: the first n of the 16 lanes, into n values.
        unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr(), lanes, inverses) };
    }
}

/// The weights `rint(4095 · e)` of 16 exps into `w` (as [`softmax_blocks`] makes them).
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn store_weights(w: &mut [u16; LANES], e: __m512) {
    let levels = _mm512_set1_ps(super::int13::LEVELS_F32);
    let weights = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(e, levels)));
    // SAFETY: `w` is 16 u16s, 32 bytes.
    unsafe { _mm256_storeu_si256(w.as_mut_ptr().cast(), weights) };
}

/// Row `r`'s 16 whole sums of channel vector `n` of a tile (converted to f32), times their
/// channels' scales, times the row's `1 / total`, stored as its outputs.
///
/// # Safety
/// `f` (at the tile's first row and channel) holds the scales of channels `16n..16n + 16`,
/// row `r`'s inverse and row `r`'s 16 outputs from channel `16n`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store_outputs(sums: __m512, (scales, inv, y, stride): FinishAt, r: usize, n: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        let s = _mm512_loadu_ps(scales.add(n * LANES));
        let scaled = _mm512_mul_ps(_mm512_mul_ps(sums, s), _mm512_set1_ps(*inv.add(r)));
        _mm512_storeu_ps(y.add(r * stride + n * LANES), scaled);
    }
}

/// `super::int13::Products::weighted_sum` on the tiles; `d` a multiple of 16. With
/// `finish`, `super::int13::Products::weighted_average`'s outputs as well: the last chunk's
/// tiles convert each row's sums and scale them as `super::int13::finish` does.
#[allow(clippy::too_many_arguments)]
pub(crate) fn weighted_sum(
    p: &[u16],
    rows: usize,
    p_row: usize,
    v: &[u32],
    pairs: usize,
    d: usize,
    out: &mut [i64],
    finish: Option<super::int13::Finish<'_>>,
) {
    assert!(available(), "AVX-512 VNNI tiles on a CPU without them");
    let lengths = (p.len(), v.len(), out.len());
    assert!(d.is_multiple_of(LANES) && weighted_sum_fits(lengths, rows, p_row, pairs, d));
    let finish = finish.map(|f| f.at(rows, d));
    // SAFETY: AVX-512F/BW/DQ/VNNI (checked above); p holds `rows` rows of `2 · pairs`
    // weights `p_row` apart, v `pairs` rows of `d` pairs, out `rows` rows of `d`, and with
    // `finish`, its `d` scales, `rows` inverses and `rows` rows of `d` outputs `out_stride`
    // apart (checked above).
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
/// added to its i64 sums (stored on the first chunk); with `finish`, the last chunk's tiles
/// write the outputs too.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni")]
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
    for t in sum_tiles(rows, pairs, d, MR, (NV * LANES, LANES)) {
        // SAFETY: the tile's rows ≤ rows of p and out, its pairs ≤ pairs of v, its
        // channels ≤ d (`sum_tiles` keeps every tile inside its shape; the caller's sizes);
        // with `finish` on the last chunk: the scales of the tile's channels, the inverses
        // of its rows, its outputs (the caller's sizes).
        unsafe {
            let w = p.add(t.r * p_row + 2 * t.j0);
            let (vt, o) = (v.add(t.j0 * d + t.c0), out.add(t.r * d + t.c0));
            let f = finish.filter(|_| t.last).map(|f| finish_tile(f, t.r, t.c0));
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

/// `R` rows × `N` vectors of channels over `pairs` (≤ `SUM_CHUNK`) key pairs: weights `w`
/// (row `r`'s pair `j` at `r · p_row + 2j`), values `v` (pair `j`'s channels at `j · d`);
/// the i32 sums stored to, or added to, the i64 sums `out` (row `r` at `r · d`). With
/// `finish` (the last chunk), each whole sum is converted to f32 (to nearest even, as
/// `super::int13::finish`'s conversion: from the i32 sums on a first chunk, from the i64 ones
/// by `vcvtqq2ps` after), times its channel's scale, times its row's `1 / total`, and stored
/// as an output instead.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni")]
#[inline]
unsafe fn sum_tile<const R: usize, const N: usize>(
    w: *const u16,
    v: *const u32,
    out: *mut i64,
    (p_row, d, pairs, first, finish): (usize, usize, usize, bool, Option<FinishAt>),
) {
    let mut acc = [[_mm512_setzero_si512(); N]; R];
    for j in 0..pairs {
        // SAFETY: j < pairs: pair j's values of the tile's channels, and weights 2j and
        // 2j + 1 of each of its rows (read as one unaligned u32).
        unsafe {
            let x: [__m512i; N] =
                std::array::from_fn(|n| _mm512_loadu_si512(v.add(j * d + n * LANES).cast()));
            for (r, acc) in acc.iter_mut().enumerate() {
                let two = w.add(r * p_row + 2 * j).cast::<u32>().read_unaligned();
                let wv = _mm512_set1_epi32(two as i32);
                for (a, &x) in acc.iter_mut().zip(&x) {
                    *a = _mm512_dpwssd_epi32(*a, wv, x);
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (n, &a) in acc.iter().enumerate() {
            // SAFETY: the tile's own sums, 16 i64 a vector of channels, and with `finish` its
            // 16 channels' scales, its row's inverse and 16 outputs (the caller's sizes).
            unsafe {
                let o = out.add(r * d + n * LANES);
                if let (Some(f), true) = (finish, first) {
                    store_outputs(_mm512_cvtepi32_ps(a), f, r, n);
                    continue;
                }
                let lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(a));
                let hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64::<1>(a));
                let (lo, hi) = if first {
                    (lo, hi)
                } else {
                    (
                        _mm512_add_epi64(lo, _mm512_loadu_si512(o.cast())),
                        _mm512_add_epi64(hi, _mm512_loadu_si512(o.add(8).cast())),
                    )
                };
                if let Some(f) = finish {
                    let sums = _mm512_insertf32x8::<1>(
                        _mm512_castps256_ps512(_mm512_cvtepi64_ps(lo)),
                        _mm512_cvtepi64_ps(hi),
                    );
                    store_outputs(sums, f, r, n);
                    continue;
                }
                _mm512_storeu_si512(o.cast(), lo);
                _mm512_storeu_si512(o.add(8).cast(), hi);
            }
        }
    }
}

/// Whether this CPU has the instructions the packers use (AVX-512F and BW).
pub(crate) fn packers_available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
}

/// `super::int13::pack_queries` in vectors; `d` a multiple of 32.
pub(crate) fn pack_queries(
    q: &[f32],
    stride: usize,
    rows: usize,
    d: usize,
    out: &mut Vec<u32>,
    scales: &mut Vec<f32>,
) {
    assert!(packers_available(), "AVX-512 packers on a CPU without them");
    assert!(d.is_multiple_of(2 * LANES) && holds_rows(q.len(), rows, stride, d));
    // SAFETY: AVX-512F/BW (checked above); the body reads and writes through slices only.
    unsafe { pack_queries_avx512(q, stride, rows, d, out, scales) }
}

#[target_feature(enable = "avx512f,avx512bw")]
fn pack_queries_avx512(
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
            let row = &q[r * stride..r * stride + d];
            let o = &mut out[r * half..(r + 1) * half];
            for (o, x) in o.chunks_exact_mut(LANES).zip(row.chunks_exact(2 * LANES)) {
                store_u32(o, quantize_pairs(x, _mm512_set1_ps(t)));
            }
        }
    }
    scales.truncate(rows);
}

/// `super::int13::pack_keys` in vectors; `d` a multiple of 32.
pub(crate) fn pack_keys(
    k: &[f32],
    stride: usize,
    len: usize,
    d: usize,
    out: &mut Aligned<u32>,
    scales: &mut Aligned<f32>,
) {
    assert!(packers_available(), "AVX-512 packers on a CPU without them");
    assert!(d.is_multiple_of(2 * LANES) && holds_rows(k.len(), len, stride, d));
    // SAFETY: AVX-512F/BW (checked above); the body reads and writes through slices only.
    unsafe { pack_keys_avx512(k, stride, len, d, out, scales) }
}

#[target_feature(enable = "avx512f,avx512bw")]
fn pack_keys_avx512(
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
        // 16 pairs of each of the group's keys in a vector (zeros past the last key), the
        // 16 vectors transposed: a vector for each pair, its lanes the keys.
        for (c, lanes) in lanes.chunks_exact_mut(LANES * LANES).enumerate() {
            let mut keys = [_mm512_setzero_si512(); LANES];
            for ((key, &t), j) in keys.iter_mut().zip(&t).take(n).zip(first..) {
                let x = &k[j * stride + 2 * c * LANES..j * stride + 2 * (c + 1) * LANES];
                *key = quantize_pairs(x, _mm512_set1_ps(t));
            }
            let pairs = transpose(keys);
            for (o, &p) in lanes.chunks_exact_mut(LANES).zip(&pairs) {
                store_u32(o, p);
            }
        }
    }
}

/// `super::int13::pack_values` in vectors; `d` a multiple of 16.
pub(crate) fn pack_values(
    v: &[f32],
    stride: usize,
    len: usize,
    d: usize,
    out: &mut Aligned<u32>,
    scales: &mut Vec<f32>,
) {
    assert!(packers_available(), "AVX-512 packers on a CPU without them");
    assert!(d.is_multiple_of(LANES) && holds_rows(v.len(), len, stride, d));
    // SAFETY: AVX-512F/BW (checked above); the body reads and writes through slices only.
    unsafe { pack_values_avx512(v, stride, len, d, out, scales) }
}

#[target_feature(enable = "avx512f,avx512bw")]
fn pack_values_avx512(
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
    for (c, m) in t.chunks_mut(MAX_VECTORS * LANES).enumerate() {
        let lo = c * MAX_VECTORS * LANES;
        let mut acc = [_mm512_setzero_si512(); MAX_VECTORS];
        for j in 0..len {
            if c == 0 {
                prefetch_ahead(v, j, stride, d);
            }
            let x = &row(j)[lo..lo + m.len()];
            for (a, x) in acc.iter_mut().zip(x.chunks_exact(LANES)) {
                let x = load_u32(x);
                *a = _mm512_max_epu32(*a, _mm512_and_si512(x, _mm512_set1_epi32(0x7fff_ffff)));
            }
        }
        for (m, &a) in m.chunks_exact_mut(LANES).zip(&acc) {
            store_f32(m, _mm512_castsi512_ps(a));
        }
    }
    debug_assert!(t.iter().all(|m| m.to_bits() == abs_bits(*m)));
    quantizers(t, s);
    s.iter_mut().for_each(|s| *s /= LEVELS_F32);
    out.resize_for_overwrite(len.div_ceil(2) * d);
    for (p, o) in out.chunks_exact_mut(d).enumerate() {
        let even = row(2 * p);
        let odd = if 2 * p + 1 < len {
            Some(row(2 * p + 1))
        } else {
            None
        };
        for (c, o) in o.chunks_exact_mut(LANES).enumerate() {
            let (lo, hi) = (c * LANES, (c + 1) * LANES);
            let m = load_f32(&t[lo..hi]);
            let even = quantize(load_f32(&even[lo..hi]), m);
            // (A match, not a closure: a closure is compiled without this function's
            // features.)
            let odd = match odd {
                Some(x) => quantize(load_f32(&x[lo..hi]), m),
                None => _mm512_setzero_si512(),
            };
            let pairs = _mm512_or_si512(
                _mm512_and_si512(even, _mm512_set1_epi32(0xffff)),
                _mm512_slli_epi32::<16>(odd),
            );
            store_u32(o, pairs);
        }
    }
    scales.truncate(d);
}

/// Vectors of channels whose largest magnitudes [`pack_values`] keeps in registers at once.
const MAX_VECTORS: usize = 8;

/// `super::int13::quantize` of 16 values: `x · t` clamped to ±L (as `f32::clamp`: a NaN
/// stays NaN), plus 1.5 · 2²³, the integer read from the sum's bits (in the low 16 bits of
/// each lane, as the portable packers' `as i16` reads it).
#[target_feature(enable = "avx512f")]
#[inline]
fn quantize(x: __m512, t: __m512) -> __m512i {
    let magic = crate::math::ROUND_MAGIC;
    let y = _mm512_mul_ps(x, t);
    // vmaxps(a, b) is `a > b ? a : b` and vminps(a, b) `a < b ? a : b`: a NaN in y is kept.
    let y = _mm512_max_ps(_mm512_set1_ps(-LEVELS_F32), y);
    let y = _mm512_min_ps(_mm512_set1_ps(LEVELS_F32), y);
    let y = _mm512_add_ps(y, _mm512_set1_ps(magic));
    _mm512_sub_epi32(
        _mm512_castps_si512(y),
        _mm512_set1_epi32(magic.to_bits() as i32),
    )
}

/// 32 values (`x`, at least 32) quantized with the multiplier `t` as 16 pairs:
/// `pair(x[2c], x[2c + 1])` in lane `c`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn quantize_pairs(x: &[f32], t: __m512) -> __m512i {
    let (a, b) = (load_f32(&x[..LANES]), load_f32(&x[LANES..2 * LANES]));
    // Each i32 truncated to its low 16 bits (vpmovdw), the 32 in order: lane c's two halves
    // are values 2c and 2c + 1.
    let (a, b) = (
        _mm512_cvtepi32_epi16(quantize(a, t)),
        _mm512_cvtepi32_epi16(quantize(b, t)),
    );
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
}

/// The 16 × 16 transpose of 32-bit lanes (`x86_f32`'s, on the same bits): lane `i` of
/// output `c` is lane `c` of input `i`.
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose(rows: [__m512i; LANES]) -> [__m512i; LANES] {
    // Bit casts in plain loops: `array::map`'s closures were calls, compiled without this
    // function's features.
    let mut r = [_mm512_setzero_ps(); LANES];
    for (r, &x) in r.iter_mut().zip(&rows) {
        *r = _mm512_castsi512_ps(x);
    }
    let mut out = [_mm512_setzero_si512(); LANES];
    for (o, c) in out.iter_mut().zip(super::x86_f32::transpose16(r)) {
        *o = _mm512_castps_si512(c);
    }
    out
}

/// 16 f32 from `x` (at least 16).
#[target_feature(enable = "avx512f")]
#[inline]
fn load_f32(x: &[f32]) -> __m512 {
    let x = &x[..LANES];
    // SAFETY: 16 values (just sliced).
    unsafe { _mm512_loadu_ps(x.as_ptr()) }
}

/// 16 lanes' bits from `x` (at least 16).
#[target_feature(enable = "avx512f")]
#[inline]
fn load_u32(x: &[f32]) -> __m512i {
    let x = &x[..LANES];
    // SAFETY: 16 values (just sliced).
    unsafe { _mm512_loadu_si512(x.as_ptr().cast()) }
}

/// `v` into `o` (at least 16).
#[target_feature(enable = "avx512f")]
#[inline]
fn store_f32(o: &mut [f32], v: __m512) {
    let o = &mut o[..LANES];
    // SAFETY: 16 values (just sliced).
    unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v) }
}

/// `v`'s lanes into `o` (at least 16).
#[target_feature(enable = "avx512f")]
#[inline]
fn store_u32(o: &mut [u32], v: __m512i) {
    let o = &mut o[..LANES];
    // SAFETY: 16 values (just sliced).
    unsafe { _mm512_storeu_si512(o.as_mut_ptr().cast(), v) }
}
