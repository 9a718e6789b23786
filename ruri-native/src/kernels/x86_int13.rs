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

use super::bf16::LANES;
use super::int13::{TILE_MAX_D, scores_fit, sum_tiles, weighted_sum_fits};

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
    let finish = finish.map(|f| {
        assert!(f.fits(rows, d));
        (
            f.scales.as_ptr(),
            f.inv.as_ptr(),
            f.out.as_mut_ptr(),
            f.out_stride,
        )
    });
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

/// A tile's outputs, where its sums end: the channels' scales, the rows' `1 / total`, the
/// outputs and their stride (`super::int13::Finish` as pointers, at the tile's first row and
/// channel where `sum_tile` takes it).
type FinishAt = (*const f32, *const f32, *mut f32, usize);

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
            let f = finish.filter(|_| t.last).map(|(scales, inv, out, stride)| {
                (
                    scales.add(t.c0),
                    inv.add(t.r),
                    out.add(t.r * stride + t.c0),
                    stride,
                )
            });
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
