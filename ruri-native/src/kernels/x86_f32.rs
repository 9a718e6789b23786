//! AVX-512 tiles of attention's two products, the scores `q · kᵀ` and the weighted sum
//! `p · v`. Each output gets the same multiplies and adds, in the same order, as the
//! portable bodies in [`super::simd_f32`] (a separate multiply, then an add: no FMA), so the
//! bits do not change (tested there against those bodies); the tiles only block the
//! registers, so that a tile of [`MR`] query rows shares every load of keys or values, and
//! the accumulators of a tile are independent chains instead of one.
//!
//! Each public function checks that the CPU has AVX-512F and that every buffer holds what
//! its loops read or write; the `unsafe` blocks rely on nothing else.

use std::arch::x86_64::*;

use super::simd_f32::{holds_probabilities, holds_rows};

/// Query rows per tile.
const MR: usize = 4;
/// Lanes of one vector.
const LANES: usize = 16;
/// Vectors of keys (scores) or channels (weighted sum) per tile: 16 accumulators.
const NV: usize = 4;
/// Keys of values per pass of the weighted sum: `KEY_CHUNK × d` floats stay in L1 while
/// every tile of rows goes over them.
const KEY_CHUNK: usize = 64;

/// Whether this CPU runs the tiles.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

/// `out[r][16·g + i] = Σ_c q[r][c] · kt[g_lo + g][c][i]` (c in order) for `rows` queries
/// (row `r` of `q` at `r · q_stride`) and `groups` groups of 16 keys; `kt` is
/// `[group][d][16]`, `out` is `rows × groups·16`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores(
    q: &[f32],
    q_stride: usize,
    rows: usize,
    d: usize,
    kt: &[f32],
    g_lo: usize,
    groups: usize,
    out: &mut [f32],
) {
    assert!(available(), "AVX-512 tiles on a CPU without AVX-512F");
    assert!(holds_rows(q.len(), rows, q_stride, d));
    assert!(kt.len() >= (g_lo + groups) * d * LANES);
    assert!(out.len() >= rows * groups * LANES);
    // SAFETY: the CPU runs AVX-512F (checked above). Tile (r, g0) reads
    // q[(r..r + mr) · q_stride..][..d], groups g_lo + g0..g_lo + g0 + nv of kt (≤ g_lo +
    // groups, each d·16 floats) and writes out[r..r + mr][16·g0..16·(g0 + nv)] (g0 + nv ≤
    // groups): inside the checked sizes.
    unsafe { scores_impl(q, q_stride, rows, d, kt, g_lo, groups, out) }
}

#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_impl(
    q: &[f32],
    q_stride: usize,
    rows: usize,
    d: usize,
    kt: &[f32],
    g_lo: usize,
    groups: usize,
    out: &mut [f32],
) {
    let width = groups * LANES;
    let (q, kt, out) = (q.as_ptr(), kt.as_ptr(), out.as_mut_ptr());
    let mut g0 = 0;
    while g0 < groups {
        let nv = (groups - g0).min(NV);
        let mut r = 0;
        while r < rows {
            let mr = if rows - r >= MR { MR } else { 1 };
            // SAFETY: the offsets are those of tile (r, g0), inside the buffers (see
            // `scores`).
            unsafe {
                let (qt, o) = (q.add(r * q_stride), out.add(r * width + g0 * LANES));
                let kt = kt.add((g_lo + g0) * d * LANES);
                let group = d * LANES;
                let qs = q_stride;
                match (mr, nv) {
                    (MR, NV) => scores_tile::<MR, NV>(qt, qs, d, kt, o, width),
                    (MR, _) => {
                        for n in 0..nv {
                            let (kt, o) = (kt.add(n * group), o.add(n * LANES));
                            scores_tile::<MR, 1>(qt, qs, d, kt, o, width);
                        }
                    }
                    (_, NV) => scores_tile::<1, NV>(qt, qs, d, kt, o, width),
                    _ => {
                        for n in 0..nv {
                            let (kt, o) = (kt.add(n * group), o.add(n * LANES));
                            scores_tile::<1, 1>(qt, qs, d, kt, o, width);
                        }
                    }
                }
            }
            r += mr;
        }
        g0 += nv;
    }
}

/// `R × N·16` scores, one accumulator per vector, summed over c in order.
///
/// # Safety
/// AVX-512F; `q` holds `R` rows of stride `q_stride` with `d` values, `kt` (at the tile's
/// first group) `N` groups of `d × 16` keys, `out` `R` rows of stride `width` with `N·16`
/// columns.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn scores_tile<const R: usize, const N: usize>(
    q: *const f32,
    q_stride: usize,
    d: usize,
    kt: *const f32,
    out: *mut f32,
    width: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    for c in 0..d {
        let mut k = [_mm512_setzero_ps(); N];
        for (n, k) in k.iter_mut().enumerate() {
            // SAFETY: channel c of group n (the caller's contract).
            *k = unsafe { _mm512_loadu_ps(kt.add((n * d + c) * LANES)) };
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: q[r][c] (the caller's contract).
            let qv = _mm512_set1_ps(unsafe { *q.add(r * q_stride + c) });
            for (a, &k) in acc.iter_mut().zip(&k) {
                *a = _mm512_add_ps(*a, _mm512_mul_ps(qv, k));
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (n, &a) in acc.iter().enumerate() {
            // SAFETY: out[r][n·16..n·16 + 16] (the caller's contract).
            unsafe { _mm512_storeu_ps(out.add(r * width + n * LANES), a) };
        }
    }
}

/// Keys transposed group by group: `kt[g][c][i] = k[16·g + i][c]` for the `len` rows of
/// `k` (row `j` at `j · stride`, `d` values, `d` a multiple of 16), 0 in the lanes past the
/// last key; `kt` holds `⌈len / 16⌉ · d · 16` values. Blocks of 16 keys × 16 channels are
/// transposed in registers: a store a channel, instead of a store a value.
pub(crate) fn transpose_keys(k: &[f32], stride: usize, len: usize, d: usize, kt: &mut [f32]) {
    assert!(available(), "AVX-512 tiles on a CPU without AVX-512F");
    assert!(d.is_multiple_of(LANES) && holds_rows(k.len(), len, stride, d));
    assert!(kt.len() >= len.div_ceil(LANES) * d * LANES);
    // SAFETY: the CPU runs AVX-512F (checked above). Group g reads rows 16·g.. of `k` below
    // `len` (16 channels from c0 < d each: inside `holds_rows`) and writes channels
    // c0..c0 + 16 of group g of `kt`, 16 values each (inside the checked length).
    unsafe { transpose_keys_impl(k, stride, len, d, kt) }
}

#[target_feature(enable = "avx512f")]
unsafe fn transpose_keys_impl(k: &[f32], stride: usize, len: usize, d: usize, kt: &mut [f32]) {
    let (k, kt) = (k.as_ptr(), kt.as_mut_ptr());
    for g in 0..len.div_ceil(LANES) {
        let keys = (len - g * LANES).min(LANES);
        for c0 in (0..d).step_by(LANES) {
            let mut rows = [_mm512_setzero_ps(); LANES];
            for (i, row) in rows.iter_mut().enumerate().take(keys) {
                // SAFETY: key 16·g + i < len, channels c0..c0 + 16 ≤ d (see `transpose_keys`).
                *row = unsafe { _mm512_loadu_ps(k.add((g * LANES + i) * stride + c0)) };
            }
            for (c, column) in transpose16(rows).into_iter().enumerate() {
                // SAFETY: channel c0 + c < d of group g (see `transpose_keys`).
                unsafe { _mm512_storeu_ps(kt.add((g * d + c0 + c) * LANES), column) };
            }
        }
    }
}

/// The 16 × 16 transpose: `out[c]` lane `i` is `rows[i]` lane `c`. Pairs of rows
/// interleaved by 32 bits, then by 64, then 128-bit lanes gathered twice.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn transpose16(rows: [__m512; LANES]) -> [__m512; LANES] {
    // t[2p] holds, in each 128-bit lane L, rows 2p and 2p + 1 at columns 4L and 4L + 1
    // (interleaved); t[2p + 1] the same at 4L + 2 and 4L + 3.
    let mut t = [_mm512_setzero_ps(); LANES];
    for p in 0..LANES / 2 {
        t[2 * p] = _mm512_unpacklo_ps(rows[2 * p], rows[2 * p + 1]);
        t[2 * p + 1] = _mm512_unpackhi_ps(rows[2 * p], rows[2 * p + 1]);
    }
    // u[4q + m] holds, in lane L, rows 4q..4q + 4 at column 4L + m.
    let mut u = [_mm512_setzero_ps(); LANES];
    for q in 0..LANES / 4 {
        let pd = |x: __m512| _mm512_castps_pd(x);
        let (a, b, c, e) = (
            pd(t[4 * q]),
            pd(t[4 * q + 1]),
            pd(t[4 * q + 2]),
            pd(t[4 * q + 3]),
        );
        u[4 * q] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, e));
        u[4 * q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, e));
    }
    // Column 4L + m is lane L of u[m], u[4 + m], u[8 + m], u[12 + m], in that order.
    let mut out = [_mm512_setzero_ps(); LANES];
    for m in 0..4 {
        let even = _mm512_shuffle_f32x4::<0x88>(u[m], u[4 + m]);
        let odd = _mm512_shuffle_f32x4::<0xdd>(u[m], u[4 + m]);
        let even2 = _mm512_shuffle_f32x4::<0x88>(u[8 + m], u[12 + m]);
        let odd2 = _mm512_shuffle_f32x4::<0xdd>(u[8 + m], u[12 + m]);
        out[m] = _mm512_shuffle_f32x4::<0x88>(even, even2);
        out[8 + m] = _mm512_shuffle_f32x4::<0xdd>(even, even2);
        out[4 + m] = _mm512_shuffle_f32x4::<0x88>(odd, odd2);
        out[12 + m] = _mm512_shuffle_f32x4::<0xdd>(odd, odd2);
    }
    out
}

/// `out[r][c] += Σ_j p[r][j] · v[j][c]` for `j < keys` in order; `p[r][j]` is
/// `p[r · p_row + j · p_key]` (rows of probabilities, or their columns), `v` holds `keys` rows
/// of `d` at a stride of `v_stride` (`d` a multiple of 16), `out` `rows` rows of `d` at a
/// stride of `out_stride`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn weighted_sum_rows(
    p: &[f32],
    rows: usize,
    p_row: usize,
    p_key: usize,
    v: &[f32],
    v_stride: usize,
    keys: usize,
    d: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(available(), "AVX-512 tiles on a CPU without AVX-512F");
    assert!(d.is_multiple_of(LANES));
    assert!(holds_probabilities(p.len(), rows, p_row, p_key, keys));
    assert!(holds_rows(v.len(), keys, v_stride, d));
    assert!(holds_rows(out.len(), rows, out_stride, d));
    // SAFETY: the CPU runs AVX-512F (checked above). Tile (chunk, r, c0) reads
    // p[r..r + mr][chunk] (r < rows, chunk < keys: below the checked last index),
    // v[chunk · v_stride..][c0..c0 + nv·16] (c0 + nv·16 ≤ d) and reads and writes
    // out[(r..r + mr) · out_stride..][c0..c0 + nv·16]: inside the checked sizes.
    unsafe { weighted_sum_rows_impl(p, rows, p_row, p_key, v, v_stride, keys, d, out, out_stride) }
}

#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn weighted_sum_rows_impl(
    p: &[f32],
    rows: usize,
    p_row: usize,
    p_key: usize,
    v: &[f32],
    v_stride: usize,
    keys: usize,
    d: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let (vs, os) = (v_stride, out_stride);
    let (p, v, out) = (p.as_ptr(), v.as_ptr(), out.as_mut_ptr());
    // Chunks of keys in ascending order, each summed in order into `out`: per output, the
    // terms are added in the order of j, as in the portable body.
    for j0 in (0..keys).step_by(KEY_CHUNK) {
        let kn = KEY_CHUNK.min(keys - j0);
        let mut r = 0;
        while r < rows {
            let mr = if rows - r >= MR { MR } else { 1 };
            let mut c0 = 0;
            while c0 < d {
                let nv = ((d - c0) / LANES).min(NV);
                // SAFETY: the offsets are those of tile (j0, r, c0), inside the buffers (see
                // `weighted_sum_rows`).
                unsafe {
                    let (pt, vt, o) = (
                        p.add(r * p_row + j0 * p_key),
                        v.add(j0 * vs + c0),
                        out.add(r * os + c0),
                    );
                    match (mr, nv) {
                        (MR, NV) => weighted_tile::<MR, NV>(pt, p_row, p_key, vt, vs, kn, o, os),
                        (MR, _) => {
                            for n in 0..nv {
                                let (vt, o) = (vt.add(n * LANES), o.add(n * LANES));
                                weighted_tile::<MR, 1>(pt, p_row, p_key, vt, vs, kn, o, os);
                            }
                        }
                        (_, NV) => weighted_tile::<1, NV>(pt, p_row, p_key, vt, vs, kn, o, os),
                        _ => {
                            for n in 0..nv {
                                let (vt, o) = (vt.add(n * LANES), o.add(n * LANES));
                                weighted_tile::<1, 1>(pt, p_row, p_key, vt, vs, kn, o, os);
                            }
                        }
                    }
                }
                c0 += nv * LANES;
            }
            r += mr;
        }
    }
}

/// `R × N·16` outputs continued from `out` over `keys` keys, one after another.
///
/// # Safety
/// AVX-512F; `p` holds `R` rows of `keys` values, value `j` of row `r` at `r · p_row + j ·
/// p_key`, `v` `keys` rows of stride `v_stride` with `N·16` channels, `out` `R` rows of
/// stride `out_stride` with `N·16` channels.
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn weighted_tile<const R: usize, const N: usize>(
    p: *const f32,
    p_row: usize,
    p_key: usize,
    v: *const f32,
    v_stride: usize,
    keys: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    for (r, acc) in acc.iter_mut().enumerate() {
        for (n, a) in acc.iter_mut().enumerate() {
            // SAFETY: out[r][n·16..n·16 + 16] (the caller's contract).
            *a = unsafe { _mm512_loadu_ps(out.add(r * out_stride + n * LANES)) };
        }
    }
    for j in 0..keys {
        let mut x = [_mm512_setzero_ps(); N];
        for (n, x) in x.iter_mut().enumerate() {
            // SAFETY: v[j][n·16..n·16 + 16] (the caller's contract).
            *x = unsafe { _mm512_loadu_ps(v.add(j * v_stride + n * LANES)) };
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: p[r][j] (the caller's contract).
            let pv = _mm512_set1_ps(unsafe { *p.add(r * p_row + j * p_key) });
            for (a, &x) in acc.iter_mut().zip(&x) {
                *a = _mm512_add_ps(*a, _mm512_mul_ps(pv, x));
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (n, &a) in acc.iter().enumerate() {
            // SAFETY: out[r][n·16..n·16 + 16] (the caller's contract).
            unsafe { _mm512_storeu_ps(out.add(r * out_stride + n * LANES), a) };
        }
    }
}
