//! The arithmetic of [`AttentionPrecision::Int13`](crate::AttentionPrecision::Int13):
//! attention's two products on 13-bit integers with exact integer sums, so that every
//! instruction set (and every order of the sums) gives the same bits, and AVX-512 VNNI's
//! `vpdpwssd` computes 32 multiply-adds an instruction (twice FMA's rate on the CPUs
//! measured; BENCHMARKS.md, twenty-first step). More accurate than
//! [`AttentionPrecision::Bf16`](crate::AttentionPrecision::Bf16) (NumPy:
//! `tools/spike/quant-attention/accuracy.py`, variant `qk13+pv13`).
//!
//! The definition, per head of one text (`L` = [`LEVELS`] = 4,095):
//!
//! * Quantization ([`quantizer`], [`quantize`]): a row of q (rotated; one query) or of k (one
//!   key) has `m = max|x|`, its multiplier `t = L / m` and scale `m / L` (f32, one rounding
//!   each), and each value becomes `rint(x · t)` (ties to even) as an integer in `−L..=L`. A
//!   row of zeros is zeros with scale 0; a row holding a NaN or an infinity has scale NaN
//!   (its values do not matter: its scores, and so its text's vector, are NaN). The values
//!   are quantized per channel the same way, over the text's keys, with the scale
//!   `(m / L) / L` (the weights' `1 / L` folded in).
//! * A score is the exact integer `Σ_c q[c] · k[c]` converted to f32 (to nearest even),
//!   times the key's scale, times the query's: `((dot as f32) · s_k) · s_q`.
//! * The softmax is [`AttentionPrecision::Bf16`](crate::AttentionPrecision::Bf16)'s
//!   (`super::bf16`'s `e`, totals and `1 / total`, bit for bit), with each weight the integer
//!   `rint(L · e)` (0..=L) instead of `e`'s bfloat16.
//! * An output channel is the exact integer `Σ_j w[j] · v[j][c]` over the keys converted to
//!   f32 (to nearest even), times the channel's scale, times the row's `1 / total`.
//!
//! Every sum is an integer computed exactly (i32 where it cannot overflow: a score of a head
//! of up to [`TILE_MAX_D`] channels, [`SUM_CHUNK`] key pairs of a weighted sum; i64 beyond),
//! so a block of queries may run over the union of their windows (a zero weight adds
//! nothing), and the tiles ([`Products`]) may sum in any order.
//! `tools/testdata/int8_reference.py --attention int13` writes the same definition in NumPy.

use super::aligned::Aligned;
use super::bf16::LANES;
use super::simd_f32::multiversion;

/// The largest magnitude of a quantized value, and of a weight.
pub(crate) const LEVELS: i32 = 4095;
/// [`LEVELS`] as f32.
pub(crate) const LEVELS_F32: f32 = LEVELS as f32;
/// The widest head whose scores the tiles sum in i32: `128 · 4095² < 2³¹`. Wider heads run
/// the portable loops, which sum in i64.
pub(crate) const TILE_MAX_D: usize = 128;
/// Key pairs whose weighted sum fits i32 (`2 · 64 · 4095² < 2³¹`): the sums go to i64 after
/// each chunk of this many pairs.
pub(crate) const SUM_CHUNK: usize = 64;

const _: () = assert!(
    (TILE_MAX_D as i64) * (LEVELS as i64) * (LEVELS as i64) <= i32::MAX as i64
        && 2 * (SUM_CHUNK as i64) * (LEVELS as i64) * (LEVELS as i64) <= i32::MAX as i64,
    "the tiles' i32 sums cannot overflow"
);

/// A row's (or a channel's) multiplier and scale from its largest magnitude `m` (see the
/// module's definition): the scalar form of [`quantizers`], for the tests' definition.
#[cfg(test)]
fn quantizer(m: f32) -> (f32, f32) {
    if m > 0.0 && m.is_finite() {
        (LEVELS_F32 / m, m / LEVELS_F32)
    } else if m == 0.0 {
        (0.0, 0.0)
    } else {
        (0.0, f32::NAN)
    }
}

/// The multipliers and scales of rows (or channels) from their largest magnitudes, as
/// [`quantizer`] gives them one by one: `t[i]` holds row `i`'s largest magnitude and
/// takes its multiplier in its place. Both
/// divisions are computed for every lane and the results selected (a vector division: one
/// row's two scalar divisions were a tenth of a short text's attention).
#[inline(always)]
pub(super) fn quantizers(t: &mut [f32], scales: &mut [f32]) {
    for (t, s) in t.iter_mut().zip(scales) {
        let m = *t;
        // m ≥ 0 or NaN: a largest magnitude.
        // (L / ∞ is 0: an infinite m needs no case of its own here. A zero row's
        // multiplier L / 0 = ∞ would give its values 0 · ∞ = NaN, which `quantize` happens
        // to read as 0; 0 says so plainly.)
        let (up, down) = (LEVELS_F32 / m, m / LEVELS_F32);
        *t = if m > 0.0 { up } else { 0.0 };
        let finite = m.is_finite();
        *s = if finite { down } else { f32::NAN };
    }
}

/// The bits of `|x|`: as unsigned integers they order the magnitudes, and every NaN's lie
/// above infinity's, so the largest bits are the largest magnitude, or a NaN where one is
/// (in any order, in integer maxes that vectorize).
#[inline(always)]
pub(super) fn abs_bits(x: f32) -> u32 {
    x.to_bits() & 0x7fff_ffff
}

/// The largest magnitude of `x`, a NaN if `x` holds one (see [`abs_bits`]). A plain fold:
/// the compiler vectorizes an integer max (it is associative) and folds the lanes in vector
/// steps, where lanes of its own made it compare lane by lane in scalars.
#[inline(always)]
fn max_abs(x: &[f32]) -> f32 {
    f32::from_bits(x.iter().fold(0, |m, &v| m.max(abs_bits(v))))
}

/// `rint(x · t)`, ties to even, in `−L..=L`: `x · t` clamped to ±L, plus 1.5 · 2²³
/// (`crate::math::ROUND_MAGIC`: the sum lies in [2²³, 2²⁴), where the addition rounds to an
/// integer, ties to even), the integer read from the sum's bits. (`round_ties_even` and a
/// conversion to i16 compile to a call and scalar steps that stop the loops from
/// vectorizing.) A NaN product (only in a row whose scale is NaN) gives some value.
#[inline(always)]
fn quantize(x: f32, t: f32) -> i16 {
    let magic = crate::math::ROUND_MAGIC;
    let shifted = (x * t).clamp(-LEVELS_F32, LEVELS_F32) + magic;
    shifted.to_bits().wrapping_sub(magic.to_bits()) as i16
}

/// A row quantized as the module says, one value at a time: its values into `out`, its
/// scale returned (the tests' definition; its largest magnitude a fold of f32 comparisons,
/// not [`max_abs`]'s bits).
#[cfg(test)]
fn quantize_row(x: &[f32], out: &mut [i16]) -> f32 {
    let m = x.iter().fold(0.0f32, |m, &v| {
        let a = v.abs();
        if a > m || a.is_nan() { a } else { m }
    });
    let (t, scale) = quantizer(m);
    for (o, &v) in out.iter_mut().zip(x) {
        *o = quantize(v, t);
    }
    scale
}

/// Rows read ahead of the one being packed: q, k and v are read in place, a head's `d`
/// values in rows of `3 · hidden` (3 KB for the 30m shape), a stride that the hardware's
/// prefetchers leave to miss.
const ROWS_AHEAD: usize = 8;

/// Asks for row `j + ROWS_AHEAD` of `x` (rows of `d` at `stride`), if there is one (int13's
/// and bf16's packing).
#[inline(always)]
pub(crate) fn prefetch_ahead(x: &[f32], j: usize, stride: usize, d: usize) {
    let start = (j + ROWS_AHEAD) * stride;
    if let Some(row) = x.get(start..start + d) {
        row.chunks(16).for_each(super::simd_f32::prefetch);
    }
}

/// Two quantized values as one packed pair: `lo` in the low half (the even element).
#[inline(always)]
pub(crate) fn pair(lo: i16, hi: i16) -> u32 {
    u32::from(lo as u16) | (u32::from(hi as u16) << 16)
}

/// The even (low) and odd (high) values of a packed pair.
#[inline(always)]
pub(crate) fn unpair(x: u32) -> (i32, i32) {
    (
        i32::from(x as u16 as i16),
        i32::from((x >> 16) as u16 as i16),
    )
}

/// Queries packed: `out[r · d/2 + c] = pair(q[r][2c], q[r][2c + 1])` quantized, for
/// `rows` rows of `d` (even) at a stride of `stride`, and `scales[r]` each row's scale.
/// On AVX-512 (`d` a multiple of 32) in vectors of 16 pairs, on AVX2 (`d` a multiple of
/// 16) in vectors of 8, with the same bits.
pub(crate) fn pack_queries(
    q: &[f32],
    stride: usize,
    rows: usize,
    d: usize,
    out: &mut Vec<u32>,
    scales: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(2 * LANES) && super::x86_int13::packers_available() {
        return super::x86_int13::pack_queries(q, stride, rows, d, out, scales);
    }
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(LANES) && super::x86_int13_avx2::available() {
        return super::x86_int13_avx2::pack_queries(q, stride, rows, d, out, scales);
    }
    pack_queries_portable(q, stride, rows, d, out, scales);
}

/// Keys packed group by group (the layout of `super::bf16::pack_keys`):
/// `out[(g · d/2 + c) · 16 + i] = pair(k[16g + i][2c], k[16g + i][2c + 1])` quantized, for
/// the `len` rows of `k` (row `j` is `d` values at `j · stride`, `d` even), 0 past the last
/// key; `scales[j]` each key's scale (0 past the last). Both are resized to whole groups.
/// On AVX-512 (`d` a multiple of 32) each key's pairs are made in vectors and 16 keys'
/// transposed into their lanes in registers; on AVX2 (`d` a multiple of 16) 8 keys' at a
/// time; with the same bits.
pub(crate) fn pack_keys(
    k: &[f32],
    stride: usize,
    len: usize,
    d: usize,
    out: &mut Aligned<u32>,
    scales: &mut Aligned<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(2 * LANES) && super::x86_int13::packers_available() {
        return super::x86_int13::pack_keys(k, stride, len, d, out, scales);
    }
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(LANES) && super::x86_int13_avx2::available() {
        return super::x86_int13_avx2::pack_keys(k, stride, len, d, out, scales);
    }
    pack_keys_portable(k, stride, len, d, out, scales);
}

/// Values packed by pairs of keys (the layout of `super::bf16::pack_values`):
/// `out[p · d + c] = pair(v[2p][c], v[2p + 1][c])` quantized per channel over the `len`
/// keys, a zero for the key past the last of an odd `len`; `scales[c]` each channel's
/// scale with the weights' `1 / L` (see the module's definition). On AVX-512 (`d` a
/// multiple of 16) in vectors of 16 channels, on AVX2 (`d` a multiple of 8) of 8, with the
/// same bits.
pub(crate) fn pack_values(
    v: &[f32],
    stride: usize,
    len: usize,
    d: usize,
    out: &mut Aligned<u32>,
    scales: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(LANES) && super::x86_int13::packers_available() {
        return super::x86_int13::pack_values(v, stride, len, d, out, scales);
    }
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(LANES / 2) && super::x86_int13_avx2::available() {
        return super::x86_int13_avx2::pack_values(v, stride, len, d, out, scales);
    }
    pack_values_portable(v, stride, len, d, out, scales);
}

multiversion! {
    /// [`pack_queries`] in portable loops.
    fn pack_queries_portable / pack_queries_body(q: &[f32], stride: usize, rows: usize, d: usize, out: &mut Vec<u32>, scales: &mut Vec<f32>)
}

multiversion! {
    /// [`pack_keys`] in portable loops.
    fn pack_keys_portable / pack_keys_body(k: &[f32], stride: usize, len: usize, d: usize, out: &mut Aligned<u32>, scales: &mut Aligned<f32>)
}

multiversion! {
    /// [`pack_values`] in portable loops.
    fn pack_values_portable / pack_values_body(v: &[f32], stride: usize, len: usize, d: usize, out: &mut Aligned<u32>, scales: &mut Vec<f32>)
}

/// The quantizers of rows `first..first + n` (`n` ≤ [`LANES`]) of `x` (rows of `d` at
/// `stride`): each row's multiplier into `t[i]`, its scale into `scales[i]` (the rest of
/// both 0). The rows are read once here (their prefetches asked for), so that their
/// quantization after finds them in the first-level cache.
#[inline(always)]
pub(super) fn group_quantizers(
    x: &[f32],
    stride: usize,
    (first, n): (usize, usize),
    d: usize,
    t: &mut [f32; LANES],
    scales: &mut [f32],
) {
    t.fill(0.0);
    for (i, m) in t.iter_mut().enumerate().take(n) {
        prefetch_ahead(x, first + i, stride, d);
        *m = max_abs(&x[(first + i) * stride..(first + i) * stride + d]);
    }
    quantizers(t, scales);
}

#[inline(always)]
fn pack_queries_body(
    q: &[f32],
    stride: usize,
    rows: usize,
    d: usize,
    out: &mut Vec<u32>,
    scales: &mut Vec<f32>,
) {
    assert!(d.is_multiple_of(2) && super::simd_f32::holds_rows(q.len(), rows, stride, d));
    let half = d / 2;
    out.clear();
    out.resize(rows * half, 0);
    scales.clear();
    scales.resize(rows.next_multiple_of(LANES), 0.0);
    let mut t = [0.0f32; LANES];
    for (g, s) in scales.as_chunks_mut::<LANES>().0.iter_mut().enumerate() {
        let (first, n) = (g * LANES, (rows - g * LANES).min(LANES));
        group_quantizers(q, stride, (first, n), d, &mut t, s);
        let out = &mut out[first * half..(first + n) * half];
        for ((o, &t), r) in out.chunks_exact_mut(half.max(1)).zip(&t).zip(first..) {
            let row = &q[r * stride..r * stride + d];
            for (o, two) in o.iter_mut().zip(row.as_chunks::<2>().0) {
                *o = pair(quantize(two[0], t), quantize(two[1], t));
            }
        }
    }
    scales.truncate(rows);
}

#[inline(always)]
fn pack_keys_body(
    k: &[f32],
    stride: usize,
    len: usize,
    d: usize,
    out: &mut Aligned<u32>,
    scales: &mut Aligned<f32>,
) {
    assert!(d.is_multiple_of(2) && super::simd_f32::holds_rows(k.len(), len, stride, d));
    let half = d / 2;
    let groups = len.div_ceil(LANES);
    out.clear();
    out.resize(groups * half * LANES, 0);
    scales.clear();
    scales.resize(groups * LANES, 0.0);
    // A group of keys at a time: their quantizers in one vector, then each key's pairs
    // quantized (in vectors) into a row of pairs and written into its lane of the
    // group's pairs.
    let (mut t, mut pairs) = ([0.0f32; LANES], [0u32; PAIRS_AT_ONCE]);
    let groups_out = out.as_chunks_mut::<LANES>().0.chunks_exact_mut(half.max(1));
    for ((g, s), lanes) in scales
        .as_chunks_mut::<LANES>()
        .0
        .iter_mut()
        .enumerate()
        .zip(groups_out)
    {
        let (first, n) = (g * LANES, (len - g * LANES).min(LANES));
        group_quantizers(k, stride, (first, n), d, &mut t, s);
        for ((i, &t), j) in t.iter().enumerate().take(n).zip(first..) {
            let row = &k[j * stride..j * stride + d];
            let chunks = lanes
                .chunks_mut(PAIRS_AT_ONCE)
                .zip(row.chunks(2 * PAIRS_AT_ONCE));
            for (lanes, row) in chunks {
                for (o, two) in pairs.iter_mut().zip(row.as_chunks::<2>().0) {
                    *o = pair(quantize(two[0], t), quantize(two[1], t));
                }
                for (lane, &x) in lanes.iter_mut().zip(&pairs) {
                    lane[i] = x;
                }
            }
        }
    }
}

/// Pairs a key's packing converts before it writes them into their lanes.
const PAIRS_AT_ONCE: usize = 64;

#[inline(always)]
fn pack_values_body(
    v: &[f32],
    stride: usize,
    len: usize,
    d: usize,
    out: &mut Aligned<u32>,
    scales: &mut Vec<f32>,
) {
    assert!(super::simd_f32::holds_rows(v.len(), len, stride, d));
    let row = |j: usize| &v[j * stride..j * stride + d];
    // `scales` holds the channels' scales, and past them, while the values are packed,
    // their multipliers (no buffer of its own a call).
    scales.clear();
    scales.resize(2 * d, 0.0);
    let (s, t) = scales.split_at_mut(d);
    // Each channel's largest magnitude, key after key (see `abs_bits`; as f32 bits in the
    // multipliers' place), then its multiplier and scale.
    for j in 0..len {
        prefetch_ahead(v, j, stride, d);
        for (m, &x) in t.iter_mut().zip(row(j)) {
            *m = f32::from_bits(m.to_bits().max(abs_bits(x)));
        }
    }
    quantizers(t, s);
    // The weights' 1 / L folded into the scales.
    s.iter_mut().for_each(|s| *s /= LEVELS_F32);
    out.clear();
    out.resize(len.div_ceil(2) * d, 0);
    for (p, o) in out.chunks_exact_mut(d.max(1)).enumerate() {
        let even = row(2 * p);
        if 2 * p + 1 < len {
            let odd = row(2 * p + 1);
            for (((o, &lo), &hi), &t) in o.iter_mut().zip(even).zip(odd).zip(&*t) {
                *o = pair(quantize(lo, t), quantize(hi, t));
            }
        } else {
            // The key past the last of an odd `len`: a zero.
            for ((o, &lo), &t) in o.iter_mut().zip(even).zip(&*t) {
                *o = pair(quantize(lo, t), 0);
            }
        }
    }
    scales.truncate(d);
}

/// Whether the buffers hold what [`Products::scores`] reads and writes (see
/// `super::bf16::scores_fit`), and the scales: `rows` of the queries', the keys' of the
/// groups read.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores_fit(
    (q, sq, kt, sk, out): (usize, usize, usize, usize, usize),
    rows: usize,
    d: usize,
    g_lo: usize,
    groups: usize,
) -> bool {
    super::bf16::scores_fit((q, kt, out), rows, d, g_lo, groups)
        && sq >= rows
        && g_lo
            .checked_add(groups)
            .and_then(|g| g.checked_mul(LANES))
            .is_some_and(|n| n <= sk)
}

/// Whether the buffers hold what [`Products::weighted_sum`] reads and writes (see
/// `super::bf16::weighted_sum_fits`; `out` is `rows` rows of `d` sums, consecutive).
pub(crate) fn weighted_sum_fits(
    (p, v, out): (usize, usize, usize),
    rows: usize,
    p_row: usize,
    pairs: usize,
    d: usize,
) -> bool {
    super::bf16::weighted_sum_fits((p, v, out), rows, p_row, pairs, d, d)
}

/// Where one tile of scores reads and writes: its queries' pairs (rows of `d / 2`,
/// consecutive) and scales, one group of 16 keys' pairs (pair `c` of key `i` at `c · 16 +
/// i`) and scales, and its rows of scores (16 of each, rows `groups · 16` apart).
#[cfg(any(
    all(target_arch = "aarch64", target_feature = "neon"),
    all(target_arch = "wasm32", target_feature = "simd128")
))]
pub(crate) type ScoreTileAt = (*const u32, *const f32, *const u32, *const f32, *mut f32);

/// The score tiles of an instruction set that the whole build enables (NEON on aarch64,
/// simd128 in a WebAssembly build with it), which [`scores_on_tiles`] walks: generic over
/// them, it inlines them (x86's tiles, compiled for target features of their own, have
/// drivers of their own).
#[cfg(any(
    all(target_arch = "aarch64", target_feature = "neon"),
    all(target_arch = "wasm32", target_feature = "simd128")
))]
pub(crate) trait ScoreTiles {
    /// `R` queries (`half` pairs each) against one group of 16 keys: each score the exact
    /// i32 dot product, converted (to nearest even), times the key's scale, times the
    /// query's, stored in rows of `width`.
    ///
    /// # Safety
    /// `at` holds `R` rows of `half` pairs and `R` scales, the group's `half · 16` pairs
    /// and 16 scales, and `R` rows of `width` scores with 16 writable at the start of each.
    unsafe fn tile<const R: usize>(at: ScoreTileAt, half: usize, width: usize);
}

/// Query rows of a full score tile of [`ScoreTiles`]: 16 accumulators on NEON (of 32
/// registers), 8 on simd128 (of the 16 that V8 has on x86-64).
#[cfg(any(
    all(target_arch = "aarch64", target_feature = "neon"),
    all(target_arch = "wasm32", target_feature = "simd128")
))]
const SCORE_TILE_ROWS: usize = 2;

/// [`Products::scores`] on `T`'s tiles (without the maxima); `d` at most [`TILE_MAX_D`].
#[cfg(any(
    all(target_arch = "aarch64", target_feature = "neon"),
    all(target_arch = "wasm32", target_feature = "simd128")
))]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn scores_on_tiles<T: ScoreTiles>(
    q: &[u32],
    sq: &[f32],
    rows: usize,
    d: usize,
    kt: &[u32],
    sk: &[f32],
    g_lo: usize,
    groups: usize,
    out: &mut [f32],
) {
    let lengths = (q.len(), sq.len(), kt.len(), sk.len(), out.len());
    assert!(d <= TILE_MAX_D && scores_fit(lengths, rows, d, g_lo, groups));
    let (half, width) = (d / 2, groups * LANES);
    for g in 0..groups {
        let mut r = 0;
        while r < rows {
            let mr = (rows - r).min(SCORE_TILE_ROWS);
            // SAFETY: rows r..r + mr ≤ rows of q, sq and out (`half` pairs, one scale and
            // `width` scores a row), group g_lo + g of kt (`half · 16` pairs) and of sk (16
            // scales), and the group's 16 scores in out's rows (`scores_fit`, checked above).
            unsafe {
                let at = (
                    q.as_ptr().add(r * half),
                    sq.as_ptr().add(r),
                    kt.as_ptr().add((g_lo + g) * half * LANES),
                    sk.as_ptr().add((g_lo + g) * LANES),
                    out.as_mut_ptr().add(r * width + g * LANES),
                );
                match mr {
                    SCORE_TILE_ROWS => T::tile::<SCORE_TILE_ROWS>(at, half, width),
                    _ => T::tile::<1>(at, half, width),
                }
            }
            r += mr;
        }
    }
}

multiversion! {
    /// [`Products::scores`] in this module's loops.
    fn scores_portable / scores_body(q: &[u32], sq: &[f32], rows: usize, d: usize, kt: &[u32], sk: &[f32], g_lo: usize, groups: usize, out: &mut [f32])
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn scores_body(
    q: &[u32],
    sq: &[f32],
    rows: usize,
    d: usize,
    kt: &[u32],
    sk: &[f32],
    g_lo: usize,
    groups: usize,
    out: &mut [f32],
) {
    let lengths = (q.len(), sq.len(), kt.len(), sk.len(), out.len());
    assert!(scores_fit(lengths, rows, d, g_lo, groups));
    let (half, width) = (d / 2, groups * LANES);
    // Four rows at a time where d allows i32 sums (TILE_MAX_D): four independent sums in
    // registers, each key pair unpacked once for the four.
    let mut r = 0;
    while d <= TILE_MAX_D && r + 4 <= rows {
        let qr: [&[u32]; 4] = std::array::from_fn(|i| &q[(r + i) * half..(r + i + 1) * half]);
        for g in 0..groups {
            let keys = &kt[(g_lo + g) * half * LANES..(g_lo + g + 1) * half * LANES];
            let mut acc = [[0i32; LANES]; 4];
            for (c, lanes) in keys.chunks_exact(LANES).enumerate() {
                let qc: [(i32, i32); 4] = std::array::from_fn(|i| unpair(qr[i][c]));
                for (l, &k) in lanes.iter().enumerate() {
                    let (k0, k1) = unpair(k);
                    for (acc, &(q0, q1)) in acc.iter_mut().zip(&qc) {
                        acc[l] += q0 * k0 + q1 * k1;
                    }
                }
            }
            let scales = &sk[(g_lo + g) * LANES..(g_lo + g + 1) * LANES];
            for (i, acc) in acc.iter().enumerate() {
                let row = &mut out[(r + i) * width + g * LANES..(r + i) * width + (g + 1) * LANES];
                for ((o, &dot), &s) in row.iter_mut().zip(acc).zip(scales) {
                    *o = (dot as f32 * s) * sq[r + i];
                }
            }
        }
        r += 4;
    }
    for r in r..rows {
        let qr = &q[r * half..(r + 1) * half];
        for g in 0..groups {
            let keys = &kt[(g_lo + g) * half * LANES..(g_lo + g + 1) * half * LANES];
            let dots: [i64; LANES] = if d <= TILE_MAX_D {
                // i32 cannot overflow here (see TILE_MAX_D), and i32 lanes vectorize.
                let mut acc = [0i32; LANES];
                for (&qc, lanes) in qr.iter().zip(keys.chunks_exact(LANES)) {
                    let (q0, q1) = unpair(qc);
                    for (a, &k) in acc.iter_mut().zip(lanes) {
                        let (k0, k1) = unpair(k);
                        *a += q0 * k0 + q1 * k1;
                    }
                }
                acc.map(i64::from)
            } else {
                let mut acc = [0i64; LANES];
                for (&qc, lanes) in qr.iter().zip(keys.chunks_exact(LANES)) {
                    let (q0, q1) = unpair(qc);
                    for (a, &k) in acc.iter_mut().zip(lanes) {
                        let (k0, k1) = unpair(k);
                        *a += i64::from(q0 * k0) + i64::from(q1 * k1);
                    }
                }
                acc
            };
            let scales = &sk[(g_lo + g) * LANES..(g_lo + g + 1) * LANES];
            let row = &mut out[r * width + g * LANES..r * width + (g + 1) * LANES];
            for ((o, &dot), &s) in row.iter_mut().zip(&dots).zip(scales) {
                *o = (dot as f32 * s) * sq[r];
            }
        }
    }
}

multiversion! {
    /// [`Products::weighted_sum`] in this module's loops.
    fn weighted_sum_portable / weighted_sum_body(p: &[u16], rows: usize, p_row: usize, v: &[u32], pairs: usize, d: usize, out: &mut [i64])
}

#[inline(always)]
fn weighted_sum_body(
    p: &[u16],
    rows: usize,
    p_row: usize,
    v: &[u32],
    pairs: usize,
    d: usize,
    out: &mut [i64],
) {
    assert!(weighted_sum_fits(
        (p.len(), v.len(), out.len()),
        rows,
        p_row,
        pairs,
        d
    ));
    // Row by row, channel vectors side by side: each key pair's products added to the
    // chunk's i32 sums, which go to i64 after each chunk of pairs (on the stack for heads
    // up to the tiles' width: this is every head's path on CPUs without tiles).
    let (mut stack, mut heap) = ([0i32; TILE_MAX_D], Vec::new());
    let chunk: &mut [i32] = if d <= TILE_MAX_D {
        &mut stack[..d]
    } else {
        heap.resize(d, 0);
        &mut heap
    };
    for r in 0..rows {
        let o = &mut out[r * d..(r + 1) * d];
        o.fill(0);
        let w = &p[r * p_row..];
        for j0 in (0..pairs).step_by(SUM_CHUNK) {
            chunk.fill(0);
            for j in j0..(j0 + SUM_CHUNK).min(pairs) {
                let (w0, w1) = (i32::from(w[2 * j]), i32::from(w[2 * j + 1]));
                for (a, &x) in chunk.iter_mut().zip(&v[j * d..(j + 1) * d]) {
                    let (v0, v1) = unpair(x);
                    *a += w0 * v0 + w1 * v1;
                }
            }
            for (o, &a) in o.iter_mut().zip(chunk.iter()) {
                *o += i64::from(a);
            }
        }
    }
}

multiversion! {
    /// The outputs of a block: `out[r][c] = ((sums[r][c] as f32) · scales[c]) · inv[r]` for
    /// `rows` rows of `d` (`sums` consecutive, `out` at `out_stride`).
    fn finish / finish_body(sums: &[i64], rows: usize, d: usize, scales: &[f32], inv: &[f32], out: &mut [f32], out_stride: usize)
}

#[inline(always)]
fn finish_body(
    sums: &[i64],
    rows: usize,
    d: usize,
    scales: &[f32],
    inv: &[f32],
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(scales.len() >= d && inv.len() >= rows && sums.len() >= rows * d);
    assert!(super::simd_f32::holds_rows(out.len(), rows, out_stride, d));
    for r in 0..rows {
        let o = &mut out[r * out_stride..r * out_stride + d];
        for ((o, &s), &scale) in o.iter_mut().zip(&sums[r * d..(r + 1) * d]).zip(scales) {
            *o = (to_f32(s) * scale) * inv[r];
        }
    }
}

/// `s as f32` (to nearest even) for |s| < 2⁵³, which every sum here is (at most 2 · 4095²
/// a key pair): its two halves converted to f64 and added, exactly, then rounded once to
/// f32. A conversion of i64 has no vector instruction before AVX-512 DQ, and made the loop
/// scalar; i32 and u32 to f64 have one.
#[inline(always)]
fn to_f32(s: i64) -> f32 {
    let (hi, lo) = ((s >> 32) as i32, s as u32);
    (f64::from(hi) * 4_294_967_296.0 + f64::from(lo)) as f32
}

/// One tile of a weighted sum, as [`sum_tiles`] walks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SumTile {
    /// The chunk's first key pair and its number of pairs (at most [`SUM_CHUNK`]).
    pub(crate) j0: usize,
    pub(crate) pairs: usize,
    /// Whether the chunk is the first (the i64 sums are stored, not added to) and the last.
    pub(crate) first: bool,
    pub(crate) last: bool,
    /// The tile's first row, and whether it has the full `mr` rows (else one).
    pub(crate) r: usize,
    pub(crate) full_rows: bool,
    /// The tile's first channel, and whether it has the wide width (else the narrow one).
    pub(crate) c0: usize,
    pub(crate) wide: bool,
}

/// The tiles of a weighted sum over `pairs` key pairs, `rows` rows and `d` channels (a
/// multiple of `narrow`), in the order the tiles run them: chunk by chunk of [`SUM_CHUNK`]
/// pairs (a chunk's values stay in L1 while every tile of rows goes over them), rows `mr`
/// at a time (the rest one by one), channels `wide` at a time (the rest `narrow`). The
/// drivers of `x86_int13`, `x86_int13_avx2`, `wasm_int13` and `aarch64_int13` share this walk
/// and call their tiles themselves: a tile passed as a closure would lose their target
/// features.
pub(crate) fn sum_tiles(
    rows: usize,
    pairs: usize,
    d: usize,
    mr: usize,
    (wide, narrow): (usize, usize),
) -> SumTiles {
    assert!(mr > 0 && narrow > 0 && wide >= narrow && d.is_multiple_of(narrow));
    SumTiles {
        shape: (rows, pairs, d, mr, wide, narrow),
        at: (rows > 0 && d > 0 && pairs > 0).then_some((0, 0, 0)),
    }
}

/// [`sum_tiles`]' walk: the shape, and the next tile's chunk, row and channel.
pub(crate) struct SumTiles {
    shape: (usize, usize, usize, usize, usize, usize),
    at: Option<(usize, usize, usize)>,
}

impl Iterator for SumTiles {
    type Item = SumTile;

    fn next(&mut self) -> Option<SumTile> {
        let (rows, pairs, d, mr, wide, narrow) = self.shape;
        let (j0, r, c0) = self.at?;
        let kn = SUM_CHUNK.min(pairs - j0);
        let tile = SumTile {
            j0,
            pairs: kn,
            first: j0 == 0,
            last: j0 + kn == pairs,
            r,
            full_rows: rows - r >= mr,
            c0,
            wide: d - c0 >= wide,
        };
        let c = c0 + if tile.wide { wide } else { narrow };
        let next_r = r + if tile.full_rows { mr } else { 1 };
        self.at = if c < d {
            Some((j0, r, c))
        } else if next_r < rows {
            Some((j0, next_r, 0))
        } else if j0 + kn < pairs {
            Some((j0 + kn, 0, 0))
        } else {
            None
        };
        Some(tile)
    }
}

/// Where [`Products::weighted_average`] puts a block's outputs: `out[r · out_stride + c] =
/// ((sum as f32) · scales[c]) · inv[r]` for its `rows` rows of `d` (see [`finish`]).
pub(crate) struct Finish<'a> {
    /// Each channel's scale (the weights' `1 / L` folded in), `d` of them.
    pub(crate) scales: &'a [f32],
    /// Each row's `1 / total`.
    pub(crate) inv: &'a [f32],
    /// The outputs, rows `out_stride` apart.
    pub(crate) out: &'a mut [f32],
    /// The distance between two rows of `out`.
    pub(crate) out_stride: usize,
}

impl Finish<'_> {
    /// Whether the buffers hold `rows` rows of `d` outputs (and their scales and inverses).
    fn fits(&self, rows: usize, d: usize) -> bool {
        self.scales.len() >= d
            && self.inv.len() >= rows
            && super::simd_f32::holds_rows(self.out.len(), rows, self.out_stride, d)
    }

    /// The outputs of `rows` rows of `d` as the tiles take them; panics unless the buffers
    /// hold them.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )] // the tiles'
    pub(crate) fn at(self, rows: usize, d: usize) -> FinishAt {
        assert!(self.fits(rows, d), "a block's outputs past their buffers");
        (
            self.scales.as_ptr(),
            self.inv.as_ptr(),
            self.out.as_mut_ptr(),
            self.out_stride,
        )
    }
}

/// A block's outputs as the tiles take them ([`Finish::at`]): the channels' scales, the
/// rows' `1 / total`, the outputs and their stride.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) type FinishAt = (*const f32, *const f32, *mut f32, usize);

/// `at` moved to a tile's first row `r` and channel `c`.
///
/// # Safety
/// `at` holds row `r` and channel `c` (the pointers stay inside their buffers).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
#[inline(always)]
pub(crate) unsafe fn finish_tile(
    (scales, inv, out, stride): FinishAt,
    r: usize,
    c: usize,
) -> FinishAt {
    // SAFETY: the caller's: row r and channel c are inside the buffers.
    unsafe { (scales.add(c), inv.add(r), out.add(r * stride + c), stride) }
}

/// Where a block's two products run: the same integers, so the same bits, either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Products {
    /// This module's loops: every CPU.
    Portable,
    /// `x86_int13`'s `vpdpwssd` tiles (AVX-512F, BW and VNNI), and its softmax.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
    /// `x86_int13_avx2`'s `vpmaddwd` tiles (AVX2), for x86 CPUs without AVX-512 VNNI.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// `wasm_int13`'s `i32x4.dot_i16x8_s` tiles (WebAssembly built with simd128).
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    Simd128,
    /// `aarch64_int13`'s `smlal` tiles (NEON: every aarch64 CPU).
    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
    Neon,
}

impl Products {
    /// The fastest tiles this CPU has, else the portable loops (found once per process:
    /// every layer of every call asks).
    pub(crate) fn detect() -> Self {
        static DETECTED: std::sync::OnceLock<Products> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| Self::all().pop().expect("the portable loops at least"))
    }

    /// The variant's name in benchmarks.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Products::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Products::Avx512Vnni => "avx512vnni",
            #[cfg(target_arch = "x86_64")]
            Products::Avx2 => "avx2",
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            Products::Simd128 => "simd128",
            #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
            Products::Neon => "neon",
        }
    }

    /// Every variant this CPU runs, slowest first: the portable loops, the AVX2 tiles, the
    /// AVX-512 VNNI tiles (or simd128's, in a WebAssembly build with it; NEON's on aarch64).
    pub(crate) fn all() -> Vec<Self> {
        #[allow(unused_mut)] // tiles only on x86-64, aarch64 and simd128
        let mut all = vec![Products::Portable];
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        all.push(Products::Simd128);
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        all.push(Products::Neon);
        #[cfg(target_arch = "x86_64")]
        {
            if super::x86_int13_avx2::available() {
                all.push(Products::Avx2);
            }
            if super::x86_int13::available() {
                all.push(Products::Avx512Vnni);
            }
        }
        all
    }

    /// `out[r][16·g + i]` = the score of query `r` (`q`: rows of `d/2` pairs from
    /// [`pack_queries`], `sq` their scales) against key `16 · (g_lo + g) + i` (`kt`, `sk`
    /// from [`pack_keys`]), for `rows` queries and `groups` groups. With `row_max =
    /// Some((max, keys))`, also `max[r]` = the max of row `r`'s first `keys` scores and
    /// `max[r]` as it was (`if x > m`: NaNs left out), which the softmax can take instead
    /// of reading the scores once more.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn scores(
        self,
        (q, sq): (&[u32], &[f32]),
        rows: usize,
        d: usize,
        (kt, sk): (&[u32], &[f32]),
        (g_lo, groups): (usize, usize),
        out: &mut [f32],
        row_max: Option<(&mut [f32], usize)>,
    ) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Products::Avx512Vnni if d <= TILE_MAX_D => {
                super::x86_int13::scores(q, sq, rows, d, kt, sk, g_lo, groups, out, row_max)
            }
            #[cfg(target_arch = "x86_64")]
            Products::Avx2 if d <= TILE_MAX_D => {
                super::x86_int13_avx2::scores(q, sq, rows, d, kt, sk, g_lo, groups, out, row_max)
            }
            _ => {
                match self {
                    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
                    Products::Simd128 if d <= TILE_MAX_D => {
                        use super::wasm_int13::Tiles;
                        scores_on_tiles::<Tiles>(q, sq, rows, d, kt, sk, g_lo, groups, out)
                    }
                    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
                    Products::Neon if d <= TILE_MAX_D => {
                        use super::aarch64_int13::Tiles;
                        scores_on_tiles::<Tiles>(q, sq, rows, d, kt, sk, g_lo, groups, out)
                    }
                    _ => scores_portable(q, sq, rows, d, kt, sk, g_lo, groups, out),
                }
                if let Some((max, keys)) = row_max {
                    let width = groups * LANES;
                    let scores = &out[..rows * width];
                    super::bf16::fold_row_maxes(scores, width, keys, &mut max[..rows]);
                }
            }
        }
    }

    /// `out[r][c]` (rows of `d`, consecutive) = the exact `Σ_j p[r][j] · v[j][c]` over key
    /// pairs `pair_lo..pair_lo + pairs` of the values (`v` from [`pack_values`]; `p`: a
    /// weight per key from the block's first pair, rows `p_row` apart). Written, not added
    /// to. The tiles take `d` a multiple of 16 (AVX2's: of 8; simd128's and NEON's: of 4);
    /// other widths run the portable loops.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn weighted_sum(
        self,
        p: &[u16],
        rows: usize,
        p_row: usize,
        v: &[u32],
        (pair_lo, pairs): (usize, usize),
        d: usize,
        out: &mut [i64],
    ) {
        let v = &v[pair_lo * d..];
        match self {
            #[cfg(target_arch = "x86_64")]
            Products::Avx512Vnni if d.is_multiple_of(LANES) => {
                super::x86_int13::weighted_sum(p, rows, p_row, v, pairs, d, out, None)
            }
            #[cfg(target_arch = "x86_64")]
            Products::Avx2 if d.is_multiple_of(LANES / 2) => {
                super::x86_int13_avx2::weighted_sum(p, rows, p_row, v, pairs, d, out, None)
            }
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            Products::Simd128 if d.is_multiple_of(LANES / 4) => {
                super::wasm_int13::weighted_sum(p, rows, p_row, v, pairs, d, out)
            }
            #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
            Products::Neon if d.is_multiple_of(LANES / 4) => {
                super::aarch64_int13::weighted_sum(p, rows, p_row, v, pairs, d, out, None)
            }
            _ => weighted_sum_portable(p, rows, p_row, v, pairs, d, out),
        }
    }

    /// [`Products::weighted_sum`] and then [`finish`]: a block's outputs `finish.out[r][c]
    /// = ((Σ_j p[r][j] · v[j][c] as f32) · scales[c]) · inv[r]`, with `sums` (rows of `d`)
    /// as scratch. The AVX-512 VNNI and NEON tiles convert and scale each row's sums where
    /// they end, in the tile (a short text's sums then never leave their registers), and so
    /// do the AVX2 tiles where every sum is one chunk's (at most [`SUM_CHUNK`] key pairs:
    /// AVX2 has no conversion of i64 to f32); the others sum, then finish.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn weighted_average(
        self,
        p: &[u16],
        rows: usize,
        p_row: usize,
        v: &[u32],
        (pair_lo, pairs): (usize, usize),
        d: usize,
        sums: &mut [i64],
        finish: Finish<'_>,
    ) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Products::Avx512Vnni if d.is_multiple_of(LANES) && pairs > 0 => {
                let v = &v[pair_lo * d..];
                super::x86_int13::weighted_sum(p, rows, p_row, v, pairs, d, sums, Some(finish))
            }
            // A short text's sums (one chunk of pairs) finished in AVX2's tiles too.
            #[cfg(target_arch = "x86_64")]
            Products::Avx2 if d.is_multiple_of(LANES / 2) && (1..=SUM_CHUNK).contains(&pairs) => {
                let v = &v[pair_lo * d..];
                super::x86_int13_avx2::weighted_sum(p, rows, p_row, v, pairs, d, sums, Some(finish))
            }
            // And in NEON's, which converts i64 to f32 through f64 (exact below 2⁵³).
            #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
            Products::Neon if d.is_multiple_of(LANES / 4) && pairs > 0 => {
                let v = &v[pair_lo * d..];
                super::aarch64_int13::weighted_sum(p, rows, p_row, v, pairs, d, sums, Some(finish))
            }
            _ => {
                self.weighted_sum(p, rows, p_row, v, (pair_lo, pairs), d, sums);
                let Finish {
                    scales,
                    inv,
                    out,
                    out_stride,
                } = finish;
                self::finish(sums, rows, d, scales, inv, out, out_stride);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn quantization_rounds_to_the_levels_and_keeps_the_scale() {
        let mut q = [0i16; 4];
        // m = 2: t = 2047.5, scale 2 / 4095.
        let s = quantize_row(&[2.0, -1.0, 0.5, 0.0001], &mut q);
        assert_eq!(q, [4095, -2048, 1024, 0]);
        assert_eq!(s, 2.0 / 4095.0);
        assert_eq!(quantize_row(&[0.0, -0.0], &mut q[..2]), 0.0);
        assert_eq!(&q[..2], &[0, 0]);
        assert!(quantize_row(&[1.0, f32::NAN], &mut q[..2]).is_nan());
        assert!(quantize_row(&[f32::INFINITY, 1.0], &mut q[..2]).is_nan());
        assert_eq!(unpair(pair(-4095, 17)), (-4095, 17));
    }

    /// The weighted sums' walk covers every (row, channel, key pair) once, chunk by chunk
    /// in order, with full tiles where they fit and the flags of the first and last chunk.
    #[test]
    fn sum_tiles_cover_every_sum_once() {
        for (rows, pairs, d, mr, wide, narrow) in [
            (1, 1, 16, 4, 64, 16),
            (9, 150, 64, 4, 64, 16),
            (5, 64, 24, 2, 32, 8),
            (3, 65, 4, 2, 16, 4),
            (0, 10, 64, 4, 64, 16),
            (4, 0, 64, 4, 64, 16),
        ] {
            let mut seen = vec![0u8; rows * pairs * d];
            let mut last_j0 = 0;
            for t in sum_tiles(rows, pairs, d, mr, (wide, narrow)) {
                assert!(t.j0 >= last_j0 && t.pairs <= SUM_CHUNK && t.pairs > 0);
                last_j0 = t.j0;
                assert_eq!((t.first, t.last), (t.j0 == 0, t.j0 + t.pairs == pairs));
                let (n_rows, n_cols) = (
                    if t.full_rows { mr } else { 1 },
                    if t.wide { wide } else { narrow },
                );
                assert!(t.r + n_rows <= rows && t.c0 + n_cols <= d);
                assert_eq!(t.full_rows, rows - t.r >= mr);
                for r in t.r..t.r + n_rows {
                    for j in t.j0..t.j0 + t.pairs {
                        for c in t.c0..t.c0 + n_cols {
                            seen[(r * pairs + j) * d + c] += 1;
                        }
                    }
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "{rows} {pairs} {d}");
        }
    }

    /// The packers (a group of rows at a time, their maxes as integer bits, their
    /// quantizers in vectors) give each row's and each channel's values and scale as the
    /// one-value-at-a-time definition does, rows of zeros, NaNs and infinities included, on
    /// heads wider than a key's pairs at once and texts past one group of keys.
    #[test]
    fn packers_quantize_as_the_definition_does() {
        for (len, d) in [(1, 2), (5, 64), (20, 64), (37, 160), (16, 24)] {
            let stride = d + 3;
            let mut x = values(len as u64 * 31 + d as u64, len * stride, 7);
            if len > 1 {
                x[stride..stride + d].fill(0.0);
            }
            if len > 3 {
                x[2 * stride + d / 2] = f32::NAN;
                x[3 * stride] = f32::NEG_INFINITY;
            }
            let bits = |s: f32| if s.is_nan() { u32::MAX } else { s.to_bits() };
            let mut want = vec![0i16; d];
            // Queries and keys: per row.
            let (mut q, mut sq) = (Vec::new(), Vec::new());
            pack_queries(&x, stride, len, d, &mut q, &mut sq);
            let (mut k, mut sk) = (Aligned::default(), Aligned::default());
            pack_keys(&x, stride, len, d, &mut k, &mut sk);
            assert_eq!((sq.len(), sk.len()), (len, len.next_multiple_of(LANES)));
            assert!(sk[len..].iter().all(|&s| s == 0.0));
            let half = d / 2;
            for j in 0..len {
                let s = quantize_row(&x[j * stride..j * stride + d], &mut want);
                assert_eq!(
                    (bits(sq[j]), bits(sk[j])),
                    (bits(s), bits(s)),
                    "{len} {d} {j}"
                );
                if s.is_nan() {
                    continue;
                }
                for c in 0..half {
                    let expected = pair(want[2 * c], want[2 * c + 1]);
                    let key = k[((j / LANES) * half + c) * LANES + j % LANES];
                    assert_eq!(
                        (q[j * half + c], key),
                        (expected, expected),
                        "{len} {d} {j} {c}"
                    );
                }
            }
            // Values: per channel, over the keys.
            let (mut v, mut sv) = (Aligned::default(), Vec::new());
            pack_values(&x, stride, len, d, &mut v, &mut sv);
            assert_eq!((sv.len(), v.len()), (d, len.div_ceil(2) * d));
            let mut column = vec![0i16; len + 1];
            for c in 0..d {
                let channel: Vec<f32> = (0..len).map(|j| x[j * stride + c]).collect();
                let s = quantize_row(&channel, &mut column[..len]) / LEVELS_F32;
                assert_eq!(bits(sv[c]), bits(s), "{len} {d} {c}");
                if !s.is_nan() {
                    column[len] = 0;
                    for p in 0..len.div_ceil(2) {
                        let expected = pair(column[2 * p], column[2 * p + 1]);
                        assert_eq!(v[p * d + c], expected, "{len} {d} {c} {p}");
                    }
                }
            }
        }
    }

    #[test]
    fn sums_convert_as_a_cast_would() {
        // Around 2²⁴ (where f32 starts to round), ties, the signs, the largest sums.
        let mut cases = vec![0i64, 1, -1, (1 << 24) + 1, (1 << 24) + 3, -(1 << 25) - 3];
        cases.extend([i64::from(i32::MAX), i64::from(i32::MIN), (1 << 37) + 12_345]);
        cases.extend([(1 << 52) - 1, -(1 << 52) + 7, (1 << 40) + (1 << 16) + 1]);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..10_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            cases.push((state as i64) >> (11 + state % 30));
        }
        for s in cases {
            assert_eq!(to_f32(s).to_bits(), (s as f32).to_bits(), "{s}");
        }
    }

    /// Rows of random values of magnitudes up to `2^spread`.
    fn values(seed: u64, n: usize, spread: i32) -> Vec<f32> {
        let mut state = seed | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let unit = (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                unit * 2f32.powi((state % (spread as u64 + 1)) as i32)
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The packers this CPU runs (AVX-512's vectors and transposes where it has them),
        /// and AVX2's where it has AVX2, give the portable packers' bytes and scales, on
        /// texts of one key to past two groups, strided rows, heads of 8 to 128 channels,
        /// with rows of zeros, a NaN and infinities.
        #[test]
        fn packers_give_the_portable_bytes(
            len in 1usize..=40,
            d in prop_oneof![Just(32usize), Just(64usize), Just(128usize), Just(16usize), Just(48usize), Just(8usize), Just(24usize)],
            pad in 0usize..5,
            specials in proptest::collection::vec((any::<usize>(), 0u8..4), 0..4),
            seed in any::<u64>(),
        ) {
            let stride = d + pad;
            let mut x = values(seed, len * stride, 9);
            for (at, kind) in specials {
                let at = at % x.len();
                match kind {
                    0 => x[at] = f32::NAN,
                    1 => x[at] = f32::INFINITY,
                    2 => x[at] = f32::NEG_INFINITY,
                    _ => {
                        let row = at / stride;
                        x[row * stride..row * stride + d].fill(0.0);
                    }
                }
            }
            let bits = |s: &[f32]| s.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            // The buffers hold another text's packing first (longer: what a shorter text
            // leaves unwritten must not show), the portable packers' are new.
            let other = values(!seed, 40 * stride, 3);
            if d.is_multiple_of(2 * LANES) {
                let (mut q, mut sq, mut q0, mut sq0) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                pack_queries(&other, stride, 40, d, &mut q, &mut sq);
                pack_queries(&x, stride, len, d, &mut q, &mut sq);
                pack_queries_portable(&x, stride, len, d, &mut q0, &mut sq0);
                prop_assert_eq!((&q, bits(&sq)), (&q0, bits(&sq0)));
                let (mut k, mut sk) = (Aligned::default(), Aligned::default());
                let (mut k0, mut sk0) = (Aligned::default(), Aligned::default());
                pack_keys(&other, stride, 40, d, &mut k, &mut sk);
                pack_keys(&x, stride, len, d, &mut k, &mut sk);
                pack_keys_portable(&x, stride, len, d, &mut k0, &mut sk0);
                prop_assert_eq!((&k[..], bits(&sk)), (&k0[..], bits(&sk0)));
            }
            let (mut v, mut sv) = (Aligned::default(), Vec::new());
            let (mut v0, mut sv0) = (Aligned::default(), Vec::new());
            pack_values(&other, stride, 40, d, &mut v, &mut sv);
            pack_values(&x, stride, len, d, &mut v, &mut sv);
            pack_values_portable(&x, stride, len, d, &mut v0, &mut sv0);
            prop_assert_eq!((&v[..], bits(&sv)), (&v0[..], bits(&sv0)));
            // AVX2's packers (the dispatchers above take AVX-512's where the CPU has them).
            #[cfg(target_arch = "x86_64")]
            if super::super::x86_int13_avx2::available() {
                use super::super::x86_int13_avx2 as avx2;
                if d.is_multiple_of(LANES) {
                    let (mut q, mut sq, mut q0, mut sq0) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                    avx2::pack_queries(&other, stride, 40, d, &mut q, &mut sq);
                    avx2::pack_queries(&x, stride, len, d, &mut q, &mut sq);
                    pack_queries_portable(&x, stride, len, d, &mut q0, &mut sq0);
                    prop_assert_eq!((&q, bits(&sq)), (&q0, bits(&sq0)), "AVX2 queries");
                    let (mut k, mut sk) = (Aligned::default(), Aligned::default());
                    let (mut k0, mut sk0) = (Aligned::default(), Aligned::default());
                    avx2::pack_keys(&other, stride, 40, d, &mut k, &mut sk);
                    avx2::pack_keys(&x, stride, len, d, &mut k, &mut sk);
                    pack_keys_portable(&x, stride, len, d, &mut k0, &mut sk0);
                    prop_assert_eq!((&k[..], bits(&sk)), (&k0[..], bits(&sk0)), "AVX2 keys");
                }
                let (mut v, mut sv) = (Aligned::default(), Vec::new());
                avx2::pack_values(&other, stride, 40, d, &mut v, &mut sv);
                avx2::pack_values(&x, stride, len, d, &mut v, &mut sv);
                prop_assert_eq!((&v[..], bits(&sv)), (&v0[..], bits(&sv0)), "AVX2 values");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// The scores from the portable loops and from every tile this CPU runs, bit for
        /// bit, and each the definition's, computed here in i64 and f32 from the quantized
        /// values (a head past the tiles' width included).
        #[test]
        fn scores_are_the_definitions_on_every_variant(
            rows in 1usize..=9,
            keys in 1usize..=70,
            g_lo in 0usize..2,
            d in prop_oneof![Just(64usize), Just(2usize), Just(24usize), Just(160usize)],
            seed in any::<u64>(),
        ) {
            let len = g_lo * LANES + keys;
            let q = values(seed, rows * d, 6);
            let mut k = values(seed ^ 0x5555, len * d, 6);
            if seed % 4 == 0 {
                // A key holding a NaN: its scale, so its scores, are NaN (which the maxes
                // leave out).
                k[(seed as usize >> 8) % (len * d)] = f32::NAN;
            }
            let (mut qp, mut sq) = (Vec::new(), Vec::new());
            pack_queries(&q, d, rows, d, &mut qp, &mut sq);
            let (mut kt, mut sk) = (Aligned::default(), Aligned::default());
            pack_keys(&k, d, len, d, &mut kt, &mut sk);
            let groups = len.div_ceil(LANES) - g_lo;
            let width = groups * LANES;
            // The definition, from the quantized rows.
            let (mut qi, mut ki) = (vec![0i16; d], vec![0i16; d]);
            let mut expected = vec![0.0f32; rows * width];
            for r in 0..rows {
                let s_q = quantize_row(&q[r * d..(r + 1) * d], &mut qi);
                for i in 0..width {
                    let j = g_lo * LANES + i;
                    let (dot, s_k) = if j < len {
                        let s_k = quantize_row(&k[j * d..(j + 1) * d], &mut ki);
                        let dot: i64 = qi.iter().zip(&ki).map(|(&a, &b)| i64::from(a) * i64::from(b)).sum();
                        (dot, s_k)
                    } else {
                        (0, 0.0)
                    };
                    expected[r * width + i] = (dot as f32 * s_k) * s_q;
                }
            }
            // Each row's max over its first `max_keys` scores, folded into maxes that held
            // something before, as the softmax's own fold takes them.
            let max_keys = (seed >> 40) as usize % (width + 1);
            let before: Vec<f32> = (0..rows)
                .map(|r| if r % 3 == 0 { f32::NEG_INFINITY } else { r as f32 * 0.25 - 1.0 })
                .collect();
            let mut want = before.clone();
            crate::kernels::bf16::fold_row_maxes(&expected, width, max_keys, &mut want);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for products in Products::all() {
                let mut out = vec![f32::NAN; rows * width];
                products.scores((&qp, &sq), rows, d, (&kt, &sk), (g_lo, groups), &mut out, None);
                prop_assert_eq!(bits(&out), bits(&expected), "{:?}", products);
                let (mut out, mut max) = (vec![f32::NAN; rows * width], before.clone());
                let row_max = Some((&mut max[..], max_keys));
                products.scores((&qp, &sq), rows, d, (&kt, &sk), (g_lo, groups), &mut out, row_max);
                prop_assert_eq!(bits(&out), bits(&expected), "{:?} with maxes", products);
                prop_assert_eq!(bits(&max), bits(&want), "{:?}: maxes of {} keys", products, max_keys);
            }
        }

        /// The weighted sums from the portable loops and from every tile this CPU runs,
        /// equal to the exact sums computed here in i64, on weights up to the largest
        /// (where the i32 chunks are fullest) and past one chunk of pairs.
        #[test]
        fn weighted_sums_are_exact_on_every_variant(
            rows in 1usize..=9,
            keys in 1usize..=300,
            pair_lo in 0usize..3,
            d in prop_oneof![Just(64usize), Just(16usize), Just(24usize)],
            full in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let len = 2 * pair_lo + keys;
            let mut v = values(seed, len * d, 4);
            if full {
                // Every value at ±L after quantization, and every weight L below.
                v.iter_mut().for_each(|x| *x = if *x < 0.0 { -1.0 } else { 1.0 });
            }
            let (mut vp, mut scales) = (Aligned::default(), Vec::new());
            pack_values(&v, d, len, d, &mut vp, &mut scales);
            let pairs = keys.div_ceil(2);
            let p_row = (2 * pairs).next_multiple_of(LANES) + 2;
            let mut state = seed | 1;
            let p: Vec<u16> = (0..rows * p_row)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    if full { LEVELS as u16 } else { (state % (LEVELS as u64 + 1)) as u16 }
                })
                .collect();
            let mut expected = vec![0i64; rows * d];
            for r in 0..rows {
                for c in 0..d {
                    expected[r * d + c] = (0..2 * pairs)
                        .map(|j| {
                            let (v0, v1) = unpair(vp[(pair_lo + j / 2) * d + c]);
                            let x = if j % 2 == 0 { v0 } else { v1 };
                            i64::from(p[r * p_row + j]) * i64::from(x)
                        })
                        .sum();
                }
            }
            for products in Products::all() {
                let mut out = vec![i64::MIN; rows * d];
                products.weighted_sum(&p, rows, p_row, &vp, (pair_lo, pairs), d, &mut out);
                prop_assert_eq!(&out, &expected, "{:?}", products);
            }
        }
    }
}
