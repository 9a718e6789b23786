//! [`AttentionPrecision::Int13`](crate::AttentionPrecision::Int13)'s two products in aarch64
//! Advanced SIMD (NEON, on every aarch64 CPU): `smlal` and `smlal2` multiply four 16-bit
//! integers by four and add each product into an i32 lane, exactly. A pair of 13-bit values
//! is one 32-bit lane of the packed operands (`super::int13::pair`), so the low half of a
//! vector of pairs (`smlal`) puts the two products of keys 0 and 1 (or channels 0 and 1)
//! side by side, the high half (`smlal2`) those of keys 2 and 3, in two accumulators; one
//! `addp` at the end adds each lane's neighbour and gives the four dot products in order.
//! 8 multiply-adds for two instructions, where the portable loops (compiled for NEON too)
//! widen each operand to 32 bits first and multiply-add 4 a `mla`.
//!
//! The sums are the integers the portable loops and `x86_int13`'s tiles compute: an
//! accumulator lane holds half of one sum's products, at most as large as the whole sum,
//! which cannot overflow i32 (`super::int13::TILE_MAX_D`, `SUM_CHUNK`). So the bits are
//! theirs, whatever the order.
//!
//! `weighted_sum`, and `super::int13::scores_on_tiles` that walks the score tiles, check that
//! every buffer holds what the loops read or write; the `unsafe` blocks (loads and stores
//! through raw pointers) rely on nothing else. Tested
//! against the definition and the portable loops by `super::int13`'s property tests, which
//! run every variant, under qemu on x86 machines (`tools/cross/aarch64-test.sh`).

use std::arch::aarch64::*;

use super::bf16::LANES;
use super::int13::weighted_sum_fits;
use super::int13::{Finish, FinishAt, ScoreTileAt, ScoreTiles, finish_tile, sum_tiles};

/// i32 lanes of a vector.
const W: usize = 4;
/// Rows per tile of weighted sums, as of scores (`super::int13::scores_on_tiles` runs 2):
/// 16 accumulators (two a vector of four sums), 4 operand vectors and a row's pair, 22 of
/// the 32 vector registers.
const MR: usize = 2;
/// Vectors of 4 channels per tile of weighted sums.
const NV: usize = 4;

/// This module's score tiles, for `super::int13::scores_on_tiles`.
pub(crate) struct Tiles;

impl ScoreTiles for Tiles {
    #[inline(always)]
    unsafe fn tile<const R: usize>((q, sq, kt, sk, out): ScoreTileAt, half: usize, width: usize) {
        // lo[r][n]: keys 4n and 4n + 1's products, two lanes each; hi[r][n]: keys 4n + 2, 4n + 3.
        // SAFETY: a register of zeros (NEON is enabled in every build of this module: its cfg).
        let mut lo = [[unsafe { vdupq_n_s32(0) }; LANES / W]; R];
        let mut hi = lo;
        for c in 0..half {
            // SAFETY: c < half: pair c of the group's 16 keys (4 vectors) and of each query.
            unsafe {
                let k: [int16x8_t; LANES / W] = std::array::from_fn(|n| {
                    vreinterpretq_s16_u32(vld1q_u32(kt.add(c * LANES + n * W)))
                });
                for (r, (lo, hi)) in lo.iter_mut().zip(&mut hi).enumerate() {
                    let qv = vreinterpretq_s16_u32(vdupq_n_u32(*q.add(r * half + c)));
                    let ql = vget_low_s16(qv);
                    for ((lo, hi), &k) in lo.iter_mut().zip(hi.iter_mut()).zip(&k) {
                        *lo = vmlal_s16(*lo, ql, vget_low_s16(k));
                        *hi = vmlal_high_s16(*hi, qv, k);
                    }
                }
            }
        }
        for (r, (lo, hi)) in lo.iter().zip(&hi).enumerate() {
            for (n, (&lo, &hi)) in lo.iter().zip(hi).enumerate() {
                // SAFETY: the group's scales and row r's 16 scores (the caller's sizes).
                unsafe {
                    let dot = vpaddq_s32(lo, hi);
                    let s = vld1q_f32(sk.add(n * W));
                    let scaled = vmulq_f32(vcvtq_f32_s32(dot), s);
                    let score = vmulq_f32(scaled, vdupq_n_f32(*sq.add(r)));
                    vst1q_f32(out.add(r * width + n * W), score);
                }
            }
        }
    }
}

/// `super::int13::Products::weighted_sum` on the tiles; `d` a multiple of 4. With `finish`
/// (`super::int13::Products::weighted_average`), the last chunk's tiles finish their
/// outputs: each sum converted to f32 (to nearest even, once, as `super::int13::finish`
/// converts it), times its channel's scale, times its row's `1 / total`; `out` then holds
/// only the sums of the chunks before.
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
    let lengths = (p.len(), v.len(), out.len());
    assert!(d.is_multiple_of(W) && weighted_sum_fits(lengths, rows, p_row, pairs, d));
    let finish = finish.map(|f| f.at(rows, d));
    // The tiles in `sum_tiles`' walk: each tile's i32 sums of a chunk, then added to its
    // i64 sums (stored on the first chunk), or finished on the last.
    for t in sum_tiles(rows, pairs, d, MR, (NV * W, W)) {
        // SAFETY: the tile's rows ≤ rows of p (`2 · pairs` weights `p_row` apart) and of
        // out (`d` sums), its pairs ≤ pairs of v (`d` pairs each), its channels ≤ d
        // (`sum_tiles` keeps every tile inside its shape; `weighted_sum_fits` and d a
        // multiple of 4, checked above); with `finish`, the scales of the tile's channels,
        // the inverses of its rows and its outputs (`Finish::at`, checked above).
        unsafe {
            let w = p.as_ptr().add(t.r * p_row + 2 * t.j0);
            let vt = v.as_ptr().add(t.j0 * d + t.c0);
            let o = out.as_mut_ptr().add(t.r * d + t.c0);
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

/// `R` rows × `N` vectors of 4 channels over `pairs` (≤ `SUM_CHUNK`) key pairs: weights `w`
/// (row `r`'s pair `j` at `r · p_row + 2j`), values `v` (pair `j`'s channels at `j · d`);
/// the i32 sums stored to, or added to, the i64 sums `out` (row `r` at `r · d`). With
/// `finish` (the last chunk), the whole sums (this chunk's, plus `out`'s unless it is also
/// the first) are converted to f32 to nearest even (an i32 directly; an i64, exact in f64
/// below 2⁵³, through f64), times the channel's scale, times the row's `1 / total`, and
/// stored as outputs instead.
///
/// # Safety
/// `w` has `R` rows of `2 · pairs` weights `p_row` apart; `v` has `pairs` rows of `d` pairs
/// with `4N` readable at the start of each; `out` has `R` rows of `d` with `4N` writable at
/// the start of each; with `finish`, `4N` scales, `R` inverses and `R` rows of `4N` outputs
/// `stride` apart.
#[inline(always)]
unsafe fn sum_tile<const R: usize, const N: usize>(
    w: *const u16,
    v: *const u32,
    out: *mut i64,
    (p_row, d, pairs, first, finish): (usize, usize, usize, bool, Option<FinishAt>),
) {
    // lo[r][n]: channels 4n and 4n + 1's products, two lanes each; hi[r][n]: 4n + 2, 4n + 3.
    // SAFETY: a register of zeros (NEON is enabled in every build of this module: its cfg).
    let mut lo = [[unsafe { vdupq_n_s32(0) }; N]; R];
    let mut hi = lo;
    for j in 0..pairs {
        // SAFETY: j < pairs: pair j's values of the tile's channels, and weights 2j and
        // 2j + 1 of each of its rows (read as one unaligned u32).
        unsafe {
            let x: [int16x8_t; N] =
                std::array::from_fn(|n| vreinterpretq_s16_u32(vld1q_u32(v.add(j * d + n * W))));
            for (r, (lo, hi)) in lo.iter_mut().zip(&mut hi).enumerate() {
                let two = w.add(r * p_row + 2 * j).cast::<u32>().read_unaligned();
                let wv = vreinterpretq_s16_u32(vdupq_n_u32(two));
                let wl = vget_low_s16(wv);
                for ((lo, hi), &x) in lo.iter_mut().zip(hi.iter_mut()).zip(&x) {
                    *lo = vmlal_s16(*lo, wl, vget_low_s16(x));
                    *hi = vmlal_high_s16(*hi, wv, x);
                }
            }
        }
    }
    for (r, (lo, hi)) in lo.iter().zip(&hi).enumerate() {
        for (n, (&lo, &hi)) in lo.iter().zip(hi).enumerate() {
            // SAFETY: the tile's own sums, 4 i64 a vector of channels, and with `finish` its
            // 4 channels' scales, its row's inverse and 4 outputs (the caller's sizes).
            unsafe {
                let a = vpaddq_s32(lo, hi);
                let o = out.add(r * d + n * W);
                // The whole i64 sums: this chunk's, plus the chunks' before.
                let whole = || {
                    let (low, high) = (vmovl_s32(vget_low_s32(a)), vmovl_high_s32(a));
                    if first {
                        (low, high)
                    } else {
                        (
                            vaddq_s64(low, vld1q_s64(o)),
                            vaddq_s64(high, vld1q_s64(o.add(2))),
                        )
                    }
                };
                let Some((scales, inv, y, stride)) = finish else {
                    let (low, high) = whole();
                    vst1q_s64(o, low);
                    vst1q_s64(o.add(2), high);
                    continue;
                };
                let sums = if first {
                    vcvtq_f32_s32(a)
                } else {
                    let (low, high) = whole();
                    let (low, high) = (vcvtq_f64_s64(low), vcvtq_f64_s64(high));
                    vcvt_high_f32_f64(vcvt_f32_f64(low), high)
                };
                let scaled = vmulq_f32(sums, vld1q_f32(scales.add(n * W)));
                let y_rn = vmulq_f32(scaled, vdupq_n_f32(*inv.add(r)));
                vst1q_f32(y.add(r * stride + n * W), y_rn);
            }
        }
    }
}
