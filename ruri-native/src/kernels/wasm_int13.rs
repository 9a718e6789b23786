//! [`AttentionPrecision::Int13`](crate::AttentionPrecision::Int13)'s two products in
//! WebAssembly simd128: `i32x4.dot_i16x8_s` multiplies 8 pairs of 16-bit integers and adds
//! each pair into an i32 lane, exactly (V8 and workerd run it as x86's `pmaddwd`), and
//! `i32x4.add` adds that to the sums: 8 multiply-adds for two instructions, where f32
//! attention needs a multiply and an add for 4 (simd128 has no FMA). The sums are the
//! integers `x86_int13`'s tiles and the portable loops compute (none can overflow:
//! `super::int13::TILE_MAX_D`, `SUM_CHUNK`), so the bits are theirs.
//!
//! Compiled only when the build enables simd128 (as `tools/wasm/build.sh` does; see
//! `super::wasm`). `weighted_sum`, and `super::int13::scores_on_tiles` that walks the score
//! tiles, check that every buffer holds what the loops read or write; the `unsafe` blocks
//! (unaligned 128-bit loads and stores) rely on nothing else.
//! Tested under node against sums computed in JavaScript and against the portable loops
//! (`ruri-wasm/tests/kernel.mjs`), and end to end against the x86 engine's vectors
//! (`ruri-wasm/tests/parity.mjs`).

use std::arch::wasm32::*;

use super::bf16::LANES;
use super::int13::{ScoreTileAt, ScoreTiles, sum_tiles, weighted_sum_fits};

/// i32 lanes of a vector.
const W: usize = 4;
/// Rows per tile of weighted sums, as of scores (`super::int13::scores_on_tiles` runs 2):
/// 8 accumulators, 4 operands, 13 of V8's 16 vector registers on x86-64.
const MR: usize = 2;
/// Vectors of 4 channels per tile of weighted sums.
const NV: usize = 4;

/// This module's score tiles, for `super::int13::scores_on_tiles`.
pub(crate) struct Tiles;

impl ScoreTiles for Tiles {
    #[inline(always)]
    unsafe fn tile<const R: usize>((q, sq, kt, sk, out): ScoreTileAt, half: usize, width: usize) {
        let mut acc = [[i32x4_splat(0); LANES / W]; R];
        for c in 0..half {
            // SAFETY: c < half: pair c of the group's 16 keys (4 vectors) and of each query.
            unsafe {
                let k: [v128; LANES / W] =
                    std::array::from_fn(|n| v128_load(kt.add(c * LANES + n * W).cast()));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let qv = u32x4_splat(*q.add(r * half + c));
                    for (a, &k) in acc.iter_mut().zip(&k) {
                        *a = i32x4_add(*a, i32x4_dot_i16x8(qv, k));
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (n, &a) in acc.iter().enumerate() {
                // SAFETY: the group's scales and row r's 16 scores (the caller's sizes).
                unsafe {
                    let s = v128_load(sk.add(n * W).cast());
                    let scaled = f32x4_mul(f32x4_convert_i32x4(a), s);
                    let score = f32x4_mul(scaled, f32x4_splat(*sq.add(r)));
                    v128_store(out.add(r * width + n * W).cast(), score);
                }
            }
        }
    }
}

/// `super::int13::Products::weighted_sum` on the tiles; `d` a multiple of 4.
pub(crate) fn weighted_sum(
    p: &[u16],
    rows: usize,
    p_row: usize,
    v: &[u32],
    pairs: usize,
    d: usize,
    out: &mut [i64],
) {
    let lengths = (p.len(), v.len(), out.len());
    assert!(d.is_multiple_of(W) && weighted_sum_fits(lengths, rows, p_row, pairs, d));
    // The tiles in `sum_tiles`' walk: each tile's i32 sums of a chunk, then added to its
    // i64 sums (stored on the first chunk).
    for t in sum_tiles(rows, pairs, d, MR, (NV * W, W)) {
        // SAFETY: the tile's rows ≤ rows of p (`2 · pairs` weights `p_row` apart) and of
        // out (`d` sums), its pairs ≤ pairs of v (`d` pairs each), its channels ≤ d
        // (`sum_tiles` keeps every tile inside its shape; `weighted_sum_fits` and d a
        // multiple of 4, checked above).
        unsafe {
            let w = p.as_ptr().add(t.r * p_row + 2 * t.j0);
            let vt = v.as_ptr().add(t.j0 * d + t.c0);
            let o = out.as_mut_ptr().add(t.r * d + t.c0);
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

/// `R` rows × `N` vectors of 4 channels over `pairs` (≤ `SUM_CHUNK`) key pairs: weights `w`
/// (row `r`'s pair `j` at `r · p_row + 2j`), values `v` (pair `j`'s channels at `j · d`);
/// the i32 sums stored to, or added to, the i64 sums `out` (row `r` at `r · d`).
///
/// # Safety
/// `w` has `R` rows of `2 · pairs` weights `p_row` apart; `v` has `pairs` rows of `d` pairs
/// with `4N` readable at the start of each; `out` has `R` rows of `d` with `4N` writable at
/// the start of each.
#[inline(always)]
unsafe fn sum_tile<const R: usize, const N: usize>(
    w: *const u16,
    v: *const u32,
    out: *mut i64,
    (p_row, d, pairs, first): (usize, usize, usize, bool),
) {
    let mut acc = [[i32x4_splat(0); N]; R];
    for j in 0..pairs {
        // SAFETY: j < pairs: pair j's values of the tile's channels, and weights 2j and
        // 2j + 1 of each of its rows (read as one unaligned u32).
        unsafe {
            let x: [v128; N] = std::array::from_fn(|n| v128_load(v.add(j * d + n * W).cast()));
            for (r, acc) in acc.iter_mut().enumerate() {
                let two = w.add(r * p_row + 2 * j).cast::<u32>().read_unaligned();
                let wv = u32x4_splat(two);
                for (a, &x) in acc.iter_mut().zip(&x) {
                    *a = i32x4_add(*a, i32x4_dot_i16x8(wv, x));
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (n, &a) in acc.iter().enumerate() {
            // SAFETY: the tile's own sums, 4 i64 a vector of channels (the caller's sizes).
            unsafe {
                let o = out.add(r * d + n * W);
                let (lo, hi) = (i64x2_extend_low_i32x4(a), i64x2_extend_high_i32x4(a));
                let (lo, hi) = if first {
                    (lo, hi)
                } else {
                    (
                        i64x2_add(lo, v128_load(o.cast())),
                        i64x2_add(hi, v128_load(o.add(2).cast())),
                    )
                };
                v128_store(o.cast(), lo);
                v128_store(o.add(2).cast(), hi);
            }
        }
    }
}
