//! The AMX int8 kernel (Intel AMX-TILE + AMX-INT8, `tdpbusd`): all of its `unsafe` lives
//! here.
//!
//! `tdpbusd` multiplies an unsigned byte tile by a signed byte tile into i32 (16-bit
//! products summed in fours, no saturation: Intel SDM vol. 2, "TDPBSSD/TDPBSUD/TDPBUSD/
//! TDPBUUD"), so its sums are the same exact integers as every other kernel's. A's bytes go
//! in as `a + 128` (u8) and W's as they are (s8); `128 · Σₖ W[n][k]` is taken off by starting
//! each accumulator tile at `−128 · Σₖ W[n][k]` (a row of that, loaded with stride 0).
//!
//! Tiles are 16 rows × 64 bytes: C tiles 16 × 16 i32, A tiles 16 rows × 64 k, B tiles 16 k
//! quads × 16 columns (`PackedWeights::pack`'s panels of 16 columns, K padded to 64). Each
//! step runs a 32 × 32 block of C in four tiles (tmm0–3) from two A tiles (tmm4–5) and two B
//! tiles (tmm6–7).
//!
//! The instructions are written with `asm!` (the assembler knows them; Rust's AMX
//! intrinsics are not stable). The tile registers are never touched by compiled code, so
//! they keep their values from one `asm!` block to the next. Linux hands the tile data state
//! to a process only on request (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); this
//! kernel is available only once that request succeeded, and only on Linux.

use std::arch::asm;
use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
use std::sync::OnceLock;

use super::aligned::Aligned;

/// Rows and i32 columns of a C tile; rows of an A tile; k quads of a B tile.
pub(super) const TILE: usize = 16;
/// k of one step (an A tile's 64 bytes of a row).
pub(super) const K_STEP: usize = 64;

/// Whether this CPU has AMX-TILE and AMX-INT8, the OS enabled their state, and this process
/// was granted it (checked once).
pub(super) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| cpu_has_amx_int8() && request_tile_data())
}

/// CPUID leaf 7: EDX bit 24 (AMX-TILE), bit 25 (AMX-INT8); XCR0 bits 17 and 18 (tile
/// config and tile data state enabled by the OS).
fn cpu_has_amx_int8() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 is read only when leaf 0 reports it.
    // (`__cpuid` is a safe function in the Rust that builds here, an unsafe one in older
    // releases the declared rust-version may mean: hence the allowance.)
    #[allow(unused_unsafe)]
    let (max_leaf, leaf1) = unsafe { (__cpuid(0).eax, __cpuid(1)) };
    if max_leaf < 7 {
        return false;
    }
    // SAFETY: as above, leaf 7 is supported (max_leaf ≥ 7).
    #[allow(unused_unsafe)]
    let leaf7 = unsafe { __cpuid_count(7, 0) };
    let amx = leaf7.edx & (1 << 24) != 0 && leaf7.edx & (1 << 25) != 0;
    // XGETBV is only valid when the OS enabled XSAVE (CPUID.1:ECX.OSXSAVE, bit 27).
    if !amx || leaf1.ecx & (1 << 27) == 0 {
        return false;
    }
    let (lo, _hi): (u32, u32);
    // SAFETY: OSXSAVE is set (checked), so XGETBV with ECX = 0 reads XCR0 and has no other
    // effect.
    unsafe {
        asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") _hi, options(nomem, nostack, preserves_flags));
    }
    lo & (0b11 << 17) == 0b11 << 17
}

/// Linux: asks for the tile data state for this process (once; every thread may use it
/// after). Elsewhere AMX is not used.
#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM only changes which state components this
    // process may use; it reads and writes no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false
}

/// The tile configuration (palette 1): all eight tiles 16 rows × 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    fn all_full() -> Self {
        let mut colsb = [0u16; 16];
        let mut rows = [0u8; 16];
        for t in 0..8 {
            colsb[t] = 64;
            rows[t] = TILE as u8;
        }
        TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb,
            rows,
        }
    }
}

/// `c[r * n_padded + j] = Σₖ a[r][k] · w[j][k]` with `tdpbusd`. `a` is `rows × k_padded`
/// signed bytes; `w` is packed in panels of 16 columns over `k_steps · 64` k (k quads of 16
/// columns × 4 bytes, padding 0); `bias[j] = −128 · Σₖ w[j][k]` for each of the `n_padded`
/// columns (a multiple of 16). `ua` is scratch for A's unsigned copy (kept by the caller
/// from call to call, so that no call allocates).
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm(
    a: &[i8],
    rows: usize,
    k_padded: usize,
    w: &[u8],
    bias: &[i32],
    n_padded: usize,
    c: &mut [i32],
    ua: &mut Aligned<u8>,
) {
    assert!(available(), "AMX kernel on a CPU (or OS) without it");
    let k_steps = k_padded.div_ceil(K_STEP);
    let kp = k_steps * K_STEP;
    assert!(n_padded.is_multiple_of(TILE) && bias.len() >= n_padded);
    assert!(a.len() >= rows * k_padded);
    assert!(w.len() >= n_padded * kp && c.len() >= rows * n_padded);
    if rows == 0 {
        return;
    }
    // A as u8 (a + 128, the bits of a with the top one flipped), K padded to whole steps
    // and rows to whole tiles with 128 (a = 0: adds nothing; padded rows are never stored).
    let rows_padded = rows.div_ceil(TILE) * TILE;
    ua.clear();
    ua.resize(rows_padded * kp, 0x80);
    for (dst, src) in ua
        .chunks_exact_mut(kp)
        .zip(a.chunks_exact(k_padded.max(1)))
        .take(rows)
    {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = (s as u8) ^ 0x80;
        }
    }
    let config = TileConfig::all_full();
    // SAFETY: the CPU runs AMX-TILE/AMX-INT8 and this process may use the tile state
    // (`available`, checked above); `config` is a valid palette-1 configuration. Every tile
    // load reads 16 rows of 64 bytes inside `ua` (rows_padded × kp), `w` (n_padded × kp, a
    // panel of 16 columns per 16 · kp bytes) or `bias` (one row of 16 i32, stride 0); every
    // tile store writes 16 rows of 16 i32 inside `c` (only tiles whose 16 rows are all below
    // `rows`) or a local 16 × 16 buffer (checked above).
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly));
        blocks(ua, kp, rows, w, bias, n_padded, c);
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// The tile loop: rows in pairs of tiles (A stays in L1) outside, column pairs inside.
///
/// # Safety
/// Tiles configured by `gemm`, and `gemm`'s size checks.
unsafe fn blocks(
    ua: &[u8],
    kp: usize,
    rows: usize,
    w: &[u8],
    bias: &[i32],
    n_padded: usize,
    c: &mut [i32],
) {
    let col_tiles = n_padded / TILE;
    let row_tiles = rows.div_ceil(TILE);
    let k_steps = kp / K_STEP;
    let mut spill = [0i32; TILE * TILE];
    let mut rt = 0;
    while rt < row_tiles {
        let two_rows = rt + 1 < row_tiles;
        let mut ct = 0;
        while ct < col_tiles {
            let two_cols = ct + 1 < col_tiles;
            // SAFETY: the caller's contract; rt, rt + 1 (when used) < row_tiles and ct,
            // ct + 1 (when used) < col_tiles, so every bias row loaded is inside `bias`.
            unsafe {
                let a0 = ua.as_ptr().add(rt * TILE * kp);
                let w0 = w.as_ptr().add(ct * TILE * kp);
                let b0 = bias.as_ptr().add(ct * TILE);
                // The accumulators start at the correction (stride 0: one row, 16 times);
                // the second column tile's only when there is one (its bias is past the end
                // of `bias` otherwise).
                asm!("tileloadd tmm0, [{b} + {z}*1]", b = in(reg) b0, z = in(reg) 0usize, options(nostack, readonly));
                if two_cols {
                    asm!("tileloadd tmm1, [{b} + {z}*1]", b = in(reg) b0.add(TILE), z = in(reg) 0usize, options(nostack, readonly));
                }
                if two_rows {
                    asm!("tileloadd tmm2, [{b} + {z}*1]", b = in(reg) b0, z = in(reg) 0usize, options(nostack, readonly));
                    if two_cols {
                        asm!("tileloadd tmm3, [{b} + {z}*1]", b = in(reg) b0.add(TILE), z = in(reg) 0usize, options(nostack, readonly));
                    }
                }
                // Prefetch the next column pair's weights while this one runs (measured: a lone
                // 12-token query, whose weights stream from L3, 0.80 → 0.75 ms; documents
                // unchanged).
                let prefetch = ct + 3 < col_tiles;
                match (two_rows, two_cols, prefetch) {
                    (true, true, false) => steps::<true, true, false>(a0, kp, w0, k_steps),
                    (true, true, true) => steps::<true, true, true>(a0, kp, w0, k_steps),
                    (true, false, _) => steps::<true, false, false>(a0, kp, w0, k_steps),
                    (false, true, false) => steps::<false, true, false>(a0, kp, w0, k_steps),
                    (false, true, true) => steps::<false, true, true>(a0, kp, w0, k_steps),
                    (false, false, _) => steps::<false, false, false>(a0, kp, w0, k_steps),
                }
                let n = n_padded;
                store::<0>(c, rows, n, rt, ct, &mut spill);
                if two_cols {
                    store::<1>(c, rows, n, rt, ct + 1, &mut spill);
                }
                if two_rows {
                    store::<2>(c, rows, n, rt + 1, ct, &mut spill);
                    if two_cols {
                        store::<3>(c, rows, n, rt + 1, ct + 1, &mut spill);
                    }
                }
            }
            ct += 2;
        }
        rt += 2;
    }
}

/// Every k step of one block: tmm0 += A0·B0, tmm1 += A0·B1, tmm2 += A1·B0, tmm3 += A1·B1
/// (the second row or column tile only when `TWO_ROWS` / `TWO_COLS`); with `PREFETCH`, the
/// next column pair's weights are fetched meanwhile (it must exist).
///
/// # Safety
/// Tiles configured; `a` has 16 (32 with `TWO_ROWS`) rows of `kp` bytes, `w` one (two with
/// `TWO_COLS`; four with `PREFETCH`) panels of `16 · kp` bytes, `k_steps · 64 = kp`.
#[inline(always)]
unsafe fn steps<const TWO_ROWS: bool, const TWO_COLS: bool, const PREFETCH: bool>(
    a: *const u8,
    kp: usize,
    w: *const u8,
    k_steps: usize,
) {
    let panel = TILE * kp;
    for s in 0..k_steps {
        // SAFETY: s < k_steps: the A tiles' rows are inside `a` (64 bytes at s · 64 of each
        // row), the B tiles are the s-th 16 quads (1,024 bytes) of their panels.
        unsafe {
            let a_s = a.add(s * K_STEP);
            let w_s = w.add(s * TILE * 64);
            if PREFETCH {
                // The same step of the next column pair (its two B tiles, 2 KiB: 32 lines).
                let next = w_s.add(2 * panel);
                for line in 0..32 {
                    _mm_prefetch::<_MM_HINT_T0>(next.add(64 * line).cast());
                }
            }
            asm!("tileloadd tmm4, [{p} + {st}*1]", p = in(reg) a_s, st = in(reg) kp, options(nostack, readonly));
            asm!("tileloadd tmm6, [{p} + {st}*1]", p = in(reg) w_s, st = in(reg) 64usize, options(nostack, readonly));
            asm!("tdpbusd tmm0, tmm4, tmm6", options(nostack, nomem));
            if TWO_COLS {
                asm!("tileloadd tmm7, [{p} + {st}*1]", p = in(reg) w_s.add(panel), st = in(reg) 64usize, options(nostack, readonly));
                asm!("tdpbusd tmm1, tmm4, tmm7", options(nostack, nomem));
            }
            if TWO_ROWS {
                asm!("tileloadd tmm5, [{p} + {st}*1]", p = in(reg) a_s.add(TILE * kp), st = in(reg) kp, options(nostack, readonly));
                asm!("tdpbusd tmm2, tmm5, tmm6", options(nostack, nomem));
                if TWO_COLS {
                    asm!("tdpbusd tmm3, tmm5, tmm7", options(nostack, nomem));
                }
            }
        }
    }
}

/// Stores tile `T` (tmm0–3) as C's row tile `rt`, column tile `ct`: straight into `c` when
/// its 16 rows are all below `rows`, else through `spill`, keeping the rows that exist.
///
/// # Safety
/// Tiles configured; `ct < n / 16`, `rt < rows.div_ceil(16)`, `c` holds `rows × n` i32.
#[inline(always)]
unsafe fn store<const T: usize>(
    c: &mut [i32],
    rows: usize,
    n: usize,
    rt: usize,
    ct: usize,
    spill: &mut [i32; TILE * TILE],
) {
    let r0 = rt * TILE;
    let full = r0 + TILE <= rows;
    let (dst, stride) = if full {
        // SAFETY: rows r0..r0 + 16 exist in c, columns ct · 16 .. + 16 < n.
        (unsafe { c.as_mut_ptr().add(r0 * n + ct * TILE) }, 4 * n)
    } else {
        (spill.as_mut_ptr(), 4 * TILE)
    };
    // SAFETY: `dst` has 16 rows of 16 i32 at `stride` bytes (above).
    unsafe {
        match T {
            0 => {
                asm!("tilestored [{p} + {st}*1], tmm0", p = in(reg) dst, st = in(reg) stride, options(nostack))
            }
            1 => {
                asm!("tilestored [{p} + {st}*1], tmm1", p = in(reg) dst, st = in(reg) stride, options(nostack))
            }
            2 => {
                asm!("tilestored [{p} + {st}*1], tmm2", p = in(reg) dst, st = in(reg) stride, options(nostack))
            }
            _ => {
                asm!("tilestored [{p} + {st}*1], tmm3", p = in(reg) dst, st = in(reg) stride, options(nostack))
            }
        }
    }
    if !full {
        for (i, src) in spill.chunks_exact(TILE).take(rows - r0).enumerate() {
            let at = (r0 + i) * n + ct * TILE;
            c[at..at + TILE].copy_from_slice(src);
        }
    }
}
