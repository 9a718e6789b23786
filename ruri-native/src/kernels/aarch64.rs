//! The aarch64 int8 microkernels: all of this crate's aarch64 SIMD `unsafe` lives here.
//!
//! * `sdot` (FEAT_DotProd): per 32-bit lane, the sum of four s8 × s8 products added to an
//!   i32 (exact: no intermediate narrower than 32 bits, no saturation). 16 multiply-adds per
//!   instruction.
//! * `smmla` (FEAT_I8MM): a 2 × 8 by 8 × 2 s8 matrix product added to a 2 × 2 i32 tile
//!   (exact in the same way). 32 multiply-adds per instruction.
//!
//! Both are written as one-instruction `asm!` blocks: the intrinsics (`vdotq_laneq_s32`,
//! `vmmlaq_s32`) are still unstable (`stdarch_neon_dotprod`, `stdarch_neon_i8mm`), while
//! `asm!`, the loads and stores and the run-time detection are stable Rust.
//!
//! Each public function checks, at run time, that the CPU has the instruction its kernel
//! uses and that every buffer is as large as the loops read or write; the `unsafe` blocks
//! rely on nothing else. Both are property-tested against the scalar kernel
//! (`kernels::tests`), under qemu on x86 machines (`tools/cross/aarch64-test.sh`).

use std::arch::aarch64::*;
use std::arch::asm;

use super::Kernel;

/// Rows of one microkernel tile. Both tiles are 8 × 8: 16 accumulator registers of 32,
/// leaving room for 8 of A and the W vectors in flight (an 8 × 16 tile would need all 32
/// for its accumulators alone).
const MR: usize = 8;
/// Columns of one tile, and of one packed column block of W.
const NR: usize = 8;
/// K per packed group of W: one 16-byte load of an A row. W is packed with K rounded up to
/// this (zeros), so a short last group reads only zero weights past `k_padded`.
const K_GROUP: usize = 16;

/// The sizes every kernel here reads and writes, checked before any `unsafe`.
fn check_buffers(a: &[i8], rows: usize, k_padded: usize, w: &[u8], n_padded: usize, c: &[i32]) {
    assert!(k_padded.is_multiple_of(4) && n_padded.is_multiple_of(NR));
    assert!(a.len() >= rows * k_padded);
    assert!(w.len() >= n_padded * k_padded.next_multiple_of(K_GROUP));
    assert!(c.len() >= rows * n_padded);
}

/// `c[r * n_padded + j] = Σₖ a[r][k] · w[j][k]` with `sdot`. `w` is packed by
/// `PackedWeights::pack(Kernel::Dotprod, …)`: per column block of 8 and k quad (K rounded up
/// to [`K_GROUP`]), the 8 columns' 4 bytes (32 bytes).
pub(super) fn dotprod_gemm(
    a: &[i8],
    rows: usize,
    k_padded: usize,
    w: &[u8],
    n_padded: usize,
    c: &mut [i32],
) {
    assert!(
        Kernel::Dotprod.is_available(),
        "dotprod kernel on a CPU without FEAT_DotProd"
    );
    check_buffers(a, rows, k_padded, w, n_padded, c);
    // SAFETY: the CPU runs `sdot` (checked above), and the buffers hold what the loops index
    // (checked above: every tile reads mr rows of k_padded bytes of `a`, one column block's
    // panel of `w`, and writes 8 columns of mr rows of `c`).
    unsafe { dotprod_gemm_impl(a, rows, k_padded, w, n_padded, c) }
}

#[target_feature(enable = "dotprod")]
fn dotprod_gemm_impl(
    a: &[i8],
    rows: usize,
    k_padded: usize,
    w: &[u8],
    n_padded: usize,
    c: &mut [i32],
) {
    let panel = k_padded.next_multiple_of(K_GROUP) * NR;
    super::for_each_tile(rows, n_padded / NR, MR, |r, mr, block| {
        // SAFETY: rows r..r + mr exist in a and c, and the panel of `block` exists in w
        // (asserted by the caller); the CPU runs `sdot` (this function's contract).
        unsafe {
            let a_ptr = a.as_ptr().add(r * k_padded);
            let w_ptr = w.as_ptr().cast::<i8>().add(block * panel);
            let c_ptr = c.as_mut_ptr().add(r * n_padded + block * NR);
            match mr {
                8 => dotprod_tile::<8>(a_ptr, k_padded, w_ptr, c_ptr, n_padded),
                7 => dotprod_tile::<7>(a_ptr, k_padded, w_ptr, c_ptr, n_padded),
                6 => dotprod_tile::<6>(a_ptr, k_padded, w_ptr, c_ptr, n_padded),
                5 => dotprod_tile::<5>(a_ptr, k_padded, w_ptr, c_ptr, n_padded),
                4 => dotprod_tile::<4>(a_ptr, k_padded, w_ptr, c_ptr, n_padded),
                3 => dotprod_tile::<3>(a_ptr, k_padded, w_ptr, c_ptr, n_padded),
                2 => dotprod_tile::<2>(a_ptr, k_padded, w_ptr, c_ptr, n_padded),
                _ => dotprod_tile::<1>(a_ptr, k_padded, w_ptr, c_ptr, n_padded),
            }
        }
    });
}

/// The `R` rows' 16 bytes of group `g` (k from 16g), zeros past `k_padded` (the last group
/// may be short; A rows are never read past their end).
///
/// # Safety
/// `a` has `R` rows of `k_padded` bytes, `g · 16 < k_padded`.
#[inline(always)]
unsafe fn load_group<const R: usize>(a: *const i8, k_padded: usize, g: usize) -> [int8x16_t; MR] {
    let mut x = [0i8; 16];
    // SAFETY: NEON is part of the aarch64 baseline.
    let mut rows = [unsafe { vdupq_n_s8(0) }; MR];
    let len = (k_padded - g * K_GROUP).min(K_GROUP);
    for (row, v) in rows.iter_mut().enumerate().take(R) {
        // SAFETY: row < R, and bytes 16g..16g + len of each row lie inside it (caller); the
        // copy goes to a 16-byte local.
        unsafe {
            let src = a.add(row * k_padded + g * K_GROUP);
            *v = if len == K_GROUP {
                vld1q_s8(src)
            } else {
                std::ptr::copy_nonoverlapping(src, x.as_mut_ptr(), len);
                vld1q_s8(x.as_ptr())
            };
        }
    }
    rows
}

/// `acc + Σᵢ w[4l + i] · a[4·LANE + i]` per lane l: `sdot` by element, W's four columns
/// against one k quad of an A row.
///
/// # Safety
/// The CPU runs FEAT_DotProd.
#[inline(always)]
unsafe fn sdot<const LANE: i32>(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: registers only (no memory, stack or flags); `sdot` exists (caller).
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {w:v}.16b, {a:v}.4b[{lane}]",
            acc = inout(vreg) acc,
            w = in(vreg) w,
            a = in(vreg) a,
            lane = const LANE,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// The k quad `LANE` of a group: W's two vectors (columns 0–3 and 4–7) against every row.
///
/// # Safety
/// FEAT_DotProd; `w` has 32 bytes.
#[inline(always)]
unsafe fn dotprod_quad<const R: usize, const LANE: i32>(
    acc: &mut [[int32x4_t; 2]; R],
    x: &[int8x16_t; MR],
    w: *const i8,
) {
    // SAFETY: 32 bytes at w (caller); `sdot` exists (caller).
    unsafe {
        let w0 = vld1q_s8(w);
        let w1 = vld1q_s8(w.add(16));
        for (acc, &x) in acc.iter_mut().zip(x) {
            acc[0] = sdot::<LANE>(acc[0], w0, x);
            acc[1] = sdot::<LANE>(acc[1], w1, x);
        }
    }
}

/// One `R × 8` tile over the whole K: 2·R accumulators; per group of 16 k, each row's 16
/// bytes are loaded once and each of their four quads is multiplied (`sdot` by element)
/// with that quad's 8 columns of W (two vectors).
///
/// # Safety
/// FEAT_DotProd; `a` has `R` rows of `k_padded` bytes; `w` has
/// `k_padded.next_multiple_of(16) · 8` bytes; `c` has `R` rows of `c_stride` i32 with 8
/// writable at the start of each.
#[target_feature(enable = "dotprod")]
#[inline]
unsafe fn dotprod_tile<const R: usize>(
    a: *const i8,
    k_padded: usize,
    w: *const i8,
    c: *mut i32,
    c_stride: usize,
) {
    // SAFETY: the caller's contract, passed on: each group reads its 16 k of the R rows
    // (load_group) and its 128 bytes of w; rows < R of c get 8 i32 each.
    unsafe {
        let mut acc = [[vdupq_n_s32(0); 2]; R];
        for g in 0..k_padded.div_ceil(K_GROUP) {
            let x = load_group::<R>(a, k_padded, g);
            let wg = w.add(g * K_GROUP * NR);
            dotprod_quad::<R, 0>(&mut acc, &x, wg);
            dotprod_quad::<R, 1>(&mut acc, &x, wg.add(32));
            dotprod_quad::<R, 2>(&mut acc, &x, wg.add(64));
            dotprod_quad::<R, 3>(&mut acc, &x, wg.add(96));
        }
        for (row, acc) in acc.iter().enumerate() {
            let out = c.add(row * c_stride);
            vst1q_s32(out, acc[0]);
            vst1q_s32(out.add(4), acc[1]);
        }
    }
}

/// `c[r * n_padded + j] = Σₖ a[r][k] · w[j][k]` with `smmla`. `w` is packed by
/// `PackedWeights::pack(Kernel::I8mm, …)`: per column block of 8 and k octet (K rounded up
/// to [`K_GROUP`]), the 8 columns' 8 bytes (64 bytes; each 16 is a column pair).
pub(super) fn i8mm_gemm(
    a: &[i8],
    rows: usize,
    k_padded: usize,
    w: &[u8],
    n_padded: usize,
    c: &mut [i32],
) {
    assert!(
        Kernel::I8mm.is_available(),
        "i8mm kernel on a CPU without FEAT_I8MM"
    );
    check_buffers(a, rows, k_padded, w, n_padded, c);
    // SAFETY: the CPU runs `smmla` (checked above), and the buffers hold what the loops index
    // (checked above, as for dotprod_gemm).
    unsafe { i8mm_gemm_impl(a, rows, k_padded, w, n_padded, c) }
}

#[target_feature(enable = "i8mm")]
fn i8mm_gemm_impl(
    a: &[i8],
    rows: usize,
    k_padded: usize,
    w: &[u8],
    n_padded: usize,
    c: &mut [i32],
) {
    let panel = k_padded.next_multiple_of(K_GROUP) * NR;
    super::for_each_tile(rows, n_padded / NR, MR, |r, mr, block| {
        // SAFETY: rows r..r + mr exist in a and c, and the panel of `block` exists in w
        // (asserted by the caller); the CPU runs `smmla` (this function's contract).
        unsafe {
            let a_ptr = a.as_ptr().add(r * k_padded);
            let w_ptr = w.as_ptr().cast::<i8>().add(block * panel);
            let c_ptr = c.as_mut_ptr().add(r * n_padded + block * NR);
            match mr {
                8 => i8mm_tile::<8>(a_ptr, k_padded, w_ptr, c_ptr, n_padded),
                7 => i8mm_tile::<7>(a_ptr, k_padded, w_ptr, c_ptr, n_padded),
                6 => i8mm_tile::<6>(a_ptr, k_padded, w_ptr, c_ptr, n_padded),
                5 => i8mm_tile::<5>(a_ptr, k_padded, w_ptr, c_ptr, n_padded),
                4 => i8mm_tile::<4>(a_ptr, k_padded, w_ptr, c_ptr, n_padded),
                3 => i8mm_tile::<3>(a_ptr, k_padded, w_ptr, c_ptr, n_padded),
                2 => i8mm_tile::<2>(a_ptr, k_padded, w_ptr, c_ptr, n_padded),
                _ => i8mm_tile::<1>(a_ptr, k_padded, w_ptr, c_ptr, n_padded),
            }
        }
    });
}

/// `acc + a · bᵀ` on 2 × 2 i32 (row-major lanes): `a` is two rows of 8 s8, `b` two columns
/// of 8 s8.
///
/// # Safety
/// The CPU runs FEAT_I8MM.
#[inline(always)]
unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: registers only (no memory, stack or flags); `smmla` exists (caller).
    unsafe {
        asm!(
            "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// One `R × 8` tile over the whole K: accumulators for 4 row pairs × 4 column pairs (2 × 2
/// each). Per group of 16 k, each row's 16 bytes are loaded once; two rows' 8-byte halves are
/// interleaved (`zip1`/`zip2` on 64-bit lanes) into the 2 × 8 operands of `smmla`. A missing
/// last row of an odd `R` is zeros.
///
/// # Safety
/// FEAT_I8MM; `a` has `R` rows of `k_padded` bytes; `w` has
/// `k_padded.next_multiple_of(16) · 8` bytes; `c` has `R` rows of `c_stride` i32 with 8
/// writable at the start of each.
#[target_feature(enable = "i8mm")]
#[inline]
unsafe fn i8mm_tile<const R: usize>(
    a: *const i8,
    k_padded: usize,
    w: *const i8,
    c: *mut i32,
    c_stride: usize,
) {
    let pairs = R.div_ceil(2);
    // SAFETY: the caller's contract, passed on: each group reads its 16 k of the R rows
    // (load_group) and its 128 bytes of w; rows < R of c get 8 i32 each.
    unsafe {
        let mut acc = [[vdupq_n_s32(0); 4]; MR / 2];
        for g in 0..k_padded.div_ceil(K_GROUP) {
            let x = load_group::<R>(a, k_padded, g);
            let wg = w.add(g * K_GROUP * NR);
            for half in 0..2 {
                let mut ab = [x[0]; MR / 2];
                for (p, ab) in ab.iter_mut().enumerate().take(pairs) {
                    let (top, bottom) = (
                        vreinterpretq_s64_s8(x[2 * p]),
                        vreinterpretq_s64_s8(x[2 * p + 1]),
                    );
                    *ab = vreinterpretq_s8_s64(if half == 0 {
                        vzip1q_s64(top, bottom)
                    } else {
                        vzip2q_s64(top, bottom)
                    });
                }
                for col_pair in 0..4 {
                    let b = vld1q_s8(wg.add(half * 64 + col_pair * 16));
                    for (acc, &ab) in acc.iter_mut().zip(&ab).take(pairs) {
                        acc[col_pair] = smmla(acc[col_pair], ab, b);
                    }
                }
            }
        }
        // acc[p][q] holds rows 2p, 2p + 1 × columns 2q, 2q + 1: row 2p is the low halves.
        for (p, acc) in acc.iter().enumerate().take(pairs) {
            let [c0, c1, c2, c3] = [0, 1, 2, 3].map(|q| vreinterpretq_s64_s32(acc[q]));
            let top = c.add(2 * p * c_stride);
            vst1q_s32(top, vreinterpretq_s32_s64(vzip1q_s64(c0, c1)));
            vst1q_s32(top.add(4), vreinterpretq_s32_s64(vzip1q_s64(c2, c3)));
            if 2 * p + 1 < R {
                let bottom = top.add(c_stride);
                vst1q_s32(bottom, vreinterpretq_s32_s64(vzip2q_s64(c0, c1)));
                vst1q_s32(bottom.add(4), vreinterpretq_s32_s64(vzip2q_s64(c2, c3)));
            }
        }
    }
}
