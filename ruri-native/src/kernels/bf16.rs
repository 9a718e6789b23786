//! The arithmetic of [`AttentionPrecision::Bf16`](crate::AttentionPrecision::Bf16):
//! attention's two products on bfloat16 inputs with f32 sums, defined so that AVX-512 BF16's
//! `vdpbf16ps` computes it in one instruction per 32 multiply-adds, and written here in
//! portable Rust with the same bits (CPUs without the instruction or x86's FMA tiles run
//! this; the tiles, `x86_bf16` and `x86_bf16_avx2`, are checked against it). The bits are the
//! same everywhere but in NaNs: a NaN output (from a NaN or infinite input) may carry
//! another sign or payload from one variant to another.
//!
//! The definition, per head of one text:
//!
//! * [`to_bf16`]: q (rotated), k, v and the softmax's weights are rounded to bfloat16, to
//!   nearest even; a subnormal becomes a zero of its sign (as `vcvtne2ps2bf16` treats
//!   denormals), a NaN a quiet NaN.
//! * [`dot_pair`]: `acc` plus a pair of products, the odd element's product first, then the
//!   even one's (the order of the Intel SDM's pseudo-code for `vdpbf16ps`), each product
//!   exact, each sum rounded once to f32 and flushed to a zero of its sign if subnormal.
//! * A score is `dot_pair` folded over the head's channel pairs `(2c, 2c + 1)` in order,
//!   from `+0`. The softmax of a query's own keys ([`softmax`]), normalized at the end as
//!   flash attention does, in powers of two: with `c = scale · log₂e` and `m = max(s) · c`
//!   (the max of the own keys' scores), `e = 2^(s · c − m)` ([`exp2_nonpositive`]), a
//!   total in 16 partial sums of the f32 `e`s (key `j` of the text in partial `j mod 16`,
//!   keys in order; then the partials in order, from `+0`), and the weights `to_bf16(e)`
//!   (0 for the other keys). An output channel is `dot_pair` folded over the text's key
//!   pairs `(2j, 2j + 1)` in order, from `+0`, then times `1 / total` (one rounding each).
//!
//! Zero terms change no sum (an exact zero product added to a sum that is never subnormal),
//! so a block of queries may run over the union of their windows, and the value of a text's
//! vector does not depend on which other texts share its call. Nothing here fuses a multiply
//! and an add, so every compiled copy ([`multiversion`]) gives the same bits.
//! `tools/testdata/int8_reference.py --attention bf16` writes the same definition in NumPy.

use super::aligned::Aligned;
use super::simd_f32::multiversion;

/// Keys per group of the packed keys (one AVX-512 vector of f32 scores).
pub(crate) const LANES: usize = 16;

/// Whether the buffers hold what [`Products::scores`] reads and writes: `q` (lengths, in
/// values) `rows` rows of `d / 2` pairs, `kt` the groups `g_lo..g_lo + groups`, `out` `rows`
/// rows of `groups · 16` scores; in checked arithmetic (the tiles' `unsafe` relies on it).
pub(crate) fn scores_fit(
    (q, kt, out): (usize, usize, usize),
    rows: usize,
    d: usize,
    g_lo: usize,
    groups: usize,
) -> bool {
    let group = (d / 2).checked_mul(LANES);
    d.is_multiple_of(2)
        && rows.checked_mul(d / 2).is_some_and(|n| n <= q)
        && g_lo
            .checked_add(groups)
            .zip(group)
            .and_then(|(g, size)| g.checked_mul(size))
            .is_some_and(|n| n <= kt)
        && rows
            .checked_mul(groups)
            .and_then(|n| n.checked_mul(LANES))
            .is_some_and(|n| n <= out)
}

/// Whether the buffers hold what [`Products::weighted_sum`] reads and writes: `p` (lengths,
/// in values) `rows` rows of weights `p_row` apart (even) holding `2 · pairs` each, `v`
/// `pairs` rows of `d`, `out` `rows` rows of `d` at `out_stride`; in checked arithmetic
/// (the tiles' `unsafe` relies on it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn weighted_sum_fits(
    (p, v, out): (usize, usize, usize),
    rows: usize,
    p_row: usize,
    pairs: usize,
    d: usize,
    out_stride: usize,
) -> bool {
    p_row.is_multiple_of(2)
        && (rows == 0
            || pairs == 0
            || (rows - 1)
                .checked_mul(p_row)
                .zip(pairs.checked_mul(2))
                .and_then(|(start, n)| start.checked_add(n))
                .is_some_and(|end| end <= p))
        && pairs.checked_mul(d).is_some_and(|n| n <= v)
        && super::simd_f32::holds_rows(out, rows, out_stride, d)
}

/// The bfloat16 nearest to `x` (ties to even), as the top half of its f32 bits, in the low
/// 16 bits of the result: a subnormal gives a zero of its sign, a NaN a quiet NaN, and
/// values beyond bfloat16's largest round to infinity.
#[inline(always)]
pub(crate) fn to_bf16(x: f32) -> u32 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let quiet_nan = (b >> 16) | 0x0040;
    let zero = (b >> 16) & 0x8000;
    // Selects, not branches: the loops that call this vectorize.
    let finite = if b & 0x7fff_ffff > 0x7f80_0000 {
        quiet_nan
    } else {
        rounded
    };
    if b & 0x7f80_0000 == 0 { zero } else { finite }
}

/// Two values as one packed pair: `lo` in the low half (the even element), `hi` in the high.
#[inline(always)]
pub(crate) fn pair(lo: f32, hi: f32) -> u32 {
    to_bf16(lo) | (to_bf16(hi) << 16)
}

/// The even (low) and odd (high) bfloat16 of a packed pair, as f32.
#[inline(always)]
pub(crate) fn unpair(x: u32) -> (f32, f32) {
    (f32::from_bits(x << 16), f32::from_bits(x & 0xffff_0000))
}

/// A subnormal `x` as a zero of its sign; anything else as it is.
#[inline(always)]
fn flush(x: f32) -> f32 {
    if x.abs() < f32::MIN_POSITIVE {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// `acc` plus the products of two packed pairs, odd element first: each product is exact
/// (two 8-bit significands: exact in f64, whatever their exponents) and each sum one
/// rounding to f32, flushed when subnormal. The sum is formed in f64, where it is exact
/// unless the product lies far below the sum's last f32 bit, too far for the f64 rounding
/// to move the f32 one (f64 has more than twice f32's significand plus two bits). What one
/// lane of `vdpbf16ps` does (`x86_bf16` checks that at run time; the NumPy reference rounds
/// each sum once by another route, round-to-odd, and agrees bit for bit).
#[inline(always)]
pub(crate) fn dot_pair(acc: f32, a: u32, b: u32) -> f32 {
    let (a_even, a_odd) = unpair(a);
    let (b_even, b_odd) = unpair(b);
    let t = flush((f64::from(acc) + f64::from(a_odd) * f64::from(b_odd)) as f32);
    flush((f64::from(t) + f64::from(a_even) * f64::from(b_even)) as f32)
}

multiversion! {
    /// Queries packed: `out[r · d/2 + c] = pair(q[r][2c], q[r][2c + 1])` for `rows` rows of
    /// `d` (even) at a stride of `stride`.
    fn pack_queries / pack_rows_body(q: &[f32], stride: usize, rows: usize, d: usize, out: &mut [u32])
}

#[inline(always)]
fn pack_rows_body(x: &[f32], stride: usize, rows: usize, d: usize, out: &mut [u32]) {
    let half = d / 2;
    assert!(d.is_multiple_of(2) && super::simd_f32::holds_rows(x.len(), rows, stride, d));
    for (r, o) in out[..rows * half].chunks_exact_mut(half).enumerate() {
        super::int13::prefetch_ahead(x, r, stride, d);
        let row = &x[r * stride..r * stride + d];
        for (o, two) in o.iter_mut().zip(row.as_chunks::<2>().0) {
            *o = pair(two[0], two[1]);
        }
    }
}

multiversion! {
    /// Keys packed group by group, as [`Products::scores`] reads them:
    /// `out[(g · d/2 + c) · 16 + i] = pair(k[16g + i][2c], k[16g + i][2c + 1])` for the
    /// `len` rows of `k` (row `j` is `d` values at `j · stride`, `d` even), 0 past the last
    /// key; `out` is resized to `⌈len / 16⌉ · d/2 · 16`.
    fn pack_keys / pack_keys_body(k: &[f32], stride: usize, len: usize, d: usize, out: &mut Aligned<u32>)
}

multiversion! {
    /// Values packed by pairs of keys, as [`Products::weighted_sum`] reads them:
    /// `out[p · d + c] = pair(v[2p][c], v[2p + 1][c])`, with a zero for the key past the
    /// last of an odd `len`; `out` is resized to `⌈len / 2⌉ · d`.
    fn pack_values / pack_values_body(v: &[f32], stride: usize, len: usize, d: usize, out: &mut Aligned<u32>)
}

multiversion! {
    /// Each of a block's rows (`s`: `own.len()` rows of `width` scores, `width` a multiple
    /// of 16, the row's first key a multiple of 16 in the text) softmaxed over its own keys
    /// `own[r].0..own[r].1` as the module's definition says, unnormalized: `p` gets the
    /// bfloat16 weights (`own.len()` rows of `width`, 0 outside the own keys) and
    /// `inv[r]` the row's `1 / total`. `maxes`: each row's max score over its own keys, if
    /// already known ([`Products::scores`] folds it while it computes them).
    fn softmax / softmax_body(products: Products, s: &[f32], width: usize, own: &[(usize, usize)], scale: f32, maxes: Option<&[f32]>, p: &mut [u16], inv: &mut [f32])
}

multiversion! {
    /// [`softmax`] with [`AttentionPrecision::Int13`](crate::AttentionPrecision::Int13)'s
    /// weights: each `e` as the integer `rint(4095 · e)` (0..=4,095) instead of its
    /// bfloat16; the exps, the totals and `inv` are [`softmax`]'s bits.
    fn softmax_int13 / softmax_int13_body(products: super::int13::Products, s: &[f32], width: usize, own: &[(usize, usize)], scale: f32, maxes: Option<&[f32]>, p: &mut [u16], inv: &mut [f32])
}

/// [`exp2_nonpositive`]'s polynomial `1 + f·(B1 + f·(B2 + f·(B3 + f·B4)))`: B1..B4.
pub(crate) const EXP2_COEFFICIENTS: [f32; 4] =
    [0.693_124_2, 0.240_240_99, 0.055_906_43, 0.009_582_851];

/// 1.5 · 2²³ (see [`crate::math::ROUND_MAGIC`]).
const ROUND_MAGIC: f32 = crate::math::ROUND_MAGIC;

/// 2ʸ for the softmax's `y = s · c − m ≤ 0`, to bfloat16's needs, from IEEE operations only
/// (no fused multiply-add): `y` raised to −125.5 if below (a NaN stays), `n = rint(y)` (by
/// the 1.5 · 2²³ addition, ties to even), `f = y − n` (exact, |f| ≤ ½), `2^f` by a
/// polynomial of degree 4 in Horner's steps (relative error below 3e-6 in f32, against
/// bfloat16's 2⁻⁹; this project's fit: iteratively reweighted least squares towards the
/// minimax relative error on Chebyshev points of [−½, ½], `p(0) = 1`, coefficients rounded to
/// f32), times 2ⁿ from the exponent bits: `n` ≥ −126, and −126 only with `f = ½`, so the
/// result is a normal f32 in [2⁻¹²⁶, 1].
#[inline(always)]
#[allow(non_snake_case)]
pub(crate) fn exp2_nonpositive(y: f32) -> f32 {
    let [B1, B2, B3, B4] = EXP2_COEFFICIENTS;
    let y = if -125.5 > y { -125.5 } else { y };
    let shifted = y + ROUND_MAGIC;
    let n = shifted - ROUND_MAGIC;
    let f = y - n;
    let p = 1.0 + f * (B1 + f * (B2 + f * (B3 + f * B4)));
    let n = (shifted.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    p * f32::from_bits((n.wrapping_add(127) as u32) << 23)
}

/// Where a block's two products run: the same bits either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Products {
    /// This module's loops: every CPU.
    Portable,
    /// `x86_bf16`'s `vdpbf16ps` tiles.
    #[cfg(target_arch = "x86_64")]
    Avx512Bf16,
    /// `x86_bf16`'s FMA tiles (AVX-512F) on calls whose operands let FMA give these bits
    /// (the smallest exponents of the two sides of a product add up to at least
    /// [`FMA_MIN_EXPONENTS`]; the keys' and values' are found once a head,
    /// [`Products::head`]); other calls run [`Products::Avx512Bf16`] where this CPU has it,
    /// else the portable loops.
    #[cfg(target_arch = "x86_64")]
    Avx512Fma,
    /// `x86_bf16_avx2`'s FMA tiles (AVX2 and FMA), under the same bound as
    /// [`Products::Avx512Fma`]; other calls run the portable loops.
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
}

impl Products {
    /// Whether these tiles widen a call's keys and values to f32 before its products (the
    /// AVX-512 FMA tiles: more rows a call share that work).
    pub(crate) fn widens(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self == Products::Avx512Fma {
            return true;
        }
        false
    }

    /// The fastest tiles this CPU has that agree with the portable code: `vdpbf16ps` where
    /// it runs at full rate, FMA where `vdpbf16ps` is slower than FMA (Intel's cores: half
    /// FMA's multiply-adds a cycle on the Xeons measured, BENCHMARKS.md seventeenth step) or
    /// missing (AVX-512 CPUs before Cooper Lake), else the portable loops.
    pub(crate) fn detect() -> Self {
        // Once: the checks run the tiles, and CPUID (the vendor) is slow in a virtual
        // machine (it traps to the hypervisor), and every layer asks.
        static DETECTED: std::sync::OnceLock<Products> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(Self::detect_once)
    }

    fn detect_once() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let fma = super::x86_bf16::fma_available();
            if super::x86_bf16::available() && !(fma && super::x86_bf16::intel()) {
                return Products::Avx512Bf16;
            }
            if fma {
                return Products::Avx512Fma;
            }
            if super::x86_bf16_avx2::available() {
                return Products::Avx2Fma;
            }
        }
        Products::Portable
    }

    /// The variant's name in benchmarks.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Products::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Products::Avx512Bf16 => "vdpbf16ps",
            #[cfg(target_arch = "x86_64")]
            Products::Avx512Fma => "fma",
            #[cfg(target_arch = "x86_64")]
            Products::Avx2Fma => "avx2_fma",
        }
    }

    /// Every variant this CPU runs, the portable loops first (for tests and benchmarks
    /// that compare them).
    pub(crate) fn all() -> Vec<Self> {
        #[allow(unused_mut)] // tiles only on x86-64
        let mut all = vec![Products::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if super::x86_bf16::available() {
                all.push(Products::Avx512Bf16);
            }
            if super::x86_bf16::fma_available() {
                all.push(Products::Avx512Fma);
            }
            if super::x86_bf16_avx2::available() {
                all.push(Products::Avx2Fma);
            }
        }
        all
    }

    /// A head's keys and values as these products read them: `kt` and `v` as [`pack_keys`]
    /// and [`pack_values`] gave them for a text of `len` positions, and for the FMA tiles
    /// their smallest exponents, found once a head rather than in every call (and not at all
    /// where no call of the text has the keys the tiles need).
    pub(crate) fn head<'a>(self, kt: &'a [u32], v: &'a [u32], len: usize) -> HeadOperands<'a> {
        #[cfg(not(target_arch = "x86_64"))]
        let _ = len;
        HeadOperands {
            kt,
            v,
            #[cfg(target_arch = "x86_64")]
            fma: (matches!(self, Products::Avx512Fma | Products::Avx2Fma)
                && len.div_ceil(LANES) * LANES >= self.fma_parts().3)
                .then(|| (min_exponent(kt), min_exponent(v))),
        }
    }

    /// An FMA variant's tiles, the products that run the calls they decline, and the fewest
    /// keys a call needs: [`FMA_MIN_KEYS`] where those are the `vdpbf16ps` tiles (faster on
    /// short calls), else none. The AVX2 tiles give way to the portable loops.
    #[cfg(target_arch = "x86_64")]
    fn fma_parts(self) -> (FmaScores, FmaSums, Products, usize) {
        let (scores, sums, fallback): (FmaScores, FmaSums, _) = if self == Products::Avx2Fma {
            use super::x86_bf16_avx2::{scores, weighted_sum};
            (scores, weighted_sum, Products::Portable)
        } else {
            use super::x86_bf16::{fma_scores, fma_weighted_sum};
            (fma_scores, fma_weighted_sum, Self::without_fma())
        };
        let floor = if fallback == Products::Avx512Bf16 {
            FMA_MIN_KEYS
        } else {
            0
        };
        (scores, sums, fallback, floor)
    }

    /// Where a call the FMA tiles decline runs.
    #[cfg(target_arch = "x86_64")]
    fn without_fma() -> Self {
        if super::x86_bf16::available() {
            Products::Avx512Bf16
        } else {
            Products::Portable
        }
    }

    /// Whether the softmax runs `x86_bf16`'s tiles.
    #[cfg(target_arch = "x86_64")]
    fn softmax_tiles(self) -> bool {
        match self {
            Products::Portable => false,
            Products::Avx512Bf16 => true,
            Products::Avx512Fma | Products::Avx2Fma => super::x86_bf16::available(),
        }
    }

    /// `out[r][16·g + i]` = the score of query `r` (`q`: rows of `d/2` packed pairs from
    /// [`pack_queries`]) against key `16 · (g_lo + g) + i` of `head`, for `rows` queries and
    /// `groups` groups. With `row_max = Some((max, keys))`, also `max[r]` = the max of row
    /// `r`'s first `keys` scores and `max[r]` as it was (`if x > m`: NaNs left out), which
    /// [`softmax`] can take instead of reading the scores once more.
    #[allow(clippy::too_many_arguments)]
    // `widened` is the x86 FMA tiles' (as `weighted_sum`'s).
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    pub(crate) fn scores(
        self,
        q: &[u32],
        rows: usize,
        d: usize,
        head: &HeadOperands<'_>,
        (g_lo, groups): (usize, usize),
        (out, widened): (&mut [f32], &mut Widened),
        row_max: Option<(&mut [f32], usize)>,
    ) {
        let kt = head.kt;
        match self {
            Products::Portable => {
                scores_portable(q, rows, d, kt, g_lo, groups, out);
                if let Some((max, keys)) = row_max {
                    fold_row_maxes(
                        &out[..rows * groups * LANES],
                        groups * LANES,
                        keys,
                        &mut max[..rows],
                    );
                }
            }
            #[cfg(target_arch = "x86_64")]
            Products::Avx512Bf16 => {
                super::x86_bf16::scores(q, rows, d, kt, g_lo, groups, out, row_max)
            }
            #[cfg(target_arch = "x86_64")]
            Products::Avx512Fma | Products::Avx2Fma => {
                let (tiles, _, fallback, floor) = self.fma_parts();
                let mut row_max = row_max;
                let ran = groups * LANES >= floor
                    && head.fma.is_some_and(|(keys_min, _)| {
                        let again = row_max.as_mut().map(|(max, keys)| (&mut **max, *keys));
                        let keys = (kt, keys_min);
                        tiles(q, rows, d, keys, g_lo, groups, (out, widened), again)
                    });
                if !ran {
                    let out = (out, widened);
                    fallback.scores(q, rows, d, head, (g_lo, groups), out, row_max);
                }
            }
        }
    }

    /// `out[r][c]` (row `r` at `r · out_stride`, `d` channels) = [`dot_pair`] folded from
    /// `+0` over the `pairs` key pairs of `p`'s row `r` (bfloat16 weights, a key each, rows
    /// `p_row` apart: even) against `head`'s values, pairs `pair_lo..pair_lo + pairs`.
    /// Written, not added to. The tiles take `d` a multiple of 16; other widths run the
    /// portable loops.
    #[allow(clippy::too_many_arguments)]
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    pub(crate) fn weighted_sum(
        self,
        p: &[u16],
        rows: usize,
        p_row: usize,
        head: &HeadOperands<'_>,
        (pair_lo, pairs): (usize, usize),
        d: usize,
        (out, out_stride): (&mut [f32], usize),
        widened: &mut Widened,
    ) {
        let v = &head.v[pair_lo * d..];
        match self {
            #[cfg(target_arch = "x86_64")]
            Products::Avx512Bf16 if d.is_multiple_of(LANES) => {
                super::x86_bf16::weighted_sum(p, rows, p_row, v, pairs, d, out, out_stride)
            }
            #[cfg(target_arch = "x86_64")]
            Products::Avx512Fma | Products::Avx2Fma => {
                let (_, tiles, fallback, floor) = self.fma_parts();
                let ran = 2 * pairs >= floor
                    && head.fma.is_some_and(|(_, values_min)| {
                        let values = (v, values_min);
                        tiles(p, rows, p_row, values, pairs, d, (out, out_stride), widened)
                    });
                if !ran {
                    let (range, out) = ((pair_lo, pairs), (out, out_stride));
                    fallback.weighted_sum(p, rows, p_row, head, range, d, out, widened);
                }
            }
            _ => weighted_sum_portable(p, rows, p_row, v, pairs, d, out, out_stride),
        }
    }
}

/// What the FMA tiles widen to f32 in a call, kept from call to call so that no call
/// allocates: the queries, and a block of keys or a chunk of values in cache lines (a load
/// that splits a line halves the tiles' speed).
#[derive(Debug, Default)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct Widened {
    pub(crate) queries: Vec<f32>,
    pub(crate) lines: Aligned<f32>,
}

impl Widened {
    /// The queries of `q` (packed pairs) widened, each pair's odd element first (the order
    /// of the sums), and `lines` lines of 16 values from a cache line (their old contents:
    /// the tiles write them before they read them).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn take(&mut self, q: &[u32], lines: usize) -> (&[f32], &mut [f32]) {
        self.queries.clear();
        self.queries.extend(q.iter().flat_map(|&x| {
            let (even, odd) = unpair(x);
            [odd, even]
        }));
        if self.lines.len() < lines * LANES {
            self.lines.resize(lines * LANES, 0.0);
        }
        (&self.queries, &mut self.lines[..lines * LANES])
    }
}

/// A head's keys and values as [`Products`] read them ([`Products::head`]).
pub(crate) struct HeadOperands<'a> {
    /// Keys packed by [`pack_keys`].
    kt: &'a [u32],
    /// Values packed by [`pack_values`].
    v: &'a [u32],
    /// For the FMA tiles: the smallest exponents ([`min_exponent`]) of the keys and of the
    /// values.
    #[cfg(target_arch = "x86_64")]
    fma: Option<(u32, u32)>,
}

/// The least sum of the smallest biased exponents of a product's two sides (bfloat16s) for
/// which sums in one rounding each need no flushing: unbiased, ea + eb ≥ −112, so that every
/// product's lowest bit is at least 2⁻¹²⁶, every sum a multiple of it, and a nonzero one
/// never subnormal. [`f32_is_exact`] and x86's FMA tiles (the proof is in `x86_bf16`) take
/// it.
pub(crate) const FMA_MIN_EXPONENTS: u32 = 2 * 127 - 112;

/// `n` packed pairs of random bfloat16s (a xorshift of `state`, which must not be 0): random
/// signs and mantissas, biased exponents in `lo..lo + span` (the tiles' checks and tests).
#[cfg(target_arch = "x86_64")]
pub(crate) fn random_pairs(state: &mut u64, n: usize, lo: u32, span: u32) -> Vec<u32> {
    let mut half = || {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        let exp = lo + (*state % u64::from(span)) as u32;
        (((*state >> 8) & 1) as u32) << 15 | exp << 7 | ((*state >> 16) & 0x7f) as u32
    };
    (0..n).map(|_| half() | (half() << 16)).collect()
}

/// x86's FMA score tiles (`x86_bf16::fma_scores`, `x86_bf16_avx2::scores`): the arguments
/// of [`Products::scores`] with the keys' smallest exponent beside them; `true` if they ran.
#[cfg(target_arch = "x86_64")]
pub(crate) type FmaScores = for<'a> fn(
    &[u32],
    usize,
    usize,
    (&[u32], u32),
    usize,
    usize,
    (&mut [f32], &mut Widened),
    Option<(&'a mut [f32], usize)>,
) -> bool;

/// x86's FMA weighted-sum tiles (`x86_bf16::fma_weighted_sum`, `x86_bf16_avx2::weighted_sum`):
/// the arguments of [`Products::weighted_sum`] with the values' smallest exponent beside
/// them; `true` if they ran.
#[cfg(target_arch = "x86_64")]
pub(crate) type FmaSums = fn(
    &[u16],
    usize,
    usize,
    (&[u32], u32),
    usize,
    usize,
    (&mut [f32], usize),
    &mut Widened,
) -> bool;

/// `tiles` on packed keys (groups from 0), their smallest exponent found here, a scratch of
/// its own, no row maxes (the tiles' checks and tests).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn fma_scores_on(
    tiles: FmaScores,
    q: &[u32],
    rows: usize,
    d: usize,
    kt: &[u32],
    (g_lo, groups): (usize, usize),
    out: &mut [f32],
) -> bool {
    let keys = (kt, min_exponent(kt));
    tiles(
        q,
        rows,
        d,
        keys,
        g_lo,
        groups,
        (out, &mut Widened::default()),
        None,
    )
}

/// `tiles` on packed values (from pair 0), their smallest exponent found here, a scratch of
/// its own (the tiles' checks and tests).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn fma_sums_on(
    tiles: FmaSums,
    p: &[u16],
    rows: usize,
    p_row: usize,
    v: &[u32],
    (pairs, d): (usize, usize),
    out: (&mut [f32], usize),
) -> bool {
    let values = (v, min_exponent(v));
    tiles(
        p,
        rows,
        p_row,
        values,
        pairs,
        d,
        out,
        &mut Widened::default(),
    )
}

/// The check that x86's FMA tiles pass once per process before they are used: on operands
/// in the normal range (5 queries, 5 groups of keys, 80 key pairs of values, d = 64) they
/// must run and give the portable loops' bits; near underflow they must decline. `scores`
/// and `weighted_sum` are the tiles with the keys' and values' smallest exponents found from
/// the operands they are given (arguments as [`Products::scores`]' and
/// [`Products::weighted_sum`]'s, no row maxes, values from pair 0); `true` if they ran.
#[cfg(target_arch = "x86_64")]
pub(crate) fn fma_tiles_agree(scores: FmaScores, weighted_sum: FmaSums) -> bool {
    let (rows, d, groups) = (5, 64, 5);
    let len = groups * LANES;
    for (lo, span, clean) in [(115u32, 25u32, true), (1, 100, false)] {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64 ^ u64::from(lo);
        let mut pairs = |n: usize| random_pairs(&mut seed, n, lo, span);
        let (q, kt, v) = (
            pairs(rows * d / 2),
            pairs(groups * d / 2 * LANES),
            pairs(len / 2 * d),
        );
        let p: Vec<u16> = pairs(rows * len / 2)
            .into_iter()
            .flat_map(|x| [x as u16, (x >> 16) as u16])
            .collect();
        let (mut tiles, mut portable) = (vec![0.0; rows * len], vec![0.0; rows * len]);
        let ran = fma_scores_on(scores, &q, rows, d, &kt, (0, groups), &mut tiles);
        scores_portable(&q, rows, d, &kt, 0, groups, &mut portable);
        let (mut w_tiles, mut w_portable) = (vec![0.0; rows * d], vec![0.0; rows * d]);
        let out = (&mut w_tiles[..], d);
        let w_ran = fma_sums_on(weighted_sum, &p, rows, len, &v, (len / 2, d), out);
        weighted_sum_portable(&p, rows, len, &v, len / 2, d, &mut w_portable, d);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let agree = bits(&tiles) == bits(&portable) && bits(&w_tiles) == bits(&w_portable);
        if (ran, w_ran) != (clean, clean) || (clean && !agree) {
            return false;
        }
    }
    true
}

/// What x86's FMA weighted sums do before their tiles (arguments as
/// [`Products::weighted_sum`]'s, but the values: `values_min`, their [`min_exponent`] or a
/// smaller one): `None` to decline, with nothing written (`d` not a multiple of 16, or the weights'
/// and values' smallest exponents too small together); `Some(false)` when nothing is left to
/// do (no rows; no pairs: the outputs written as zeros); `Some(true)` to run the tiles
/// (safe code: a buffer too short panics; the tiles' callers check the sizes for their
/// `unsafe`).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn fma_weighted_sum_start(
    p: &[u16],
    rows: usize,
    p_row: usize,
    values_min: u32,
    pairs: usize,
    d: usize,
    out: &mut [f32],
    out_stride: usize,
) -> Option<bool> {
    if !d.is_multiple_of(LANES) {
        return None;
    }
    let weights = (0..rows)
        .map(|r| min_exponent_halves(&p[r * p_row..r * p_row + 2 * pairs]))
        .min()
        .unwrap_or(255);
    if weights + values_min < FMA_MIN_EXPONENTS {
        return None;
    }
    if rows == 0 || d == 0 {
        return Some(false);
    }
    if pairs == 0 {
        for r in 0..rows {
            out[r * out_stride..r * out_stride + d].fill(0.0);
        }
        return Some(false);
    }
    Some(true)
}

/// The fewest keys of a call for which [`Products::Avx512Fma`] runs its FMA tiles where the
/// `vdpbf16ps` tiles are there too: on fewer, the FMA tiles' widening of the operands costs
/// more than their faster products save (on the Intel Xeon measured, one 23-token text's
/// attention took 19.4 µs with them and 16.0 µs with `vdpbf16ps`; a 324-token text's 16.3
/// and 16.8 ms; BENCHMARKS.md, seventeenth step).
#[cfg(target_arch = "x86_64")]
const FMA_MIN_KEYS: usize = 128;

multiversion! {
    /// The smallest biased exponent among the nonzero bfloat16s of `x` (both halves of each
    /// packed pair): 0 if one is subnormal, 255 if all are zeros (infinities and NaNs count
    /// as 255).
    #[cfg(target_arch = "x86_64")]
    fn min_exponent / min_exponent_body(x: &[u32]) -> u32
}

multiversion! {
    /// [`min_exponent`] for bfloat16s one an item (the softmax's weights).
    #[cfg(target_arch = "x86_64")]
    fn min_exponent_halves / min_exponent_halves_body(x: &[u16]) -> u32
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn min_exponent_body(x: &[u32]) -> u32 {
    x.iter()
        .map(|&w| exponent(w).min(exponent(w >> 16)))
        .fold(255, u32::min)
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn min_exponent_halves_body(x: &[u16]) -> u32 {
    x.iter().fold(255, |m, &w| m.min(exponent(u32::from(w))))
}

/// The biased exponent of the bfloat16 in the low 16 bits of `h`, 255 for a zero (branch
/// free: the scans vectorize).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn exponent(h: u32) -> u32 {
    // A zero's exponent bits are 0: or-ed with 255.
    ((h >> 7) & 0xff) | (u32::from(h & 0x7fff == 0) * 0xff)
}

multiversion! {
    /// `max[r]` = the max of `max[r]` and row `r`'s first `keys` scores (`s`: rows of
    /// `width`), as the tiles fold it: key `j` into lane `j mod 16` (`if x > m`: NaNs left
    /// out), in order, then the lanes in order.
    fn fold_row_maxes / fold_row_maxes_body(s: &[f32], width: usize, keys: usize, max: &mut [f32])
}

#[inline(always)]
fn fold_row_maxes_body(s: &[f32], width: usize, keys: usize, max: &mut [f32]) {
    let keep = |m: f32, x: f32| if x > m { x } else { m };
    for (m, row) in max.iter_mut().zip(s.chunks_exact(width.max(1))) {
        let (blocks, tail) = row[..keys.min(width)].as_chunks::<LANES>();
        let mut lanes = [f32::NEG_INFINITY; LANES];
        for block in blocks {
            for (l, &x) in lanes.iter_mut().zip(block) {
                *l = keep(*l, x);
            }
        }
        for (l, &x) in lanes.iter_mut().zip(tail) {
            *l = keep(*l, x);
        }
        *m = lanes.iter().fold(*m, |m, &l| keep(m, l));
    }
}

#[cfg(target_arch = "x86_64")]
multiversion! {
    /// The softmax's blocks of own keys in this module's loops (what `x86_bf16`'s are
    /// checked against).
    fn softmax_blocks_portable / softmax_blocks_bf16_body(blocks: &[[f32; LANES]], weights: &mut [[u16; LANES]], cm: (f32, f32), partial: &mut [f32; LANES])
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn softmax_blocks_bf16_body(
    blocks: &[[f32; LANES]],
    weights: &mut [[u16; LANES]],
    cm: (f32, f32),
    partial: &mut [f32; LANES],
) {
    softmax_blocks_body::<false>(blocks, weights, cm, partial)
}

multiversion! {
    /// [`Products::scores`] in this module's loops.
    fn scores_portable / scores_body(q: &[u32], rows: usize, d: usize, kt: &[u32], g_lo: usize, groups: usize, out: &mut [f32])
}

multiversion! {
    /// [`Products::weighted_sum`] in this module's loops.
    fn weighted_sum_portable / weighted_sum_body(p: &[u16], rows: usize, p_row: usize, v: &[u32], pairs: usize, d: usize, out: &mut [f32], out_stride: usize)
}

#[inline(always)]
fn pack_keys_body(k: &[f32], stride: usize, len: usize, d: usize, out: &mut Aligned<u32>) {
    assert!(d.is_multiple_of(2) && super::simd_f32::holds_rows(k.len(), len, stride, d));
    let half = d / 2;
    let groups = len.div_ceil(LANES);
    out.clear();
    out.resize(groups * half * LANES, 0);
    // A group's keys packed row by row (contiguous: the conversions vectorize), then
    // transposed into the group.
    let mut rows = vec![0u32; LANES * half];
    for (g, group) in out.chunks_exact_mut((half * LANES).max(1)).enumerate() {
        let keys = (len - g * LANES).min(LANES);
        pack_rows_body(&k[g * LANES * stride..], stride, keys, d, &mut rows);
        for (c, lanes) in group.chunks_exact_mut(LANES).enumerate() {
            for (i, lane) in lanes[..keys].iter_mut().enumerate() {
                *lane = rows[i * half + c];
            }
        }
    }
}

#[inline(always)]
fn pack_values_body(v: &[f32], stride: usize, len: usize, d: usize, out: &mut Aligned<u32>) {
    assert!(super::simd_f32::holds_rows(v.len(), len, stride, d));
    out.clear();
    out.resize(len.div_ceil(2) * d, 0);
    for (p, o) in out.chunks_exact_mut(d.max(1)).enumerate() {
        super::int13::prefetch_ahead(v, 2 * p, stride, d);
        super::int13::prefetch_ahead(v, 2 * p + 1, stride, d);
        let even = &v[2 * p * stride..2 * p * stride + d];
        if 2 * p + 1 < len {
            let odd = &v[(2 * p + 1) * stride..(2 * p + 1) * stride + d];
            for ((o, &lo), &hi) in o.iter_mut().zip(even).zip(odd) {
                *o = pair(lo, hi);
            }
        } else {
            for (o, &lo) in o.iter_mut().zip(even) {
                *o = pair(lo, 0.0);
            }
        }
    }
}

#[inline(always)]
fn scores_body(
    q: &[u32],
    rows: usize,
    d: usize,
    kt: &[u32],
    g_lo: usize,
    groups: usize,
    out: &mut [f32],
) {
    let half = d / 2;
    assert!(scores_fit(
        (q.len(), kt.len(), out.len()),
        rows,
        d,
        g_lo,
        groups
    ));
    let (q, kt) = (
        &q[..rows * half],
        &kt[g_lo * half * LANES..(g_lo + groups) * half * LANES],
    );
    if f32_is_exact(exponents(q), exponents(kt), d) {
        score_loops::<true>(q, rows, half, kt, groups, out)
    } else {
        score_loops::<false>(q, rows, half, kt, groups, out)
    }
}

/// [`scores_body`]'s loops, with [`dot_pair`] or (`FAST`, where [`f32_is_exact`] says it
/// gives the same bits) [`dot_pair_f32`]; `kt` from the first group read. Four groups at a
/// time: four independent sums in registers (one sum's chain of adds left most of each
/// add's latency exposed).
#[inline(always)]
fn score_loops<const FAST: bool>(
    q: &[u32],
    rows: usize,
    half: usize,
    kt: &[u32],
    groups: usize,
    out: &mut [f32],
) {
    let width = groups * LANES;
    let dot = |acc: f32, a: u32, b: u32| {
        if FAST {
            dot_pair_f32(acc, a, b)
        } else {
            dot_pair(acc, a, b)
        }
    };
    let group = |g: usize| &kt[g * half * LANES..(g + 1) * half * LANES];
    for r in 0..rows {
        let qr = &q[r * half..(r + 1) * half];
        let row = &mut out[r * width..(r + 1) * width];
        let mut g = 0;
        while g + 4 <= groups {
            let mut acc = [[0.0f32; LANES]; 4];
            let four = [group(g), group(g + 1), group(g + 2), group(g + 3)];
            for (c, &qc) in qr.iter().enumerate() {
                for (acc, keys) in acc.iter_mut().zip(&four) {
                    let keys: &[u32; LANES] = keys[c * LANES..(c + 1) * LANES]
                        .try_into()
                        .expect("a group's lanes");
                    for (a, &k) in acc.iter_mut().zip(keys) {
                        *a = dot(*a, qc, k);
                    }
                }
            }
            for (n, acc) in acc.iter().enumerate() {
                row[(g + n) * LANES..(g + n + 1) * LANES].copy_from_slice(acc);
            }
            g += 4;
        }
        for g in g..groups {
            let mut acc = [0.0f32; LANES];
            for (&qc, keys) in qr.iter().zip(group(g).chunks_exact(LANES)) {
                for (a, &k) in acc.iter_mut().zip(keys) {
                    *a = dot(*a, qc, k);
                }
            }
            row[g * LANES..(g + 1) * LANES].copy_from_slice(&acc);
        }
    }
}

/// [`dot_pair`] in f32 operations: the same bits where every product is exact in f32 and no
/// sum is subnormal or overflows ([`f32_is_exact`] says when), and several times faster
/// than its f64 steps in the portable loops.
#[inline(always)]
fn dot_pair_f32(acc: f32, a: u32, b: u32) -> f32 {
    let (a_even, a_odd) = unpair(a);
    let (b_even, b_odd) = unpair(b);
    (acc + a_odd * b_odd) + a_even * b_even
}

/// The smallest and the largest biased exponent of the nonzero bfloat16 in `x` (its two
/// halves each, or the values themselves): `(255, 0)` if there is none.
#[inline(always)]
fn exponents<T: Copy + Into<u32>>(x: &[T]) -> (u32, u32) {
    let halves = if std::mem::size_of::<T>() == 4 { 2 } else { 1 };
    // In lanes (the loop vectorizes), then the lanes.
    let (mut lo, mut hi) = ([255u32; LANES], [0u32; LANES]);
    let (chunks, rest) = x.as_chunks::<LANES>();
    let add = |lo: &mut u32, hi: &mut u32, v: T| {
        let v: u32 = v.into();
        for h in 0..halves {
            let e = (v >> (16 * h + 7)) & 0xff;
            // Exponent 0 is a zero (subnormals were flushed by `to_bf16`).
            *lo = (*lo).min(if e == 0 { 255 } else { e });
            *hi = (*hi).max(e);
        }
    };
    for chunk in chunks {
        for ((lo, hi), &v) in lo.iter_mut().zip(&mut hi).zip(chunk) {
            add(lo, hi, v);
        }
    }
    for ((lo, hi), &v) in lo.iter_mut().zip(&mut hi).zip(rest) {
        add(lo, hi, v);
    }
    (
        lo.iter().copied().min().unwrap_or(255),
        hi.iter().copied().max().unwrap_or(0),
    )
}

/// Whether sums of up to `terms` products of a bfloat16 with biased exponents in `a` and
/// one in `b` are [`dot_pair`]'s bits in plain f32 arithmetic: every product's lowest bit
/// is at least 2⁻¹²⁶ (`a.0 + b.0 − 268 ≥ −126`), so every product is a normal f32, exact,
/// and every sum a multiple of that bit (a nonzero one is never subnormal: no flush
/// changes it); and no sum can reach 2¹²⁸ (`a.1 + b.1 − 252 + ⌈log₂ terms⌉ ≤ 127`). An
/// f32 add then rounds the exact sum once, as `dot_pair` does. An infinity or a NaN
/// (exponent 255) takes `dot_pair`'s steps.
#[inline(always)]
fn f32_is_exact(a: (u32, u32), b: (u32, u32), terms: usize) -> bool {
    let log2_terms = usize::BITS - terms.max(1).saturating_sub(1).leading_zeros();
    a.0 + b.0 >= FMA_MIN_EXPONENTS && a.1 < 255 && b.1 < 255 && a.1 + b.1 + log2_terms <= 379
}

/// [`to_bf16`] of an exp of [`exp2_nonpositive`] (a normal f32 in [2⁻¹²⁶, 1], or 0, or
/// NaN): rounding to nearest even alone, since no subnormal comes in. A NaN may come out as
/// another NaN or an infinity, but it came from a NaN score, which made the row's total,
/// and so every output of the row, NaN already.
#[inline(always)]
fn weight(e: f32) -> u16 {
    let b = e.to_bits();
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// Weights `j` and `j + 1` of `p` as a packed pair.
#[inline(always)]
pub(crate) fn pair_at(p: &[u16], j: usize) -> u32 {
    u32::from(p[j]) | (u32::from(p[j + 1]) << 16)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn weighted_sum_body(
    p: &[u16],
    rows: usize,
    p_row: usize,
    v: &[u32],
    pairs: usize,
    d: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let lengths = (p.len(), v.len(), out.len());
    assert!(weighted_sum_fits(
        lengths, rows, p_row, pairs, d, out_stride
    ));
    let v = &v[..pairs * d];
    let v_range = exponents(v);
    for r in 0..rows {
        let o = &mut out[r * out_stride..r * out_stride + d];
        let pr = &p[r * p_row..r * p_row + 2 * pairs];
        if f32_is_exact(exponents(pr), v_range, 2 * pairs) {
            sum_loops::<true>(pr, v, d, o)
        } else {
            sum_loops::<false>(pr, v, d, o)
        }
    }
}

/// One row of [`weighted_sum_body`], with [`dot_pair`] or (`FAST`) [`dot_pair_f32`]: the
/// channels 64 at a time in registers over all pairs (four independent sums), then 16 at a
/// time, then one at a time.
#[inline(always)]
fn sum_loops<const FAST: bool>(p: &[u16], v: &[u32], d: usize, o: &mut [f32]) {
    let dot = |acc: f32, a: u32, b: u32| {
        if FAST {
            dot_pair_f32(acc, a, b)
        } else {
            dot_pair(acc, a, b)
        }
    };
    let pairs = v.len() / d.max(1);
    let weights = &p[..2 * pairs];
    let mut c0 = 0;
    while c0 + 4 * LANES <= d {
        let mut acc = [0.0f32; 4 * LANES];
        for (two, values) in weights.as_chunks::<2>().0.iter().zip(v.chunks_exact(d)) {
            let pj = u32::from(two[0]) | (u32::from(two[1]) << 16);
            let values: &[u32; 4 * LANES] =
                values[c0..c0 + 4 * LANES].try_into().expect("64 channels");
            for (a, &x) in acc.iter_mut().zip(values) {
                *a = dot(*a, pj, x);
            }
        }
        o[c0..c0 + 4 * LANES].copy_from_slice(&acc);
        c0 += 4 * LANES;
    }
    while c0 + LANES <= d {
        let mut acc = [0.0f32; LANES];
        for (two, values) in weights.as_chunks::<2>().0.iter().zip(v.chunks_exact(d)) {
            let pj = u32::from(two[0]) | (u32::from(two[1]) << 16);
            let values: &[u32; LANES] = values[c0..c0 + LANES].try_into().expect("16 channels");
            for (a, &x) in acc.iter_mut().zip(values) {
                *a = dot(*a, pj, x);
            }
        }
        o[c0..c0 + LANES].copy_from_slice(&acc);
        c0 += LANES;
    }
    for c in c0..d {
        let mut acc = 0.0f32;
        for jp in 0..pairs {
            acc = dot(acc, pair_at(p, 2 * jp), v[jp * d + c]);
        }
        o[c] = acc;
    }
}

/// The max of a row's scores over its own keys: the whole blocks
/// `whole.0..whole.1`, and the lanes `own_lane` marks in the `edges` blocks that `masked`
/// says hold other keys too. `if x > m` (one `vmaxps`), not `f32::max` (which also orders
/// NaNs): a NaN score is left out of the max, and makes its own weight and the total NaN
/// anyway.
#[inline(always)]
fn own_max(
    blocks: &[[f32; LANES]],
    (whole_lo, whole_hi): (usize, usize),
    edges: [Option<usize>; 2],
    own: (usize, usize),
) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    for block in &blocks[whole_lo.min(whole_hi)..whole_hi] {
        for (m, &x) in lanes.iter_mut().zip(block) {
            *m = if x > *m { x } else { *m };
        }
    }
    for b in edges.into_iter().flatten() {
        for ((m, &x), own) in lanes.iter_mut().zip(&blocks[b]).zip(own_lanes(b, own)) {
            *m = if own && x > *m { x } else { *m };
        }
    }
    lanes
        .iter()
        .fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m })
}

/// Which lanes of block `b` are own keys: lane `i` iff `b · LANES + i` is in `lo..hi`.
/// (This and [`softmax_masked_block`] are functions, not closures: a closure is compiled
/// without its caller's target features, and ran a short text's masked blocks on SSE2.)
#[inline(always)]
fn own_lanes(b: usize, (lo, hi): (usize, usize)) -> [bool; LANES] {
    std::array::from_fn(|i| (lo..hi).contains(&(b * LANES + i)))
}

/// A block that holds other keys beside own ones ([`softmax_blocks_body`] with the others'
/// exps 0): lane by lane, `e = 2^(x · c − max)` if own, else 0, added to `partial[i]`, its
/// weight into `w[i]`.
#[inline(always)]
fn softmax_masked_block<const INT13: bool>(
    block: &[f32; LANES],
    own: [bool; LANES],
    (c, max): (f32, f32),
    w: &mut [u16; LANES],
    partial: &mut [f32; LANES],
) {
    for (((w, acc), &x), own) in w.iter_mut().zip(partial.iter_mut()).zip(block).zip(own) {
        let e = exp2_nonpositive(x * c - max);
        let e = if own { e } else { 0.0 };
        *acc += e;
        *w = if INT13 { int13_weight(e) } else { weight(e) };
    }
}

/// [`softmax_masked_block`]; with `INT13` and `tiles`, on `x86_int13`'s AVX-512 tile (the same
/// bits: a short text's one block and a window's edges are masked ones).
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // `tiles`: x86's
fn masked_block<const INT13: bool>(
    tiles: bool,
    block: &[f32; LANES],
    own: [bool; LANES],
    cm: (f32, f32),
    w: &mut [u16; LANES],
    partial: &mut [f32; LANES],
) {
    #[cfg(target_arch = "x86_64")]
    if INT13 && tiles {
        let mut mask = 0u16;
        for (i, &o) in own.iter().enumerate() {
            mask |= u16::from(o) << i;
        }
        return super::x86_int13::softmax_masked_block(block, mask, cm, w, partial);
    }
    softmax_masked_block::<INT13>(block, own, cm, w, partial);
}

/// The softmax's blocks of own keys only: lane `i` of each block in turn, `e =
/// 2^(x · c − max)` added to `partial[i]`, its weight `to_bf16(e)` (`INT13`:
/// [`int13_weight`]).
#[inline(always)]
fn softmax_blocks_body<const INT13: bool>(
    blocks: &[[f32; LANES]],
    weights: &mut [[u16; LANES]],
    (c, max): (f32, f32),
    partial: &mut [f32; LANES],
) {
    for (block, w) in blocks.iter().zip(weights) {
        for ((w, acc), &x) in w.iter_mut().zip(partial.iter_mut()).zip(block) {
            let e = exp2_nonpositive(x * c - max);
            *acc += e;
            *w = if INT13 { int13_weight(e) } else { weight(e) };
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn softmax_body(
    products: Products,
    s: &[f32],
    width: usize,
    own: &[(usize, usize)],
    scale: f32,
    maxes: Option<&[f32]>,
    p: &mut [u16],
    inv: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    let tiles = products.softmax_tiles();
    #[cfg(not(target_arch = "x86_64"))]
    let tiles = {
        let _ = products;
        false
    };
    softmax_rows::<false>(tiles, s, width, own, scale, maxes, p, inv)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn softmax_int13_body(
    products: super::int13::Products,
    s: &[f32],
    width: usize,
    own: &[(usize, usize)],
    scale: f32,
    maxes: Option<&[f32]>,
    p: &mut [u16],
    inv: &mut [f32],
) {
    // `x86_bf16`'s softmax tiles round to bfloat16: int13's AVX-512 tiles run where its
    // AVX-512 products do (`x86_int13::softmax_blocks`).
    #[cfg(target_arch = "x86_64")]
    let tiles = products == super::int13::Products::Avx512Vnni;
    #[cfg(not(target_arch = "x86_64"))]
    let tiles = {
        let _ = products;
        false
    };
    // A text within the window (every row's own keys the first `len`, its max given): the
    // rows in one AVX-512 pass, or one AVX2 pass where the AVX2 products run.
    #[cfg(target_arch = "x86_64")]
    if let (Some(maxes), Some(&(0, len))) = (maxes, own.first())
        && own.iter().all(|&o| o == (0, len))
        && len <= width
    {
        let c = scale * std::f32::consts::LOG2_E;
        let rows = own.len();
        match products {
            super::int13::Products::Avx512Vnni => {
                return super::x86_int13::softmax_whole(s, width, rows, len, (c, maxes), p, inv);
            }
            super::int13::Products::Avx2 => {
                let maxes = (c, maxes);
                return super::x86_int13_avx2::softmax_whole(s, width, rows, len, maxes, p, inv);
            }
            super::int13::Products::Portable => {}
        }
    }
    softmax_rows::<true>(tiles, s, width, own, scale, maxes, p, inv)
}

/// [`AttentionPrecision::Int13`](crate::AttentionPrecision::Int13)'s weight of an exp `e`
/// (in [0, 1], or NaN): `rint(4095 · e)`, ties to even, read from the bits of `4095 · e +
/// 1.5 · 2²³` (an f32 in [2²³, 2²⁴), where the last bit is worth 1, so the addition rounds
/// to an integer and the low bits hold it; a conversion to u16 made the loop scalar). A NaN
/// gives some weight; it came from a NaN score, which made the row's total, and so its
/// every output, NaN.
#[inline(always)]
fn int13_weight(e: f32) -> u16 {
    let shifted = e * super::int13::LEVELS_F32 + ROUND_MAGIC;
    shifted.to_bits().wrapping_sub(ROUND_MAGIC.to_bits()) as u16
}

/// [`softmax_body`] (`INT13`: [`softmax_int13_body`]); `tiles`: the whole blocks on
/// `x86_bf16`'s tiles (`x86_int13`'s with `INT13`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // `tiles`: x86's
fn softmax_rows<const INT13: bool>(
    tiles: bool,
    s: &[f32],
    width: usize,
    own: &[(usize, usize)],
    scale: f32,
    maxes: Option<&[f32]>,
    p: &mut [u16],
    inv: &mut [f32],
) {
    let rows = own.len();
    assert!(width.is_multiple_of(LANES) && s.len() >= rows * width);
    let c = scale * std::f32::consts::LOG2_E;
    assert!(p.len() >= rows * width && inv.len() >= rows);
    assert!(maxes.is_none_or(|m| m.len() >= rows));
    // Each row's partial sums, by lane, for up to 16 rows ([`row_totals`]).
    let mut columns = [[0.0f32; LANES]; LANES];
    for (r, &(lo, hi)) in own.iter().enumerate() {
        assert!(lo <= hi && hi <= width);
        let blocks = s[r * width..(r + 1) * width].as_chunks::<LANES>().0;
        let weights = p[r * width..(r + 1) * width].as_chunks_mut::<LANES>().0;
        // The blocks of LANES that hold own keys (the others' weights are 0): the first and
        // the last may hold others too (their lanes are masked), those between do not (their
        // loops vectorize plainly).
        let (b_lo, b_hi) = (lo / LANES, hi.div_ceil(LANES));
        let (whole_lo, whole_hi) = (lo.div_ceil(LANES), hi / LANES);
        let masked = |b: usize| (b_lo..b_hi).contains(&b) && !(whole_lo..whole_hi).contains(&b);
        let first = masked(b_lo).then_some(b_lo);
        let last = (b_hi > b_lo && b_hi - 1 != b_lo && masked(b_hi - 1)).then(|| b_hi - 1);
        // The max of the scores (a max is exact: its order does not matter), unless given.
        let max = match maxes {
            Some(maxes) => maxes[r],
            None => own_max(blocks, (whole_lo, whole_hi), [first, last], (lo, hi)),
        };
        // max(s) · c is the max of the s · c (rounding is monotone).
        let max = max * c;

        // 2^(s · c − max), the partial sums and the weights, block after block (each lane's sum
        // in key order): the first block if masked, the whole ones, the last if masked.
        let mut partial = [0.0f32; LANES];
        let cm = (c, max);
        if let Some(b) = first {
            let own = own_lanes(b, (lo, hi));
            masked_block::<INT13>(tiles, &blocks[b], own, cm, &mut weights[b], &mut partial);
        }
        match () {
            #[cfg(target_arch = "x86_64")]
            _ if INT13 && tiles && whole_lo < whole_hi => super::x86_int13::softmax_blocks(
                &blocks[whole_lo..whole_hi],
                &mut weights[whole_lo..whole_hi],
                (c, max),
                &mut partial,
            ),
            #[cfg(target_arch = "x86_64")]
            _ if tiles && whole_lo < whole_hi => super::x86_bf16::softmax_blocks(
                &blocks[whole_lo..whole_hi],
                &mut weights[whole_lo..whole_hi],
                (c, max),
                &mut partial,
            ),
            _ if whole_lo < whole_hi => softmax_blocks_body::<INT13>(
                &blocks[whole_lo..whole_hi],
                &mut weights[whole_lo..whole_hi],
                (c, max),
                &mut partial,
            ),
            _ => {}
        }
        if let Some(b) = last {
            let own = own_lanes(b, (lo, hi));
            masked_block::<INT13>(tiles, &blocks[b], own, cm, &mut weights[b], &mut partial);
        }
        weights[..b_lo].iter_mut().for_each(|w| w.fill(0));
        weights[b_hi..].iter_mut().for_each(|w| w.fill(0));
        row_totals(&mut columns, &partial, (r, rows), inv);
    }
}

/// Row `r`'s partial sums (of `rows`) into `columns` (`columns[i][r % 16]` is lane `i`),
/// and after the 16th row of a group, or the last row, each of the group's rows' `1 /
/// total` into `inv`: a row's total is its lanes added in order, `((0 + p₀) + p₁) + …`, and
/// the totals of 16 rows are taken side by side, a vector addition a lane (a row's 16
/// dependent additions one after another, and its division, were most of a short text's
/// softmax). The softmax's rows here and `x86_int13_avx2`'s one-pass rows end with it.
#[inline(always)]
pub(super) fn row_totals(
    columns: &mut [[f32; LANES]; LANES],
    partial: &[f32; LANES],
    (r, rows): (usize, usize),
    inv: &mut [f32],
) {
    let at = r % LANES;
    for (column, &x) in columns.iter_mut().zip(partial) {
        column[at] = x;
    }
    if at == LANES - 1 || r + 1 == rows {
        // Lanes past `at` hold an earlier chunk's rows (or zeros): computed, not kept.
        let mut totals = [0.0f32; LANES];
        for column in columns.iter() {
            for (t, &x) in totals.iter_mut().zip(column) {
                *t += x;
            }
        }
        for (inv, &total) in inv[r - at..=r].iter_mut().zip(&totals) {
            *inv = 1.0 / total;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The smallest exponent of a slice's nonzero bfloat16s, in either half of a pair,
    /// anywhere in the slice (the scans vectorize: lengths past a vector, the value in the
    /// tail): zeros of either sign left out, subnormals 0, infinities and NaNs 255.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_smallest_exponent_leaves_zeros_out() {
        let bf16 = |x: f32| x.to_bits() >> 16;
        assert_eq!(min_exponent(&[]), 255);
        assert_eq!(min_exponent(&[0, 0x8000_8000, 0x7f80_7fc0]), 255);
        assert_eq!(min_exponent_halves(&[0, 0x8000, 0xff80]), 255);
        for (x, e) in [
            (1.0, 127),
            (-3.0, 128),
            (2f32.powi(-55), 72),
            (f32::MIN_POSITIVE, 1),
        ] {
            for at in [0, 5, 99] {
                let mut pairs = vec![bf16(1e30) << 16; 100];
                pairs[at] = bf16(x);
                assert_eq!(min_exponent(&pairs), e, "{x} at {at}");
                pairs[at] = bf16(x) << 16;
                assert_eq!(min_exponent(&pairs), e, "{x} << 16 at {at}");
                let mut halves = vec![bf16(1e30) as u16; 100];
                halves[at] = bf16(x) as u16;
                assert_eq!(min_exponent_halves(&halves), e, "{x} at {at}");
            }
        }
        assert_eq!(min_exponent(&[0x3f80_0001]), 0);
        assert_eq!(min_exponent_halves(&[0x0001]), 0);
    }

    /// A head's smallest exponents, found once, for the FMA tiles only.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_head_finds_its_smallest_exponents_once_for_fma() {
        let (kt, v) = ([0x3f80_0000u32, 0x0080_0000], [0x4000_4000u32, 0x3e80_0000]);
        let head = Products::Avx2Fma.head(&kt, &v, 2);
        assert_eq!(head.fma, Some((1, 125)));
        assert_eq!(Products::Portable.head(&kt, &v, 2).fma, None);
        // Where every call stays on `vdpbf16ps` (too few keys), nothing is scanned.
        if super::super::x86_bf16::available() {
            assert_eq!(Products::Avx512Fma.head(&kt, &v, 112).fma, None);
            assert!(Products::Avx512Fma.head(&kt, &v, 113).fma.is_some());
        }
    }

    /// An f32 from its bfloat16 bits.
    fn widen(b: u32) -> f32 {
        f32::from_bits(b << 16)
    }

    #[test]
    fn the_size_checks_refuse_short_buffers_and_overflow() {
        // 3 rows of d = 64, groups 1..3 of kt: q 96 pairs, kt 3 · 512, out 3 · 32.
        assert!(scores_fit((96, 1536, 96), 3, 64, 1, 2));
        assert!(!scores_fit((95, 1536, 96), 3, 64, 1, 2));
        assert!(!scores_fit((96, 1535, 96), 3, 64, 1, 2));
        assert!(!scores_fit((96, 1536, 95), 3, 64, 1, 2));
        assert!(!scores_fit((96, 1536, 96), 3, 63, 1, 2));
        assert!(!scores_fit(
            (usize::MAX, usize::MAX, usize::MAX),
            3,
            64,
            usize::MAX,
            2
        ));
        assert!(!scores_fit(
            (usize::MAX, usize::MAX, usize::MAX),
            usize::MAX,
            64,
            0,
            2
        ));
        // 2 rows of 10 weights 12 apart, 5 pairs of 16 values, out rows 20 apart.
        assert!(weighted_sum_fits((22, 80, 36), 2, 12, 5, 16, 20));
        assert!(!weighted_sum_fits((21, 80, 36), 2, 12, 5, 16, 20));
        assert!(!weighted_sum_fits((22, 79, 36), 2, 12, 5, 16, 20));
        assert!(!weighted_sum_fits((22, 80, 35), 2, 12, 5, 16, 20));
        assert!(!weighted_sum_fits((22, 80, 36), 2, 11, 5, 16, 20));
        let huge = (usize::MAX, usize::MAX, usize::MAX);
        assert!(!weighted_sum_fits(huge, 3, usize::MAX - 1, 5, 16, 20));
        assert!(!weighted_sum_fits(huge, 1, 2, usize::MAX, 16, 20));
    }

    #[test]
    fn the_f32_check_has_the_bounds_it_states() {
        // Products' lowest bits: 2^(a + b − 268) ≥ 2⁻¹²⁶ iff a + b ≥ 142.
        assert!(f32_is_exact((71, 100), (71, 100), 64));
        assert!(!f32_is_exact((70, 100), (71, 100), 64));
        // Sums of 64 terms below 2^(a + b − 252 + 6) ≤ 2¹²⁷ … iff a + b + 6 ≤ 379.
        assert!(f32_is_exact((127, 186), (127, 187), 64));
        assert!(!f32_is_exact((127, 187), (127, 187), 64));
        assert!(!f32_is_exact((127, 186), (127, 187), 65));
        // No nonzero value: every product is zero.
        assert_eq!(exponents::<u32>(&[0, 0x8000_8000]), (255, 0));
        assert!(f32_is_exact((255, 0), (1, 254), 64));
        assert!(!f32_is_exact((255, 255), (120, 120), 2));
        assert_eq!(exponents::<u16>(&[0x3f80, 0x0080, 0]), (1, 127));
        assert_eq!(exponents::<u32>(&[0x3f80_0000 | 0x4000]), (127, 128));
    }

    #[test]
    fn rounding_to_bf16_follows_the_definition() {
        // Exact values stay; halfway cases go to the even neighbour.
        assert_eq!(to_bf16(1.0), 0x3f80);
        assert_eq!(to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(to_bf16(-2.5), 0xc020);
        // Subnormals become zeros of their sign; infinities stay; NaNs are quieted.
        assert_eq!(to_bf16(f32::from_bits(0x0000_0001)), 0x0000);
        assert_eq!(to_bf16(f32::from_bits(0x8040_0000)), 0x8000);
        assert_eq!(to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(to_bf16(f32::NEG_INFINITY), 0xff80);
        assert_eq!(to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert!(widen(to_bf16(f32::NAN)).is_nan());
        // The largest finite f32 rounds up to infinity; the smallest normal stays.
        assert_eq!(to_bf16(f32::MAX), 0x7f80);
        assert_eq!(to_bf16(f32::MIN_POSITIVE), 0x0080);
    }

    #[test]
    fn a_pair_takes_the_odd_product_first_and_flushes() {
        let e = 2f32.powi(-12);
        // Odd product 2⁻²⁴ (half an ulp of 1: the tie goes to 1), then the even one, −2⁻²⁴:
        // 1 − 2⁻²⁴. Even first would give 1 − 2⁻²⁴ + 2⁻²⁴ = 1; the pair summed first, or one
        // rounding at the end, 1 as well.
        let got = dot_pair(1.0, pair(-e, e), pair(e, e));
        assert_eq!(got, 1.0 - 2f32.powi(-24));
        // Two products that each vanish into the tie: 1; summed first they would make
        // 1 + 2⁻²³.
        assert_eq!(dot_pair(1.0, pair(e, e), pair(e, e)), 1.0);
        // A subnormal sum is flushed to a zero of its sign: 2⁻⁶⁴ · 2⁻⁶⁴ = 2⁻¹²⁸.
        let s = 2f32.powi(-64);
        assert_eq!(dot_pair(0.0, pair(0.0, s), pair(0.0, s)).to_bits(), 0);
        let negative = dot_pair(0.0, pair(-0.0, -s), pair(0.0, s));
        assert_eq!(negative.to_bits(), 0x8000_0000);
    }

    /// Operands whose sums cancel down to one unit of their products' lowest bit, the two
    /// sides' biased exponents adding up to `e_a + e_b`: a side-`a` pair of significands
    /// (128, 129) (even, odd) against a side-`b` pair (−130, 129), so that `dot_pair` folds
    /// 129 · 129 · 2ˢ, then −128 · 130 · 2ˢ, to exactly 2ˢ, s = e_a + e_b − 268 (before its
    /// flush): 2⁻¹²⁶ at the FMA tiles' bound (142), a subnormal 2⁻¹²⁷ one step below.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn cancelling_pairs(e_a: u32, e_b: u32) -> (u32, u32) {
        let half = |sign: u32, e: u32, significand: u32| sign << 15 | e << 7 | (significand - 128);
        (
            half(0, e_a, 128) | half(0, e_a, 129) << 16,
            half(1, e_b, 130) | half(0, e_b, 129) << 16,
        )
    }

    /// The same sum as FMA computes it without flushing: the odd products first.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn fma_pair(acc: f32, a: u32, b: u32) -> f32 {
        let (a_even, a_odd) = unpair(a);
        let (b_even, b_odd) = unpair(b);
        a_even.mul_add(b_even, a_odd.mul_add(b_odd, acc))
    }

    /// The FMA tiles' bound, exactly: smallest exponents ea + eb = −112 run, −113 decline,
    /// for the scores (q against k) and for the weighted sums (weights against v): the
    /// checks of every set of FMA tiles.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn the_tiles_run_down_to_the_bound(scores: FmaScores, sums: FmaSums) {
        let (rows, d, groups) = (5, 32, 2);
        let len = groups * LANES;
        // Pairs of 1.5 · 2^(e − 127), both halves.
        let of = |e: u32, n: usize| vec![(e << 7 | 0x40) * 0x1_0001; n];
        for (e, runs) in [(62, true), (61, false)] {
            let (nq, nk) = (rows * d / 2, groups * d / 2 * LANES);
            let mut out = vec![0.0; rows * len];
            for (q, kt) in [(of(e, nq), of(80, nk)), (of(80, nq), of(e, nk))] {
                let ran = fma_scores_on(scores, &q, rows, d, &kt, (0, groups), &mut out);
                assert_eq!(ran, runs, "{e}");
            }
            let p: Vec<u16> = of(e, rows * len / 2)
                .iter()
                .flat_map(|&x| [x as u16, (x >> 16) as u16])
                .collect();
            let v = of(80, len / 2 * d);
            let mut out = vec![0.0; rows * d];
            let ran = fma_sums_on(sums, &p, rows, len, &v, (len / 2, d), (&mut out, d));
            assert_eq!(ran, runs, "{e}");
        }
    }

    /// At the bound the tiles give the definition's bits where a sum cancels down to the
    /// products' lowest bit (2⁻¹²⁶, normal); one step below, that sum is a subnormal FMA
    /// keeps and the definition flushes (so the bound matters), and the tiles decline.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn a_cancelling_sum_keeps_the_definitions_bits(scores: FmaScores, sums: FmaSums) {
        let (rows, d, groups, pairs) = (5, 16, 2, 16);
        for (e_a, e_b, runs) in [(62, 80, true), (80, 62, true), (61, 80, false)] {
            let (a, b) = cancelling_pairs(e_a, e_b);
            let want = if runs { f32::MIN_POSITIVE } else { 0.0 };
            assert_eq!(dot_pair(0.0, a, b), want);
            if !runs {
                assert_eq!(fma_pair(0.0, a, b), f32::MIN_POSITIVE / 2.0);
            }
            // The portable loops give `want` everywhere; the tiles ran (and gave it) or
            // declined (and left their 9s).
            let check = |ran: bool, tiles: &[f32], portable: &[f32]| {
                assert_eq!(ran, runs, "{e_a} + {e_b}");
                assert!(portable.iter().all(|x| x.to_bits() == want.to_bits()));
                if runs {
                    assert!(tiles.iter().all(|x| x.to_bits() == want.to_bits()));
                } else {
                    assert!(tiles.iter().all(|&x| x == 9.0));
                }
            };
            // Scores: one pair of channels at the start of each query, zeros after.
            let mut q = vec![0u32; rows * d / 2];
            let mut kt = vec![0u32; groups * d / 2 * LANES];
            for r in 0..rows {
                q[r * d / 2] = a;
            }
            for g in 0..groups {
                for i in 0..LANES {
                    kt[g * d / 2 * LANES + i] = b;
                }
            }
            let (mut tiles, mut portable) = (
                vec![9.0; rows * groups * LANES],
                vec![7.0; rows * groups * LANES],
            );
            let ran = fma_scores_on(scores, &q, rows, d, &kt, (0, groups), &mut tiles);
            scores_portable(&q, rows, d, &kt, 0, groups, &mut portable);
            check(ran, &tiles, &portable);
            // Weighted sums: each row's first pair of weights against values whose first
            // pair of keys cancels, the other pairs zero.
            let (w, v) = (a, b);
            let mut p = vec![0u16; rows * 2 * pairs];
            for r in 0..rows {
                p[r * 2 * pairs] = w as u16;
                p[r * 2 * pairs + 1] = (w >> 16) as u16;
            }
            let mut vp = vec![0u32; pairs * d];
            vp[..d].fill(v);
            let (mut tiles, mut portable) = (vec![9.0; rows * d], vec![7.0; rows * d]);
            let out = (&mut tiles[..], d);
            let ran = fma_sums_on(sums, &p, rows, 2 * pairs, &vp, (pairs, d), out);
            weighted_sum_portable(&p, rows, 2 * pairs, &vp, pairs, d, &mut portable, d);
            check(ran, &tiles, &portable);
        }
    }

    /// `n` values in `[−spread/2, spread/2)` from a xorshift of `seed` (the attention tests'
    /// too).
    pub(crate) fn values(seed: u64, n: usize, spread: f32) -> Vec<f32> {
        let mut state = seed | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * spread
            })
            .collect()
    }

    /// The definition written out one value at a time: the weights and `1 / total`.
    fn softmax_by_definition(s: &[f32], lo: usize, hi: usize, scale: f32) -> (Vec<u32>, f32) {
        let c = scale * std::f32::consts::LOG2_E;
        let t: Vec<f32> = s.iter().map(|&x| x * c).collect();
        let max = t[lo..hi].iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let e: Vec<f32> = (0..s.len())
            .map(|j| {
                if (lo..hi).contains(&j) {
                    exp2_nonpositive(t[j] - max)
                } else {
                    0.0
                }
            })
            .collect();
        let mut partial = [0.0f32; 16];
        for (j, &x) in e.iter().enumerate() {
            partial[j % 16] += x;
        }
        let mut total = 0.0f32;
        for x in partial {
            total += x;
        }
        (e.iter().map(|&x| to_bf16(x)).collect(), 1.0 / total)
    }

    #[test]
    fn exp2_nonpositive_is_close_to_f64() {
        let mut worst = 0.0f64;
        for i in 0..=400_000 {
            let y = -125.5 * i as f32 / 400_000.0;
            let want = f64::from(y).exp2();
            let got = exp2_nonpositive(y);
            assert!(got.is_normal(), "2^{y} = {got}");
            worst = worst.max((f64::from(got) - want).abs() / want);
        }
        assert!(worst < 3e-6, "relative error {worst}");
        // The coefficients are the fit's f32 values.
        let bits = [0x3f31_7096u32, 0x3e76_01bc, 0x3d64_fe24, 0x3c1d_0164];
        assert_eq!(EXP2_COEFFICIENTS.map(f32::to_bits), bits);
        assert_eq!(exp2_nonpositive(0.0), 1.0);
        assert_eq!(exp2_nonpositive(-3.0), 0.125);
        assert!(exp2_nonpositive(-1000.0).is_normal());
        assert!(exp2_nonpositive(f32::NEG_INFINITY).is_normal());
        assert!(exp2_nonpositive(f32::NAN).is_nan());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn softmax_follows_the_definition(
            blocks in 1usize..6,
            lo in 0usize..40,
            n in 1usize..60,
            seed in any::<u64>(),
            spread in prop_oneof![Just(1.0f32), Just(60.0f32)],
        ) {
            let width = blocks * 16;
            let lo = lo.min(width - 1);
            let hi = (lo + n).min(width);
            let rows = 2;
            let s = values(seed, rows * width, spread);
            let expected: Vec<(Vec<u32>, f32)> = s
                .chunks_exact(width)
                .map(|row| softmax_by_definition(row, lo, hi, 0.25))
                .collect();
            let own = [(lo, hi), (lo, hi)];
            let maxes: Vec<f32> = s
                .chunks_exact(width)
                .map(|row| row[lo..hi].iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)))
                .collect();
            // The portable loops and this CPU's (the AVX-512 BF16 tiles where it has them),
            // with and without the rows' maxes given.
            for products in Products::all() {
                for given in [None, Some(&maxes[..])] {
                    let (mut p, mut inv) = (vec![7u16; rows * width], [0.0f32; 2]);
                    softmax(products, &s, width, &own, 0.25, given, &mut p, &mut inv);
                    for (r, (want, want_inv)) in expected.iter().enumerate() {
                        let got: Vec<u32> = p[r * width..(r + 1) * width]
                            .iter()
                            .map(|&x| u32::from(x))
                            .collect();
                        prop_assert_eq!(&got, want, "{:?}, maxes given: {}", products, given.is_some());
                        prop_assert_eq!(inv[r].to_bits(), want_inv.to_bits());
                    }
                }
            }
        }

        /// int13's softmax on every variant this CPU runs (the AVX-512 tiles do its whole
        /// blocks and its masked ones: a short text's only block, a window's edges) gives
        /// the portable loops' bits: weights and
        /// `1 / total`, with scores that include infinities and NaNs outside and inside the
        /// own keys, the maxes given or not.
        #[test]
        fn int13_softmax_is_the_portable_one_on_every_variant(
            blocks in 1usize..5,
            lo in 0usize..40,
            n in 1usize..60,
            seed in any::<u64>(),
            spread in prop_oneof![Just(1.0f32), Just(60.0f32)],
            odd in prop_oneof![Just(None), Just(Some(f32::NAN)), Just(Some(f32::INFINITY)), Just(Some(f32::NEG_INFINITY))],
            at in 0usize..80,
        ) {
            let width = blocks * 16;
            let lo = lo.min(width - 1);
            let hi = (lo + n).min(width);
            let rows = 3;
            let mut s = values(seed, rows * width, spread);
            // Row 0 keeps finite scores; row 1 takes the odd value at a lane anywhere (its
            // own keys or not); row 2 at an own key.
            if let Some(x) = odd {
                s[width + at % width] = x;
                s[2 * width + lo + at % (hi - lo)] = x;
            }
            let own = [(lo, hi); 3];
            let maxes: Vec<f32> = s
                .chunks_exact(width)
                .map(|row| row[lo..hi].iter().fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m }))
                .collect();
            let run = |products, given: Option<&[f32]>| {
                let (mut p, mut inv) = (vec![7u16; rows * width], [0.0f32; 3]);
                softmax_int13(products, &s, width, &own, 0.25, given, &mut p, &mut inv);
                (p, inv.map(f32::to_bits))
            };
            for given in [None, Some(&maxes[..])] {
                let portable = run(super::super::int13::Products::Portable, given);
                for products in super::super::int13::Products::all() {
                    prop_assert_eq!(&run(products, given), &portable, "{:?}", products);
                }
            }
        }

        /// A text within the window (every row's own keys the first `len`, the maxes given,
        /// as int13's attention asks), on up to 40 rows (past one group of 16 totals): the
        /// AVX-512 and AVX2 passes give the portable rows' weights and inverses, bit for
        /// bit, with infinities and NaNs among the keys and none.
        #[test]
        fn int13_softmax_of_whole_texts_is_the_portable_one(
            blocks in 1usize..10,
            len in 0usize..160,
            rows in 1usize..41,
            seed in any::<u64>(),
            spread in prop_oneof![Just(1.0f32), Just(60.0f32)],
            odd in prop_oneof![Just(None), Just(Some(f32::NAN)), Just(Some(f32::INFINITY)), Just(Some(f32::NEG_INFINITY))],
            at in any::<usize>(),
        ) {
            let width = blocks * 16;
            let len = len.min(width);
            let mut s = values(seed, rows * width, spread);
            if let Some(x) = odd {
                let at = at % s.len();
                s[at] = x;
            }
            let own = vec![(0, len); rows];
            let maxes: Vec<f32> = s
                .chunks_exact(width)
                .map(|row| row[..len].iter().fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m }))
                .collect();
            let run = |products| {
                let (mut p, mut inv) = (vec![7u16; rows * width], vec![0.0f32; rows]);
                softmax_int13(products, &s, width, &own, 0.125, Some(&maxes), &mut p, &mut inv);
                (p, inv.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
            };
            let portable = run(super::super::int13::Products::Portable);
            for products in super::super::int13::Products::all() {
                prop_assert_eq!(&run(products), &portable, "{:?}", products);
            }
        }

        /// Where [`f32_is_exact`] holds, plain f32 folds give `dot_pair`'s bits: operands
        /// drawn around both of its bounds (products near 2⁻¹²⁶, sums near 2¹²⁸), with zeros.
        #[test]
        fn f32_folds_are_exact_where_the_check_says_so(
            pairs in 1usize..40,
            (a_lo, b_lo) in prop_oneof![(60u32..80, 60u32..80), (180u32..195, 180u32..195)],
            span in 1u32..12,
            seed in any::<u64>(),
        ) {
            let mut state = seed | 1;
            let mut draw = |lo: u32| -> u32 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                if state % 7 == 0 {
                    return 0;
                }
                let exp = lo + (state >> 20) as u32 % span;
                ((state >> 8) as u32 & 1) << 15 | exp << 7 | (state >> 32) as u32 & 0x7f
            };
            let a: Vec<u32> = (0..pairs).map(|_| draw(a_lo) | draw(a_lo) << 16).collect();
            let b: Vec<u32> = (0..pairs).map(|_| draw(b_lo) | draw(b_lo) << 16).collect();
            let exact = f32_is_exact(exponents(&a), exponents(&b), 2 * pairs);
            let fold = |dot: fn(f32, u32, u32) -> f32| {
                a.iter().zip(&b).fold(0.0f32, |acc, (&x, &y)| dot(acc, x, y))
            };
            let (slow, fast) = (fold(dot_pair), fold(dot_pair_f32));
            if exact {
                prop_assert_eq!(slow.to_bits(), fast.to_bits());
            }
        }

        #[test]
        fn scores_and_weighted_sums_follow_the_definition(
            len in 1usize..50,
            d in prop_oneof![Just(2usize), Just(16usize), Just(24usize)],
            seed in any::<u64>(),
        ) {
            let stride = d + 3;
            let k = values(seed, len * stride, 4.0);
            let q = values(seed ^ 1, 3 * stride, 4.0);
            let v = values(seed ^ 2, len * stride, 4.0);
            let (mut qp, mut kt, mut vp) = (vec![0; 3 * d / 2], Aligned::default(), Aligned::default());
            pack_queries(&q, stride, 3, d, &mut qp);
            pack_keys(&k, stride, len, d, &mut kt);
            pack_values(&v, stride, len, d, &mut vp);
            let groups = len.div_ceil(16);
            let mut s = vec![f32::NAN; 3 * groups * 16];
            let mut maxes = [f32::NEG_INFINITY; 3];
            let head = Products::Portable.head(&kt, &vp, len);
            let out = (&mut s[..], &mut Widened::default());
            Products::Portable.scores(&qp, 3, d, &head, (0, groups), out, Some((&mut maxes, len)));
            let bf = |x: f32| widen(to_bf16(x));
            for r in 0..3 {
                for j in 0..groups * 16 {
                    let mut acc = 0.0f32;
                    for c in 0..d / 2 {
                        let key = |c: usize| if j < len { bf(k[j * stride + c]) } else { 0.0 };
                        let query = |c: usize| bf(q[r * stride + c]);
                        acc = dot_pair(
                            acc,
                            pair(query(2 * c), query(2 * c + 1)),
                            pair(key(2 * c), key(2 * c + 1)),
                        );
                    }
                    prop_assert_eq!(s[r * groups * 16 + j].to_bits(), acc.to_bits());
                }
                // The row's max over its `len` real keys.
                let row = &s[r * groups * 16..r * groups * 16 + len];
                prop_assert_eq!(maxes[r], row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)));
            }
            // Probabilities of any values, as packed pairs of rows of `width / 2`.
            let width = groups * 16;
            let probs = values(seed ^ 3, 3 * width, 1.0);
            let pp: Vec<u16> = probs.iter().map(|&x| to_bf16(x) as u16).collect();
            let pairs = len.div_ceil(2);
            let mut out = vec![9.0f32; 3 * stride];
            weighted_sum_portable(&pp, 3, width, &vp, pairs, d, &mut out, stride);
            for r in 0..3 {
                for c in 0..d {
                    let mut acc = 0.0f32;
                    for jp in 0..pairs {
                        let value = |j: usize| if j < len { bf(v[j * stride + c]) } else { 0.0 };
                        let p = |j: usize| bf(probs[r * width + j]);
                        acc = dot_pair(
                            acc,
                            pair(p(2 * jp), p(2 * jp + 1)),
                            pair(value(2 * jp), value(2 * jp + 1)),
                        );
                    }
                    prop_assert_eq!(out[r * stride + c].to_bits(), acc.to_bits());
                }
                // Past the row's d channels, nothing is written.
                prop_assert!(out[r * stride + d..(r + 1) * stride].iter().all(|&x| x == 9.0));
            }
        }
    }
}
