//! The x86-64 int8 microkernels: all of this crate's SIMD `unsafe` lives here.
//!
//! Each public function checks, at run time, that the CPU has the instructions its kernel
//! uses and that every buffer is as large as the loops read or write; the `unsafe` blocks
//! rely on nothing else. Each is property-tested against the scalar kernel
//! (`kernels::tests`), except the AVX-VNNI instantiation of the 256-bit VNNI kernel, which no
//! CPU here runs: its EVEX twin, the same source (`vnni256_kernel!`), is.

use std::arch::x86_64::*;

use super::Kernel;

/// Rows of one microkernel tile.
const MR: usize = 6;

/// `c[r * n_padded + j] = Σₖ a[r][k] · w[j][k]` with `vpdpbusd`. `w` is packed by
/// `PackedWeights::pack(Kernel::Avx512Vnni, …)` (u8 = w + 128), `sums[r] = Σₖ a[r][k]`.
pub(super) fn vnni_gemm(
    a: &[i8],
    sums: &[i32],
    rows: usize,
    k_padded: usize,
    w: &[u8],
    n_padded: usize,
    c: &mut [i32],
) {
    assert!(
        Kernel::Avx512Vnni.is_available(),
        "AVX-512 VNNI kernel on a CPU without it"
    );
    assert!(k_padded.is_multiple_of(4) && n_padded.is_multiple_of(64));
    assert!(a.len() >= rows * k_padded && sums.len() >= rows);
    assert!(w.len() >= n_padded * k_padded && c.len() >= rows * n_padded);
    // SAFETY: the CPU runs AVX-512 F/BW/VNNI (checked above), and the buffers hold what the
    // loops index (checked above: every tile reads rows × k_padded bytes of `a`, a
    // 64 × k_padded panel of `w`, and writes 64 columns of rows < `rows` of `c`).
    unsafe { vnni_gemm_impl(a, sums, rows, k_padded, w, n_padded, c) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn vnni_gemm_impl(
    a: &[i8],
    sums: &[i32],
    rows: usize,
    k_padded: usize,
    w: &[u8],
    n_padded: usize,
    c: &mut [i32],
) {
    let quads = k_padded / 4;
    super::for_each_tile(rows, n_padded / 64, MR, |r, mr, block| {
        // SAFETY: rows r..r + mr exist in a, sums and c, and the panel of `block`
        // exists in w (asserted by the caller); offsets stay inside those bounds.
        unsafe {
            let a_ptr = a.as_ptr().add(r * k_padded);
            let w_ptr = w.as_ptr().add(block * quads * 256);
            let c_ptr = c.as_mut_ptr().add(r * n_padded + block * 64);
            let s_ptr = sums.as_ptr().add(r);
            match mr {
                6 => vnni_tile::<6>(a_ptr, k_padded, w_ptr, quads, c_ptr, n_padded, s_ptr),
                5 => vnni_tile::<5>(a_ptr, k_padded, w_ptr, quads, c_ptr, n_padded, s_ptr),
                4 => vnni_tile::<4>(a_ptr, k_padded, w_ptr, quads, c_ptr, n_padded, s_ptr),
                3 => vnni_tile::<3>(a_ptr, k_padded, w_ptr, quads, c_ptr, n_padded, s_ptr),
                2 => vnni_tile::<2>(a_ptr, k_padded, w_ptr, quads, c_ptr, n_padded, s_ptr),
                _ => vnni_tile::<1>(a_ptr, k_padded, w_ptr, quads, c_ptr, n_padded, s_ptr),
            }
        }
    });
}

/// One `R × 64` tile over the whole K: 4·R zmm accumulators, W's four zmm loaded once per
/// k quad and A's 4 bytes broadcast per row.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `a` has `R` rows of `a_stride` bytes with `quads · 4 ≤ a_stride`;
/// `w` has `quads · 256` bytes; `c` has `R` rows of `c_stride` i32 with 64 writable at the
/// start of each; `sums` has `R` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn vnni_tile<const R: usize>(
    a: *const i8,
    a_stride: usize,
    w: *const u8,
    quads: usize,
    c: *mut i32,
    c_stride: usize,
    sums: *const i32,
) {
    let mut acc = [[_mm512_setzero_si512(); 4]; R];
    for q in 0..quads {
        // SAFETY: q < quads, so the 256 bytes at q · 256 are inside w, and the 4 bytes at
        // row · a_stride + 4q are inside row `row` of a (caller's contract).
        unsafe {
            let wq = w.add(q * 256);
            let w0 = _mm512_loadu_si512(wq.cast());
            let w1 = _mm512_loadu_si512(wq.add(64).cast());
            let w2 = _mm512_loadu_si512(wq.add(128).cast());
            let w3 = _mm512_loadu_si512(wq.add(192).cast());
            for (row, acc) in acc.iter_mut().enumerate() {
                let x = a.add(row * a_stride + 4 * q).cast::<i32>().read_unaligned();
                let x = _mm512_set1_epi32(x);
                acc[0] = _mm512_dpbusd_epi32(acc[0], w0, x);
                acc[1] = _mm512_dpbusd_epi32(acc[1], w1, x);
                acc[2] = _mm512_dpbusd_epi32(acc[2], w2, x);
                acc[3] = _mm512_dpbusd_epi32(acc[3], w3, x);
            }
        }
    }
    for (row, acc) in acc.iter().enumerate() {
        // SAFETY: row < R, and each row of c has 64 writable i32 from its start (caller).
        unsafe {
            let correction = _mm512_set1_epi32(128 * *sums.add(row));
            let out = c.add(row * c_stride);
            for (j, &v) in acc.iter().enumerate() {
                _mm512_storeu_si512(out.add(16 * j).cast(), _mm512_sub_epi32(v, correction));
            }
        }
    }
}

/// `c[r * n_padded + j] = Σₖ a[r][k] · w[j][k]` with `vpmaddwd` on sign-extended bytes. `w`
/// is packed by `PackedWeights::pack(Kernel::Avx2, …)`.
pub(super) fn avx2_gemm(
    a: &[i8],
    rows: usize,
    k_padded: usize,
    w: &[u8],
    n_padded: usize,
    c: &mut [i32],
) {
    assert!(
        Kernel::Avx2.is_available(),
        "AVX2 kernel on a CPU without it"
    );
    assert!(k_padded.is_multiple_of(2) && n_padded.is_multiple_of(16));
    assert!(a.len() >= rows * k_padded);
    assert!(w.len() >= n_padded * k_padded && c.len() >= rows * n_padded);
    // A widened once per call: the tiles broadcast i16 pairs.
    let a16: Vec<i16> = a[..rows * k_padded].iter().map(|&v| i16::from(v)).collect();
    // SAFETY: the CPU runs AVX2 (checked above), and the buffers hold what the loops index
    // (checked above; `a16` has rows × k_padded values).
    unsafe { avx2_gemm_impl(&a16, rows, k_padded, w, n_padded, c) }
}

#[target_feature(enable = "avx2")]
fn avx2_gemm_impl(
    a16: &[i16],
    rows: usize,
    k_padded: usize,
    w: &[u8],
    n_padded: usize,
    c: &mut [i32],
) {
    let pairs = k_padded / 2;
    super::for_each_tile(rows, n_padded / 16, MR, |r, mr, block| {
        // SAFETY: rows r..r + mr exist in a16 and c, the panel of `block` exists in w
        // (asserted by the caller).
        unsafe {
            let a_ptr = a16.as_ptr().add(r * k_padded);
            let w_ptr = w.as_ptr().add(block * pairs * 32);
            let c_ptr = c.as_mut_ptr().add(r * n_padded + block * 16);
            match mr {
                6 => avx2_tile::<6>(a_ptr, k_padded, w_ptr, pairs, c_ptr, n_padded),
                5 => avx2_tile::<5>(a_ptr, k_padded, w_ptr, pairs, c_ptr, n_padded),
                4 => avx2_tile::<4>(a_ptr, k_padded, w_ptr, pairs, c_ptr, n_padded),
                3 => avx2_tile::<3>(a_ptr, k_padded, w_ptr, pairs, c_ptr, n_padded),
                2 => avx2_tile::<2>(a_ptr, k_padded, w_ptr, pairs, c_ptr, n_padded),
                _ => avx2_tile::<1>(a_ptr, k_padded, w_ptr, pairs, c_ptr, n_padded),
            }
        }
    });
}

/// One `R × 16` tile over the whole K: 2·R ymm accumulators; per k pair, W's 32 bytes are
/// sign-extended into two ymm of i16 and A's i16 pair is broadcast per row.
///
/// # Safety
/// AVX2; `a` has `R` rows of `a_stride` i16 with `pairs · 2 ≤ a_stride`; `w` has
/// `pairs · 32` bytes; `c` has `R` rows of `c_stride` i32 with 16 writable at each start.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn avx2_tile<const R: usize>(
    a: *const i16,
    a_stride: usize,
    w: *const u8,
    pairs: usize,
    c: *mut i32,
    c_stride: usize,
) {
    let mut acc = [[_mm256_setzero_si256(); 2]; R];
    for p in 0..pairs {
        // SAFETY: p < pairs, so the 32 bytes at p · 32 are inside w, and the pair at
        // row · a_stride + 2p is inside row `row` of a (caller's contract).
        unsafe {
            let wp = w.add(p * 32);
            let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wp.cast()));
            let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wp.add(16).cast()));
            for (row, acc) in acc.iter_mut().enumerate() {
                let x = a.add(row * a_stride + 2 * p).cast::<i32>().read_unaligned();
                let x = _mm256_set1_epi32(x);
                acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(w0, x));
                acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(w1, x));
            }
        }
    }
    for (row, acc) in acc.iter().enumerate() {
        // SAFETY: row < R, and each row of c has 16 writable i32 from its start (caller).
        unsafe {
            let out = c.add(row * c_stride);
            _mm256_storeu_si256(out.cast(), acc[0]);
            _mm256_storeu_si256(out.add(8).cast(), acc[1]);
        }
    }
}

/// The 256-bit VNNI kernel, written once and compiled for two encodings of the same
/// instruction: `$dpbusd` is the only line that differs.
///
/// `vpdpbusd ymm` is one instruction with two encodings (Intel SDM vol. 2, "VPDPBUSD —
/// Multiply and Add Unsigned and Signed Bytes", <https://www.felixcloutier.com/x86/vpdpbusd>):
/// VEX.256 under AVX-VNNI (`_mm256_dpbusd_avx_epi32`) and EVEX.256 under AVX512-VNNI +
/// AVX512-VL (`_mm256_dpbusd_epi32`), under one description (unsigned bytes × signed bytes,
/// 16-bit products summed into i32 without saturation); EVEX adds only write masks and
/// embedded broadcast, which compute the same here. core::arch documents both intrinsics
/// word for word alike (stable since Rust 1.89). So the EVEX instantiation, which runs on
/// AVX-512 CPUs, tests the source of the VEX one.
///
/// Tile: 6 rows × 16 columns. 12 ymm accumulators + W's 2 ymm + A's broadcast = 15 of the
/// 16 ymm registers VEX code has (the EVEX twin could use 32, but it must stay the same
/// code). Wider (4 × 32: 16 accumulators + 4 loads) spills; 4 × 24 also fits but pads
/// N = 256 or 1,024 to a multiple of 24, while 16 divides every width of the model and
/// keeps the writer-column products (a few columns) small. Per k quad it issues 12
/// independent `vpdpbusd` (enough to keep two per cycle busy at a latency of up to 6
/// cycles) against 8 loads (2 of W, 6 broadcasts of A).
macro_rules! vnni256_kernel {
    ($module:ident, $kernel:expr, $features:tt, $dpbusd:ident) => {
        pub(super) mod $module {
            use std::arch::x86_64::*;

            use super::{Kernel, MR};

            /// `c[r * n_padded + j] = Σₖ a[r][k] · w[j][k]` with 256-bit `vpdpbusd`. `w` is
            /// packed by `PackedWeights::pack` for this kernel (u8 = w + 128, column blocks
            /// of 16), `sums[r] = Σₖ a[r][k]`.
            pub(in crate::kernels) fn gemm(
                a: &[i8],
                sums: &[i32],
                rows: usize,
                k_padded: usize,
                w: &[u8],
                n_padded: usize,
                c: &mut [i32],
            ) {
                assert!(
                    $kernel.is_available(),
                    "{} kernel on a CPU without it",
                    $kernel
                );
                assert!(k_padded.is_multiple_of(4) && n_padded.is_multiple_of(16));
                assert!(a.len() >= rows * k_padded && sums.len() >= rows);
                assert!(w.len() >= n_padded * k_padded && c.len() >= rows * n_padded);
                // SAFETY: the CPU runs the features `gemm_impl` enables (checked above), and
                // the buffers hold what the loops index (checked above: every tile reads
                // rows × k_padded bytes of `a`, a 16 × k_padded panel of `w`, and writes 16
                // columns of rows < `rows` of `c`).
                unsafe { gemm_impl(a, sums, rows, k_padded, w, n_padded, c) }
            }

            #[target_feature(enable = $features)]
            fn gemm_impl(
                a: &[i8],
                sums: &[i32],
                rows: usize,
                k_padded: usize,
                w: &[u8],
                n_padded: usize,
                c: &mut [i32],
            ) {
                let quads = k_padded / 4;
                crate::kernels::for_each_tile(rows, n_padded / 16, MR, |r, mr, block| {
                    // SAFETY: rows r..r + mr exist in a, sums and c, and the panel of
                    // `block` exists in w (asserted by `gemm`); offsets stay inside
                    // those bounds.
                    unsafe {
                        let a = a.as_ptr().add(r * k_padded);
                        let w = w.as_ptr().add(block * quads * 64);
                        let c = c.as_mut_ptr().add(r * n_padded + block * 16);
                        let s = sums.as_ptr().add(r);
                        match mr {
                            6 => tile::<6>(a, k_padded, w, quads, c, n_padded, s),
                            5 => tile::<5>(a, k_padded, w, quads, c, n_padded, s),
                            4 => tile::<4>(a, k_padded, w, quads, c, n_padded, s),
                            3 => tile::<3>(a, k_padded, w, quads, c, n_padded, s),
                            2 => tile::<2>(a, k_padded, w, quads, c, n_padded, s),
                            _ => tile::<1>(a, k_padded, w, quads, c, n_padded, s),
                        }
                    }
                });
            }

            /// One `R × 16` tile over the whole K: 2·R ymm accumulators, W's two ymm loaded
            /// once per k quad and A's 4 bytes broadcast per row.
            ///
            /// # Safety
            /// The features this module enables; `a` has `R` rows of `a_stride` bytes with
            /// `quads · 4 ≤ a_stride`; `w` has `quads · 64` bytes; `c` has `R` rows of
            /// `c_stride` i32 with 16 writable at the start of each; `sums` has `R` values.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn tile<const R: usize>(
                a: *const i8,
                a_stride: usize,
                w: *const u8,
                quads: usize,
                c: *mut i32,
                c_stride: usize,
                sums: *const i32,
            ) {
                let mut acc = [[_mm256_setzero_si256(); 2]; R];
                for q in 0..quads {
                    // SAFETY: q < quads, so the 64 bytes at q · 64 are inside w, and the 4
                    // bytes at row · a_stride + 4q are inside row `row` of a (caller's
                    // contract).
                    unsafe {
                        let wq = w.add(q * 64);
                        let w0 = _mm256_loadu_si256(wq.cast());
                        let w1 = _mm256_loadu_si256(wq.add(32).cast());
                        for (row, acc) in acc.iter_mut().enumerate() {
                            let x = a.add(row * a_stride + 4 * q).cast::<i32>().read_unaligned();
                            let x = _mm256_set1_epi32(x);
                            acc[0] = $dpbusd(acc[0], w0, x);
                            acc[1] = $dpbusd(acc[1], w1, x);
                        }
                    }
                }
                for (row, acc) in acc.iter().enumerate() {
                    // SAFETY: row < R, and each row of c has 16 writable i32 from its start
                    // (caller).
                    unsafe {
                        let correction = _mm256_set1_epi32(128 * *sums.add(row));
                        let out = c.add(row * c_stride);
                        _mm256_storeu_si256(out.cast(), _mm256_sub_epi32(acc[0], correction));
                        _mm256_storeu_si256(
                            out.add(8).cast(),
                            _mm256_sub_epi32(acc[1], correction),
                        );
                    }
                }
            }
        }
    };
}

// The VEX encoding, for CPUs with AVX-VNNI (Intel's client cores since Alder Lake, its
// E-core Xeons, AMD's Zen 5); no CPU that runs this project's tests has it.
vnni256_kernel!(
    avxvnni,
    Kernel::AvxVnni,
    "avx2,avxvnni",
    _mm256_dpbusd_avx_epi32
);
// The EVEX encoding of the same source, for AVX-512 VNNI + VL: what the tests run.
vnni256_kernel!(
    avx512vnni256,
    Kernel::Avx512Vnni256,
    "avx512f,avx512vl,avx512vnni",
    _mm256_dpbusd_epi32
);
