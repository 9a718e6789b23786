//! The int8 GEMM: `C[m][n] = Σₖ A[m][k] · W[n][k]`, A and W signed 8-bit, C exact in i32.
//!
//! Every kernel computes the same integers (no instruction here saturates, and i32 sums of
//! at most 127 · 127 · 2¹⁶ products cannot overflow), so which kernel runs never changes a
//! bit of a vector:
//!
//! * [`Kernel::Avx512Vnni`]: `vpdpbusd` (u8 × s8 → i32). W is stored as `w + 128` (u8) and
//!   A is broadcast as s8; `128 · Σₖ A[m][k]` is subtracted at the end.
//! * [`Kernel::Avx2`]: W and A sign-extended to 16 bits, `vpmaddwd` (i16 × i16 pairs → i32).
//!   Not `vpmaddubsw`, whose 16-bit pair sums saturate on 8-bit weights.
//! * [`Kernel::AvxVnni`]: `vpdpbusd` on 256-bit registers (AVX-VNNI, for CPUs without
//!   AVX-512), W and A as in the AVX-512 kernel. [`Kernel::Avx512Vnni256`] is the same source
//!   compiled for the EVEX encoding of that instruction (AVX-512 VNNI + VL): the twin that
//!   AVX-512 CPUs run, and so the tests; the AVX-VNNI instantiation itself has not run on
//!   any CPU this project is tested on.
//! * [`Kernel::Amx`]: Intel AMX-INT8, `tdpbusd` on 16 × 64-byte tiles (u8 × s8 → i32): A
//!   goes in as `a + 128` (u8), W as it is (s8), and each accumulator tile starts at
//!   `−128 · Σₖ W[n][k]` (column sums made at packing). Linux only (the tile state is granted
//!   per process on request).
//! * [`Kernel::Simd128`]: WebAssembly simd128, W and A sign-extended to 16 bits,
//!   `i32x4.dot_i16x8_s` (i16 × i16 pairs → i32, exact); only in builds for `wasm32` with
//!   the `simd128` target feature.
//! * [`Kernel::Dotprod`]: aarch64 FEAT_DotProd, `sdot` (s8 × s8 quads → i32, exact) by
//!   element: W's bytes as they are, four columns per vector, against one k quad of A.
//! * [`Kernel::I8mm`]: aarch64 FEAT_I8MM, `smmla` (a 2 × 8 by 8 × 2 s8 product → 2 × 2 i32,
//!   exact): two rows of A against two columns of W per instruction, twice `sdot`'s
//!   multiply-adds.
//! * [`Kernel::Scalar`]: plain Rust, the reference the others are tested against.
//!
//! Weights are packed once per kernel at load ([`PackedWeights`]); activations are rows of
//! [`QuantRows`], K padded with zeros to a multiple of 4.

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
mod aarch64_int13;
pub(crate) mod aligned;
pub(crate) mod bf16;
pub(crate) mod int13;
pub(crate) mod simd_f32;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm_int13;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_amx;
#[cfg(target_arch = "x86_64")]
mod x86_bf16;
#[cfg(target_arch = "x86_64")]
mod x86_bf16_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_f32;
#[cfg(target_arch = "x86_64")]
mod x86_int13;
#[cfg(target_arch = "x86_64")]
mod x86_int13_avx2;

use std::fmt;
use std::str::FromStr;

use ruri_core::{Error, Result};

use aligned::Aligned;

/// Rows of K are padded to a multiple of this (the VNNI kernel reads 4 bytes at a time).
pub(crate) const K_ALIGN: usize = 4;

/// An int8 GEMM kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kernel {
    /// Plain Rust: every CPU; the reference of the others. It also keeps
    /// [`AttentionPrecision::Bf16`](crate::AttentionPrecision::Bf16)'s products in plain
    /// Rust where the CPU has AVX-512 BF16 (the same bits; the tests compare the two).
    Scalar,
    /// x86-64 AVX2: 16-bit multiply-adds of sign-extended bytes.
    Avx2,
    /// x86-64 AVX-VNNI: 256-bit `vpdpbusd` (VEX), for CPUs without AVX-512 (Intel's client
    /// cores since Alder Lake). The source of [`Kernel::Avx512Vnni256`], compiled for VEX.
    AvxVnni,
    /// x86-64 AVX-512 VNNI + VL at 256 bits: the AVX-VNNI kernel's source compiled for the
    /// EVEX encoding of the same instruction, so that AVX-512 CPUs run (and test) it;
    /// [`Kernel::detect`] prefers [`Kernel::Avx512Vnni`] where both run.
    Avx512Vnni256,
    /// x86-64 AVX-512 VNNI (with AVX-512 BW): `vpdpbusd`.
    Avx512Vnni,
    /// x86-64 AMX-INT8 (Intel since Sapphire Rapids): `tdpbusd` on tiles; Linux, where the
    /// process is granted the tile state.
    Amx,
    /// WebAssembly simd128: 16-bit dot products of sign-extended bytes (`wasm32` builds
    /// with `-C target-feature=+simd128`; WebAssembly has no run-time detection).
    Simd128,
    /// aarch64 FEAT_DotProd: `sdot`, four s8 products per 32-bit lane.
    Dotprod,
    /// aarch64 FEAT_I8MM: `smmla`, 2 × 8 by 8 × 2 s8 matrix products.
    I8mm,
}

impl Kernel {
    /// Every kernel this build knows, whether or not this CPU runs it.
    pub const ALL: [Kernel; 9] = [
        Kernel::Scalar,
        Kernel::Avx2,
        Kernel::AvxVnni,
        Kernel::Avx512Vnni256,
        Kernel::Avx512Vnni,
        Kernel::Amx,
        Kernel::Simd128,
        Kernel::Dotprod,
        Kernel::I8mm,
    ];

    /// The name `RURI_KERNEL` and [`FromStr`] take.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "scalar",
            Kernel::Avx2 => "avx2",
            Kernel::AvxVnni => "avxvnni",
            Kernel::Avx512Vnni256 => "avx512vnni256",
            Kernel::Avx512Vnni => "avx512vnni",
            Kernel::Amx => "amx",
            Kernel::Simd128 => "simd128",
            Kernel::Dotprod => "dotprod",
            Kernel::I8mm => "i8mm",
        }
    }

    /// Whether this CPU (and this build's target) can run the kernel.
    pub fn is_available(self) -> bool {
        match self {
            Kernel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx2 | Kernel::Avx512Vnni => false,
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("avxvnni")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni256 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::AvxVnni | Kernel::Avx512Vnni256 => false,
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx => x86_amx::available(),
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Amx => false,
            Kernel::Simd128 => cfg!(all(target_arch = "wasm32", target_feature = "simd128")),
            #[cfg(target_arch = "aarch64")]
            Kernel::Dotprod => std::arch::is_aarch64_feature_detected!("dotprod"),
            #[cfg(target_arch = "aarch64")]
            Kernel::I8mm => std::arch::is_aarch64_feature_detected!("i8mm"),
            #[cfg(not(target_arch = "aarch64"))]
            Kernel::Dotprod | Kernel::I8mm => false,
        }
    }

    /// The kernels this CPU can run, fastest last.
    pub fn available() -> Vec<Kernel> {
        Self::ALL.into_iter().filter(|k| k.is_available()).collect()
    }

    /// The fastest kernel this CPU runs.
    pub fn detect() -> Kernel {
        *Self::available()
            .last()
            .expect("the scalar kernel is always available")
    }

    /// The kernel named by the environment variable `RURI_KERNEL`, if it is set (an unknown
    /// or unavailable name is an error); else [`Kernel::detect`].
    pub fn from_env() -> Result<Kernel> {
        match std::env::var("RURI_KERNEL") {
            Ok(name) if !name.is_empty() => Self::checked(&name, "RURI_KERNEL"),
            _ => Ok(Self::detect()),
        }
    }

    /// Parses `name` and checks that this CPU runs it; errors name `option`.
    pub(crate) fn checked(name: &str, option: &'static str) -> Result<Kernel> {
        let kernel = Self::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| Error::InvalidOption {
                name: option,
                value: name.to_owned(),
                reason: "unknown int8 kernel (known: scalar, avx2, avxvnni, avx512vnni256, avx512vnni, amx, simd128, dotprod, i8mm)",
            })?;
        kernel.ensure_available(option)?;
        Ok(kernel)
    }

    /// An error naming `option` when this CPU cannot run the kernel.
    pub(crate) fn ensure_available(self, option: &'static str) -> Result<()> {
        if self.is_available() {
            Ok(())
        } else {
            Err(Error::InvalidOption {
                name: option,
                value: self.name().to_owned(),
                reason: "this CPU (or this build's target) cannot run that int8 kernel",
            })
        }
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kernel {
    type Err = Error;

    /// A kernel by name (`scalar`, `avx2`, `avxvnni`, `avx512vnni256`, `avx512vnni`, `amx`,
    /// `simd128`, `dotprod`, `i8mm`); unavailable ones are an error too.
    fn from_str(name: &str) -> Result<Self> {
        Self::checked(name, "kernel")
    }
}

/// Calls `tile(r, mr, block)` for each tile of `mr ≤ max_rows` rows from row `r` and each of
/// `blocks` column blocks, in row blocks of 8 tiles, outermost: one block of A stays in cache
/// while every column block of W streams by. Each kernel's driver calls it from its
/// `#[target_feature]` function; it is inlined there, and its closure runs with those features.
#[inline(always)]
#[allow(dead_code)] // a build with no SIMD kernel (another target) calls it from none
pub(crate) fn for_each_tile(
    rows: usize,
    blocks: usize,
    max_rows: usize,
    mut tile: impl FnMut(usize, usize, usize),
) {
    let row_block = 8 * max_rows;
    for row0 in (0..rows).step_by(row_block) {
        let row_end = (row0 + row_block).min(rows);
        for block in 0..blocks {
            let mut r = row0;
            while r < row_end {
                let mr = (row_end - r).min(max_rows);
                tile(r, mr, block);
                r += mr;
            }
        }
    }
}

/// Rounds `len` up to a multiple of `to`.
pub(crate) fn round_up(len: usize, to: usize) -> usize {
    len.div_ceil(to) * to
}

/// Quantized activation rows: `rows × k_padded` signed bytes (padding zero), each row with
/// its dequantization scale and the sum of its bytes (the VNNI kernel's correction).
#[derive(Debug, Clone, Default)]
pub(crate) struct QuantRows {
    pub(crate) data: Vec<i8>,
    pub(crate) scales: Vec<f32>,
    pub(crate) sums: Vec<i32>,
    pub(crate) k_padded: usize,
}

impl QuantRows {
    /// Sizes the buffer for `rows` rows of `k` values (keeping its allocation). The first
    /// `k` bytes of each row keep whatever they held (the caller writes them all); the
    /// padding after them is zeroed.
    pub(crate) fn reset(&mut self, rows: usize, k: usize) {
        let kp = round_up(k, K_ALIGN);
        self.k_padded = kp;
        if self.data.len() < rows * kp {
            self.data.resize(rows * kp, 0);
        }
        if kp > k {
            for row in self.data.chunks_exact_mut(kp).take(rows) {
                row[k..].fill(0);
            }
        }
        self.scales.clear();
        self.scales.resize(rows, 0.0);
        self.sums.clear();
        self.sums.resize(rows, 0);
    }

    /// Row `r`'s bytes (with padding) for writing.
    pub(crate) fn row_mut(&mut self, r: usize) -> &mut [i8] {
        let kp = self.k_padded;
        &mut self.data[r * kp..(r + 1) * kp]
    }

    pub(crate) fn rows(&self) -> usize {
        self.scales.len()
    }
}

/// A weight matrix `n × k` (one row per output channel), quantized per output channel and
/// packed for one kernel.
#[derive(Debug, Clone)]
pub(crate) struct PackedWeights {
    pub(crate) kernel: Kernel,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) k_padded: usize,
    /// Columns of C the kernel writes per row (n rounded up to its column block).
    pub(crate) n_padded: usize,
    /// From a cache line (a 512-bit load of it then never splits two).
    data: Aligned<u8>,
    /// AMX only: `−128 · Σₖ w[col][k]` for each of the `n_padded` columns (the accumulators'
    /// start, which takes A's `+ 128` off); empty for the other kernels.
    bias: Vec<i32>,
    /// Dequantization scale of each output channel.
    pub(crate) scales: Vec<f32>,
}

impl PackedWeights {
    /// Packs `q` (`n × k` row-major signed bytes, one row per output channel) for `kernel`.
    pub(crate) fn pack(kernel: Kernel, q: &[i8], n: usize, k: usize, scales: Vec<f32>) -> Self {
        assert_eq!(q.len(), n * k, "packing a matrix of the wrong size");
        let k_padded = round_up(k, K_ALIGN);
        let (n_padded, data) = match kernel {
            Kernel::Scalar => {
                let mut data = Aligned::zeroed(n * k_padded);
                for (d, row) in data
                    .chunks_exact_mut(k_padded)
                    .zip(q.chunks_exact(k.max(1)))
                {
                    d.iter_mut().zip(row).for_each(|(d, &v)| *d = v as u8);
                }
                (n, data)
            }
            // Every SIMD kernel reads column panels: [column block][k group][column][group's
            // bytes]. Padded k and columns hold w = 0 (stored as 128 where W is w + 128, and
            // A's padding is 0), so they contribute nothing; padded columns are never read back.
            // AVX2: blocks of 16, k pairs (two halves of 8 columns per pair and block).
            Kernel::Avx2 => panels::<2>(q, (n, k), 16, k_padded, 0, |v| v as u8),
            // AVX-512 VNNI: blocks of 64 (four zmm of 16 columns), k quads, each byte w + 128.
            Kernel::Avx512Vnni => panels::<4>(q, (n, k), 64, k_padded, 128, plus_128),
            // The 256-bit VNNI pair: the same with blocks of 16 (two ymm of 8 columns).
            Kernel::AvxVnni | Kernel::Avx512Vnni256 => {
                panels::<4>(q, (n, k), 16, k_padded, 128, plus_128)
            }
            // AMX: B tiles of 16 columns × 16 k quads, W's bytes as they are, K padded to
            // whole 64-byte steps.
            Kernel::Amx => panels::<4>(q, (n, k), 16, round_up(k_padded, 64), 0, |v| v as u8),
            // simd128: blocks of 8, k pairs: one 16-byte vector per block and pair.
            Kernel::Simd128 => panels::<2>(q, (n, k), 8, k_padded, 0, |v| v as u8),
            // dotprod: blocks of 8, k quads (two vectors per block and quad), K rounded up to
            // 16 (the kernel reads A 16 bytes at a time).
            Kernel::Dotprod => panels::<4>(q, (n, k), 8, round_up(k_padded, 16), 0, |v| v as u8),
            // i8mm: blocks of 8, k octets (each 16 bytes the 2 × 8 operand of a column pair),
            // K rounded up to 16.
            Kernel::I8mm => panels::<8>(q, (n, k), 8, round_up(k_padded, 16), 0, |v| v as u8),
        };
        let bias = if kernel == Kernel::Amx {
            let mut bias: Vec<i32> = q
                .chunks_exact(k.max(1))
                .take(n)
                .map(|row| -128 * row.iter().map(|&v| i32::from(v)).sum::<i32>())
                .collect();
            bias.resize(n_padded, 0);
            bias
        } else {
            Vec::new()
        };
        Self {
            kernel,
            n,
            k,
            k_padded,
            n_padded,
            data,
            bias,
            scales,
        }
    }

    /// Bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.data.len() + 4 * (self.scales.len() + self.bias.len())
    }

    /// `c[r * n_padded + col] = Σₖ a[r][k] · w[col][k]` for every row of `a`; `c` holds
    /// `a.rows() × n_padded` values (the padded columns get values that mean nothing).
    /// `scratch` holds what a kernel derives from `a` (AMX: its unsigned copy), kept by the
    /// caller from call to call.
    pub(crate) fn gemm(&self, a: &QuantRows, c: &mut [i32], scratch: &mut Aligned<u8>) {
        self.gemm_columns(a, 0..self.n_padded, c, scratch)
    }

    /// Columns a multiple of this (or the last ones) can be computed apart by
    /// [`PackedWeights::gemm_columns`]: every kernel's column block divides it.
    pub(crate) const COLUMN_PIECE: usize = 64;

    /// [`PackedWeights::gemm`] for the columns `cols` only, into `c` with a row stride of
    /// `cols.len()`: `cols.start` a multiple of [`Self::COLUMN_PIECE`], `cols.end` one too
    /// or `n_padded`. Each column's value is the one `gemm` gives it.
    pub(crate) fn gemm_columns(
        &self,
        a: &QuantRows,
        cols: std::ops::Range<usize>,
        c: &mut [i32],
        scratch: &mut Aligned<u8>,
    ) {
        assert!(
            cols.start.is_multiple_of(Self::COLUMN_PIECE)
                && (cols.end.is_multiple_of(Self::COLUMN_PIECE) || cols.end == self.n_padded)
                && cols.start <= cols.end
                && cols.end <= self.n_padded,
            "columns {cols:?} are not whole pieces of {}",
            self.n_padded
        );
        if cols.is_empty() {
            return;
        }
        // Bytes per column of the packed data: panels keep a column's K together, so whole
        // blocks of columns are contiguous.
        let column_bytes = match self.kernel {
            Kernel::Amx => round_up(self.k_padded, 64),
            Kernel::Dotprod | Kernel::I8mm => round_up(self.k_padded, 16),
            _ => self.k_padded,
        };
        let data = &self.data[cols.start * column_bytes..cols.end * column_bytes];
        let bias = if self.bias.is_empty() {
            &self.bias[..]
        } else {
            &self.bias[cols.clone()]
        };
        // (The scalar kernel's columns are unpadded: its n_padded is n.)
        let n_padded = cols.len();
        // Only the AMX kernel keeps anything there, and only it reads the bias.
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (scratch, bias);
        assert_eq!(
            a.k_padded, self.k_padded,
            "activation and weight widths differ"
        );
        assert!(c.len() >= a.rows() * n_padded, "output buffer too small");
        let rows = a.rows();
        match self.kernel {
            Kernel::Scalar => scalar_gemm(a, data, n_padded, self.k_padded, c),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => x86::avx2_gemm(&a.data, rows, self.k_padded, data, n_padded, c),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => {
                x86::vnni_gemm(&a.data, &a.sums, rows, self.k_padded, data, n_padded, c)
            }
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx2 | Kernel::Avx512Vnni => {
                unreachable!("x86 kernels are refused on other targets at build time")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => {
                x86::avxvnni::gemm(&a.data, &a.sums, rows, self.k_padded, data, n_padded, c)
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni256 => {
                x86::avx512vnni256::gemm(&a.data, &a.sums, rows, self.k_padded, data, n_padded, c)
            }
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::AvxVnni | Kernel::Avx512Vnni256 => {
                unreachable!("x86 kernels are refused on other targets at build time")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx => x86_amx::gemm(
                &a.data,
                rows,
                self.k_padded,
                data,
                bias,
                n_padded,
                c,
                scratch,
            ),
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Amx => unreachable!("x86 kernels are refused on other targets at build time"),
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            Kernel::Simd128 => wasm::simd128_gemm(&a.data, rows, self.k_padded, data, n_padded, c),
            #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
            Kernel::Simd128 => {
                unreachable!("the simd128 kernel is refused on other targets at build time")
            }
            #[cfg(target_arch = "aarch64")]
            Kernel::Dotprod => {
                aarch64::dotprod_gemm(&a.data, rows, self.k_padded, data, n_padded, c)
            }
            #[cfg(target_arch = "aarch64")]
            Kernel::I8mm => aarch64::i8mm_gemm(&a.data, rows, self.k_padded, data, n_padded, c),
            #[cfg(not(target_arch = "aarch64"))]
            Kernel::Dotprod | Kernel::I8mm => {
                unreachable!("aarch64 kernels are refused on other targets at build time")
            }
        }
    }
}

/// `q` packed in column panels for a SIMD kernel: `[column block of nb][group of G k][column]
/// [G bytes]`, over `k_len` k (≥ `k`, a multiple of G) and `n` rounded up to `nb` columns,
/// each byte `map(w)`, the padding `fill`. Returns the padded column count and the bytes.
fn panels<const G: usize>(
    q: &[i8],
    (n, k): (usize, usize),
    nb: usize,
    k_len: usize,
    fill: u8,
    map: impl Fn(i8) -> u8,
) -> (usize, Aligned<u8>) {
    let n_padded = round_up(n, nb);
    let groups = k_len / G;
    let mut data = Aligned::filled(n_padded * groups * G, fill);
    let base = |col: usize| (col / nb) * groups * nb * G + (col % nb) * G;
    scatter::<G>(q, (n, k), &mut data, base, nb * G, map);
    (n_padded, data)
}

/// `w + 128` as u8: the VNNI kernels' weight bytes (`vpdpbusd` multiplies u8 by s8).
fn plus_128(v: i8) -> u8 {
    (i16::from(v) + 128) as u8
}

/// Stores, for each column `col` of `q` (`n × k`, row-major) and its `p`-th group of `G`
/// consecutive k (a pair or a quad), those G bytes, mapped, together at
/// `base(col) + p · stride` in `data`; the rest (padded columns, padded k) keeps its fill
/// value. Rows are read front to back.
fn scatter<const G: usize>(
    q: &[i8],
    (n, k): (usize, usize),
    data: &mut [u8],
    base: impl Fn(usize) -> usize,
    stride: usize,
    map: impl Fn(i8) -> u8,
) {
    for (col, row) in q.chunks_exact(k.max(1)).take(n).enumerate() {
        let mut at = base(col);
        let groups = row.chunks_exact(G);
        let tail = groups.remainder();
        for group in groups {
            let dst: &mut [u8; G] = (&mut data[at..at + G]).try_into().expect("G bytes");
            for (d, &v) in dst.iter_mut().zip(group) {
                *d = map(v);
            }
            at += stride;
        }
        if !tail.is_empty() {
            for (d, &v) in data[at..at + tail.len()].iter_mut().zip(tail) {
                *d = map(v);
            }
        }
    }
}

/// The reference kernel.
fn scalar_gemm(a: &QuantRows, w: &[u8], n: usize, kp: usize, c: &mut [i32]) {
    for (r, out) in c.chunks_exact_mut(n).take(a.rows()).enumerate() {
        let row = &a.data[r * kp..(r + 1) * kp];
        for (o, col) in out.iter_mut().zip(w.chunks_exact(kp)) {
            *o = row
                .iter()
                .zip(col)
                .map(|(&x, &y)| i32::from(x) * i32::from(y as i8))
                .sum();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn quant_rows(values: &[i8], rows: usize, k: usize) -> QuantRows {
        let mut a = QuantRows::default();
        a.reset(rows, k);
        for r in 0..rows {
            let row = &values[r * k..(r + 1) * k];
            a.row_mut(r)[..k].copy_from_slice(row);
            a.sums[r] = row.iter().map(|&v| i32::from(v)).sum();
            a.scales[r] = 1.0;
        }
        a
    }

    /// C as a dense `rows × n` matrix, whatever the kernel's padding.
    fn run(kernel: Kernel, a: &QuantRows, w: &[i8], n: usize, k: usize) -> Vec<i32> {
        let packed = PackedWeights::pack(kernel, w, n, k, vec![1.0; n]);
        let mut c = vec![0; a.rows() * packed.n_padded];
        packed.gemm(a, &mut c, &mut Aligned::default());
        c.chunks_exact(packed.n_padded)
            .flat_map(|row| row[..n].to_vec())
            .collect()
    }

    fn naive(a: &[i8], w: &[i8], rows: usize, n: usize, k: usize) -> Vec<i32> {
        let mut c = vec![0; rows * n];
        for r in 0..rows {
            for col in 0..n {
                let mut s = 0i64;
                for kk in 0..k {
                    s += i64::from(a[r * k + kk]) * i64::from(w[col * k + kk]);
                }
                c[r * n + col] = i32::try_from(s).unwrap();
            }
        }
        c
    }

    fn matrix(len: usize) -> impl Strategy<Value = Vec<i8>> {
        // Mostly the extremes: the values that saturate 16-bit pair sums if a kernel did.
        proptest::collection::vec(
            prop_oneof![Just(-127i8), Just(127i8), Just(-128i8), any::<i8>()],
            len,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Every kernel this CPU runs equals the scalar one, and the scalar one equals a
        /// 64-bit sum written independently, on shapes with every kind of tail.
        #[test]
        fn kernels_equal_scalar((rows, n, k, a, w) in (1usize..20, 1usize..150, 1usize..70)
            .prop_flat_map(|(rows, n, k)| (Just(rows), Just(n), Just(k), matrix(rows * k), matrix(n * k))))
        {
            // -128 is outside the symmetric range the quantizer produces; clamp like it.
            let a: Vec<i8> = a.into_iter().map(|v| v.max(-127)).collect();
            let w: Vec<i8> = w.into_iter().map(|v| v.max(-127)).collect();
            let expected = naive(&a, &w, rows, n, k);
            let qa = quant_rows(&a, rows, k);
            for kernel in Kernel::available() {
                prop_assert_eq!(&run(kernel, &qa, &w, n, k), &expected, "kernel {}", kernel);
            }
        }
    }

    /// The largest sums the model can produce (K = 3,072, the 310m shape's widest input, all
    /// products 127 · 127) are exact on every kernel.
    #[test]
    fn extreme_sums_are_exact() {
        let (rows, n, k) = (7, 70, 3072);
        let a = vec![127i8; rows * k];
        let mut w = vec![127i8; n * k];
        for v in w.iter_mut().skip(n * k / 2) {
            *v = -127;
        }
        let expected = naive(&a, &w, rows, n, k);
        assert_eq!(expected[0], 127 * 127 * 3072);
        let qa = quant_rows(&a, rows, k);
        for kernel in Kernel::available() {
            assert_eq!(run(kernel, &qa, &w, n, k), expected, "kernel {kernel}");
        }
    }

    /// AMX wins where it runs, then the widest VNNI: zmm wherever AVX-512 VNNI runs (its
    /// 256-bit twin is slower or equal there), then AVX-VNNI, then AVX2.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn detect_prefers_amx_then_zmm_vnni_then_avx_vnni_then_avx2() {
        let expected = [
            Kernel::Amx,
            Kernel::Avx512Vnni,
            Kernel::AvxVnni,
            Kernel::Avx2,
        ]
        .into_iter()
        .find(|k| k.is_available())
        .unwrap_or(Kernel::Scalar);
        assert_eq!(Kernel::detect(), expected);
    }

    #[test]
    fn names_parse_and_unknown_ones_are_typed_errors() {
        assert_eq!("scalar".parse::<Kernel>().unwrap(), Kernel::Scalar);
        for kernel in Kernel::ALL {
            assert_eq!(kernel.to_string(), kernel.name());
        }
        match "sse9".parse::<Kernel>() {
            Err(Error::InvalidOption { name, value, .. }) => {
                assert_eq!((name, value.as_str()), ("kernel", "sse9"));
            }
            other => panic!("expected InvalidOption, got {other:?}"),
        }
        for kernel in Kernel::ALL.into_iter().filter(|k| !k.is_available()) {
            assert!(matches!(
                kernel.name().parse::<Kernel>(),
                Err(Error::InvalidOption { .. })
            ));
        }
        assert!(Kernel::detect().is_available());
    }
}
