//! The WebAssembly int8 microkernel (simd128): all of this crate's wasm SIMD `unsafe` lives
//! here.
//!
//! WebAssembly has no run-time feature detection: a module that uses simd128 fails to
//! validate on an engine without it, so this kernel is compiled only when the build enables
//! the feature (`-C target-feature=+simd128`, as `tools/wasm/build.sh` does) and is then
//! always available. The public function checks that every buffer is as large as the loops
//! read or write; the `unsafe` blocks (unaligned 128-bit loads and stores) rely on nothing
//! else. Tested against the scalar kernel and an independent JavaScript sum under node
//! (`ruri-wasm/tests/kernel.mjs`).

use std::arch::wasm32::*;

/// Rows of one microkernel tile (2 accumulators each: 8 of V8's 16 vector registers).
const MR: usize = 4;

/// `c[r * n_padded + j] = Σₖ a[r][k] · w[j][k]` with `i32x4.dot_i16x8_s` on sign-extended
/// bytes (i16 × i16 pairs summed into i32: exact, no saturation). `w` is packed by
/// `PackedWeights::pack(Kernel::Simd128, …)`: per column block of 8 and k pair, the 8
/// columns' 2 bytes (16 bytes).
pub(super) fn simd128_gemm(
    a: &[i8],
    rows: usize,
    k_padded: usize,
    w: &[u8],
    n_padded: usize,
    c: &mut [i32],
) {
    assert!(k_padded.is_multiple_of(4) && n_padded.is_multiple_of(8));
    assert!(a.len() >= rows * k_padded);
    assert!(w.len() >= n_padded * k_padded && c.len() >= rows * n_padded);
    let quads = k_padded / 4;
    super::for_each_tile(rows, n_padded / 8, MR, |r, mr, block| {
        // SAFETY: rows r..r + mr exist in a and c, and the panel of `block`
        // (k_padded · 8 bytes from block · k_padded · 8) exists in w (asserted above);
        // the tile reads and writes only inside those.
        unsafe {
            let a_ptr = a.as_ptr().add(r * k_padded);
            let w_ptr = w.as_ptr().add(block * k_padded * 8);
            let c_ptr = c.as_mut_ptr().add(r * n_padded + block * 8);
            match mr {
                4 => tile::<4>(a_ptr, k_padded, w_ptr, quads, c_ptr, n_padded),
                3 => tile::<3>(a_ptr, k_padded, w_ptr, quads, c_ptr, n_padded),
                2 => tile::<2>(a_ptr, k_padded, w_ptr, quads, c_ptr, n_padded),
                _ => tile::<1>(a_ptr, k_padded, w_ptr, quads, c_ptr, n_padded),
            }
        }
    });
}

/// One `R × 8` tile over the whole K. Per k quad: W's 32 bytes (two k pairs × 8 columns × 2
/// bytes) sign-extended into four i16x8; per row, A's 4 bytes sign-extended and each of its
/// two i16 pairs broadcast, then `dot_i16x8_s` adds `a[2p]·w[c][2p] + a[2p+1]·w[c][2p+1]`
/// into column c's lane.
///
/// # Safety
/// `a` has `R` rows of `a_stride` bytes with `quads · 4 ≤ a_stride`; `w` has `quads · 32`
/// bytes; `c` has `R` rows of `c_stride` i32 with 8 writable at the start of each.
#[inline(always)]
unsafe fn tile<const R: usize>(
    a: *const i8,
    a_stride: usize,
    w: *const u8,
    quads: usize,
    c: *mut i32,
    c_stride: usize,
) {
    let mut acc = [[i32x4_splat(0); 2]; R];
    for q in 0..quads {
        // SAFETY: q < quads, so the 32 bytes at q · 32 are inside w, and the 4 bytes at
        // row · a_stride + 4q are inside row `row` of a (caller's contract). Wasm loads
        // need no alignment.
        unsafe {
            let wq = w.add(q * 32);
            let pair0 = v128_load(wq.cast());
            let pair1 = v128_load(wq.add(16).cast());
            let (w0_lo, w0_hi) = (
                i16x8_extend_low_i8x16(pair0),
                i16x8_extend_high_i8x16(pair0),
            );
            let (w1_lo, w1_hi) = (
                i16x8_extend_low_i8x16(pair1),
                i16x8_extend_high_i8x16(pair1),
            );
            for (row, acc) in acc.iter_mut().enumerate() {
                let x = v128_load32_zero(a.add(row * a_stride + 4 * q).cast());
                // i16 lanes a0 a1 a2 a3 0 0 0 0, seen as i32 lanes (a0,a1) (a2,a3) 0 0.
                let x = i16x8_extend_low_i8x16(x);
                let x0 = i32x4_shuffle::<0, 0, 0, 0>(x, x);
                let x1 = i32x4_shuffle::<1, 1, 1, 1>(x, x);
                acc[0] = i32x4_add(acc[0], i32x4_dot_i16x8(w0_lo, x0));
                acc[1] = i32x4_add(acc[1], i32x4_dot_i16x8(w0_hi, x0));
                acc[0] = i32x4_add(acc[0], i32x4_dot_i16x8(w1_lo, x1));
                acc[1] = i32x4_add(acc[1], i32x4_dot_i16x8(w1_hi, x1));
            }
        }
    }
    for (row, acc) in acc.iter().enumerate() {
        // SAFETY: row < R, and each row of c has 8 writable i32 from its start (caller).
        unsafe {
            let out = c.add(row * c_stride);
            v128_store(out.cast(), acc[0]);
            v128_store(out.add(4).cast(), acc[1]);
        }
    }
}
