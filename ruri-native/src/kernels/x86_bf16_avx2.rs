//! bf16 attention's two products ([`super::bf16`] defines them) with AVX2's FMA, for x86 CPUs
//! without AVX-512 (where they would otherwise run the portable loops, which do a multiply
//! and an add for every product): the same tiles as `x86_bf16`'s FMA tiles, 8 lanes wide,
//! under the same bound and for the same reason (the proof is in `x86_bf16`, above
//! `fma_available`): where the smallest exponents of a call's two sides add up to
//! ea + eb ≥ −112 no sum can be subnormal, and FMA's one rounding is `dot_pair`'s. A call
//! past the bound returns `false` before it writes anything, and the caller runs the
//! portable loops.
//!
//! Each public function checks that the CPU has AVX2 and FMA and that every buffer holds
//! what its loops read or write; the `unsafe` blocks rely on nothing else.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::bf16::{FMA_MIN_EXPONENTS, LANES, Widened, min_exponent, scores_fit, weighted_sum_fits};

/// f32 lanes of a vector.
const W: usize = 8;
/// Query rows per tile of scores and of weighted sums.
const MR: usize = 4;
/// Key pairs of values per pass of the weighted sum (as `x86_bf16`'s).
const PAIR_CHUNK: usize = 32;

/// Whether this CPU has AVX2 and FMA, and the tiles give the portable code's bits (checked
/// once per process): on operands in the normal range they must agree bit for bit, on
/// operands near underflow they must decline.
pub(crate) fn available() -> bool {
    static AGREES: OnceLock<bool> = OnceLock::new();
    *AGREES.get_or_init(|| has_instructions() && agrees_with_portable())
}

fn has_instructions() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

fn agrees_with_portable() -> bool {
    super::bf16::fma_tiles_agree(scores, weighted_sum)
}

/// [`super::bf16::Products::scores`] with FMA, where the operands allow it: `false`, with
/// nothing written, where the queries' and keys' smallest exponents are too small together.
/// `keys_min`: the keys' [`min_exponent`] (over `kt` or more). With `row_max = Some((max,
/// keys))`, also folds each row's first `keys` scores into `max[r]` (`if x > m`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores(
    q: &[u32],
    rows: usize,
    d: usize,
    (kt, keys_min): (&[u32], u32),
    g_lo: usize,
    groups: usize,
    (out, widened): (&mut [f32], &mut Widened),
    row_max: Option<(&mut [f32], usize)>,
) -> bool {
    assert!(has_instructions(), "AVX2 tiles on a CPU without them");
    assert!(scores_fit(
        (q.len(), kt.len(), out.len()),
        rows,
        d,
        g_lo,
        groups
    ));
    let half = d / 2;
    let group = half * LANES;
    let (q, kt) = (
        &q[..rows * half],
        &kt[g_lo * group..(g_lo + groups) * group],
    );
    if min_exponent(q) + keys_min < FMA_MIN_EXPONENTS {
        return false;
    }
    // The queries widened (rows of d), and lines for one group of keys widened at a time,
    // pair by pair: 16 odd elements, then 16 even.
    let (qf, kf) = widened.take(q, 2 * half);
    let width = groups * LANES;
    super::x86_bf16::by_row_lanes(rows, row_max, |r0, n, (max, keys)| {
        for g in 0..groups {
            let valid = keys.saturating_sub(g * LANES).min(LANES);
            // SAFETY: AVX2 and FMA (checked above); group g < groups of kt into kf (2 · half
            // lines); rows r0..r0 + n of qf and out (`scores_fit`), of `max` when not null.
            unsafe {
                widen_group(kt.as_ptr().add(g * group), half, kf.as_mut_ptr());
                let mut r = r0;
                while r < r0 + n {
                    let mr = if r0 + n - r >= MR { MR } else { 1 };
                    let (q, o) = (qf.as_ptr().add(r * d), out.as_mut_ptr().add(r * width));
                    let m = if max.is_null() {
                        max
                    } else {
                        max.add((r - r0) * LANES)
                    };
                    let (k, o) = (kf.as_ptr(), o.add(g * LANES));
                    if mr == MR {
                        score_tile::<MR>(q, half, k, o, width, (m, valid));
                    } else {
                        score_tile::<1>(q, half, k, o, width, (m, valid));
                    }
                    r += mr;
                }
            }
        }
    });
    true
}

/// A group's `half` pairs of 16 packed keys at `kt` widened into `kf`: pair c's 16 odd
/// elements at `32c`, its even ones at `32c + 16`.
#[target_feature(enable = "avx2")]
unsafe fn widen_group(kt: *const u32, half: usize, kf: *mut f32) {
    let high = _mm256_set1_epi32(0xffff_0000u32 as i32);
    for i in 0..2 * half {
        // SAFETY: 8 of pair i / 2's 16 keys (the caller's group), and their widened halves
        // in kf's line i / 2 (2 · half lines of 16).
        unsafe {
            let x = _mm256_loadu_si256(kt.add(i * W).cast());
            let (c, part) = (i / 2, (i % 2) * W);
            let o = _mm256_castsi256_ps(_mm256_and_si256(x, high));
            let e = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x));
            _mm256_store_ps(kf.add(32 * c + part), o);
            _mm256_store_ps(kf.add(32 * c + LANES + part), e);
        }
    }
}

/// `R` widened queries (`2 · half` values each, consecutive) against one widened group of
/// 16 keys (`k`: pair c's odd elements at `32c`, even ones at `32c + 16`), two vectors of 8:
/// each score from +0, pair by pair, the odd products first, one FMA each; stored in rows of
/// `width`; with `max` not null, each row's scores of its first `valid` keys folded lane by
/// lane into the row's 16 lanes at `max + 16·r` (`a > m ? a : m`).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn score_tile<const R: usize>(
    q: *const f32,
    half: usize,
    k: *const f32,
    out: *mut f32,
    width: usize,
    (max, valid): (*mut f32, usize),
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for c in 0..half {
        for h in 0..2 {
            // SAFETY: c < half: pair c of the widened group (32-byte aligned: lines of 64
            // bytes, halves of 32) and of each of the tile's queries.
            unsafe {
                let base = k.add(32 * c + LANES * h);
                let kv = [_mm256_load_ps(base), _mm256_load_ps(base.add(W))];
                for (r, acc) in acc.iter_mut().enumerate() {
                    let qv = _mm256_broadcast_ss(&*q.add(r * 2 * half + 2 * c + h));
                    acc[0] = _mm256_fmadd_ps(qv, kv[0], acc[0]);
                    acc[1] = _mm256_fmadd_ps(qv, kv[1], acc[1]);
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (n, &a) in acc.iter().enumerate() {
            // SAFETY: score row r, keys 8n..8n + 8 of the tile's group (see the caller).
            unsafe { _mm256_storeu_ps(out.add(r * width + n * W), a) };
            if max.is_null() {
                continue;
            }
            // SAFETY: lanes 8n..8n + 8 of row r's 16 maxes (see the caller).
            unsafe {
                let slot = max.add(r * LANES + n * W);
                let m = _mm256_loadu_ps(slot);
                _mm256_storeu_ps(slot, fold_max(m, a, valid.saturating_sub(n * W)));
            }
        }
    }
}

/// Lanes `0..count` (all 8 from `count` = 8 on) set, as a float mask.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn first_lanes(count: usize) -> __m256 {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let count = _mm256_set1_epi32(count.min(W) as i32);
    _mm256_castsi256_ps(_mm256_cmpgt_epi32(count, idx))
}

/// 8 lanes of a row's maxes `m` with the scores `x` of its first `count` lanes folded in:
/// `x > m ? x : m` (a NaN score keeps the lane, as the softmax's own max does); lanes from
/// `count` on enter as −∞, which keeps them too. (A blend of the loaded lanes with the
/// scores compiled to masked stores, `vmaskmovps`, which the next load of the lanes waited
/// on: int13's AVX2 score tiles took twice their time that way.)
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn fold_max(m: __m256, x: __m256, count: usize) -> __m256 {
    let below = _mm256_set1_ps(f32::NEG_INFINITY);
    // vmaxps(a, b) is `a > b ? a : b`.
    _mm256_max_ps(_mm256_blendv_ps(below, x, first_lanes(count)), m)
}

/// [`super::bf16::Products::weighted_sum`] with FMA, where the operands allow it: `false`,
/// with nothing written, where the weights' and values' smallest exponents are too small
/// together, or `d` is not a multiple of 16. `values_min`: the values' [`min_exponent`]
/// (over `v` or more).
#[allow(clippy::too_many_arguments)]
pub(crate) fn weighted_sum(
    p: &[u16],
    rows: usize,
    p_row: usize,
    (v, values_min): (&[u32], u32),
    pairs: usize,
    d: usize,
    (out, out_stride): (&mut [f32], usize),
    widened: &mut Widened,
) -> bool {
    assert!(has_instructions(), "AVX2 tiles on a CPU without them");
    let lengths = (p.len(), v.len(), out.len());
    assert!(weighted_sum_fits(
        lengths, rows, p_row, pairs, d, out_stride
    ));
    match super::bf16::fma_weighted_sum_start(p, rows, p_row, values_min, pairs, d, out, out_stride)
    {
        Some(true) => {}
        Some(false) => return true,
        None => return false,
    }
    // A chunk's values widened: pair j's odd row (key 2j + 1) at `2j · d`, its even row at
    // `(2j + 1) · d` (d a multiple of 16: rows in whole lines).
    let (_, vf) = widened.take(&[], PAIR_CHUNK.min(pairs) * 2 * d / LANES);
    let vf = vf.as_mut_ptr();
    // A tile's weights of a chunk: row i's odd weights at `2 · PAIR_CHUNK · i`, its even ones
    // PAIR_CHUNK further.
    let mut wf = [0.0f32; MR * 2 * PAIR_CHUNK];
    let mut j0 = 0;
    while j0 < pairs {
        let kn = PAIR_CHUNK.min(pairs - j0);
        // SAFETY: the CPU has AVX2 (checked above); pairs j0..j0 + kn ≤ pairs of v (checked
        // above), into vf's 2 · kn ≤ 2 · min(pairs, PAIR_CHUNK) rows of d.
        unsafe { widen_values(v.as_ptr().add(j0 * d), kn, d, vf) };
        let mut r = 0;
        while r < rows {
            let mr = if rows - r >= MR { MR } else { 1 };
            for i in 0..mr {
                let row = &p[(r + i) * p_row + 2 * j0..][..2 * kn];
                for (j, two) in row.chunks_exact(2).enumerate() {
                    wf[i * 2 * PAIR_CHUNK + j] = f32::from_bits(u32::from(two[1]) << 16);
                    wf[i * 2 * PAIR_CHUNK + PAIR_CHUNK + j] =
                        f32::from_bits(u32::from(two[0]) << 16);
                }
            }
            for c0 in (0..d).step_by(LANES) {
                // SAFETY: the CPU has AVX2 and FMA (checked above). Rows r..r + mr of out
                // (inside: checked above) and of wf, the chunk's kn pairs of vf, channels
                // c0..c0 + 16 ≤ d.
                unsafe {
                    let (wt, vt) = (wf.as_ptr(), vf.add(c0));
                    let ot = out.as_mut_ptr().add(r * out_stride + c0);
                    let s = (out_stride, j0 == 0);
                    if mr == MR {
                        sum_tile::<MR>(wt, vt, d, kn, ot, s);
                    } else {
                        sum_tile::<1>(wt, vt, d, kn, ot, s);
                    }
                }
            }
            r += mr;
        }
        j0 += kn;
    }
    true
}

/// `pairs` rows of `d` packed pairs at `v` widened into `vf`: row j's odd elements (key
/// 2j + 1) at `2j · d`, its even ones at `(2j + 1) · d` (`d` a multiple of 16).
#[target_feature(enable = "avx2")]
unsafe fn widen_values(v: *const u32, pairs: usize, d: usize, vf: *mut f32) {
    let high = _mm256_set1_epi32(0xffff_0000u32 as i32);
    for j in 0..pairs {
        for c in (0..d).step_by(W) {
            // SAFETY: 8 pairs of row j < pairs (c + 8 ≤ d), and their places in vf's rows 2j
            // and 2j + 1 (the caller's sizes; 32-byte aligned: whole lines and halves).
            unsafe {
                let x = _mm256_loadu_si256(v.add(j * d + c).cast());
                let o = _mm256_castsi256_ps(_mm256_and_si256(x, high));
                let e = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x));
                _mm256_store_ps(vf.add(2 * j * d + c), o);
                _mm256_store_ps(vf.add((2 * j + 1) * d + c), e);
            }
        }
    }
}

/// `R` rows × 16 channels (two vectors): from +0 (`first`) or the sums stored so far,
/// folded over `pairs` key pairs in order, the odd key's product first, one FMA each
/// (weights as [`weighted_sum`] keeps them; values `vf`: pair j's odd row at `2j · d`, its
/// even row at `(2j + 1) · d`, 32-byte aligned).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn sum_tile<const R: usize>(
    w: *const f32,
    vf: *const f32,
    d: usize,
    pairs: usize,
    out: *mut f32,
    (out_stride, first): (usize, bool),
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    if !first {
        for (r, acc) in acc.iter_mut().enumerate() {
            for (n, a) in acc.iter_mut().enumerate() {
                // SAFETY: the tile's own outputs (see the caller).
                *a = unsafe { _mm256_loadu_ps(out.add(r * out_stride + n * W)) };
            }
        }
    }
    for j in 0..pairs {
        for h in 0..2 {
            // SAFETY: j < pairs: row 2j + h of the chunk's widened values, the tile's 16
            // channels, and weight j of half h of each of the tile's rows.
            unsafe {
                let base = vf.add((2 * j + h) * d);
                let x = [_mm256_load_ps(base), _mm256_load_ps(base.add(W))];
                for (r, acc) in acc.iter_mut().enumerate() {
                    let wv = _mm256_broadcast_ss(&*w.add(r * 2 * PAIR_CHUNK + h * PAIR_CHUNK + j));
                    acc[0] = _mm256_fmadd_ps(wv, x[0], acc[0]);
                    acc[1] = _mm256_fmadd_ps(wv, x[1], acc[1]);
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (n, &a) in acc.iter().enumerate() {
            // SAFETY: the tile's own outputs (see the caller).
            unsafe { _mm256_storeu_ps(out.add(r * out_stride + n * W), a) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn packed(seed: u64, n: usize, lo: u32, span: u32) -> Vec<u32> {
        super::super::bf16::random_pairs(&mut (seed | 1), n, lo, span)
    }

    #[test]
    fn this_cpu_uses_the_tiles_if_it_has_them() {
        if has_instructions() {
            assert!(
                available(),
                "the AVX2 FMA tiles disagree with the portable definition"
            );
        } else {
            assert!(!available());
        }
    }

    #[test]
    fn the_tiles_run_down_to_the_bound() {
        if has_instructions() {
            let bf16 = super::super::bf16::tests::the_tiles_run_down_to_the_bound;
            bf16(scores, weighted_sum);
        }
    }

    #[test]
    fn at_the_bound_a_cancelling_sum_keeps_the_definitions_bits() {
        if has_instructions() {
            let bf16 = super::super::bf16::tests::a_cancelling_sum_keeps_the_definitions_bits;
            bf16(scores, weighted_sum);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// The tiles give the portable code's bits over shapes around the tiles' edges, with
        /// zeros among the operands (and the rows' maxes over their first `keys` scores), or
        /// decline, writing nothing, where the operands are near underflow.
        #[test]
        fn tiles_give_the_portable_bits_or_decline(
            rows in prop_oneof![1usize..10, 15usize..40],
            groups in 1usize..7,
            g_lo in 0usize..2,
            d in prop_oneof![Just(16usize), Just(48usize), Just(64usize), Just(80usize), Just(24usize)],
            pairs in 0usize..80,
            seed in any::<u64>(),
            underflow in any::<bool>(),
        ) {
            if !has_instructions() {
                return Ok(());
            }
            let half = d / 2;
            // Normal: biased exponents 80 to 119 (sums never subnormal); near underflow: 1
            // to 40 (products far below the bound).
            let lo = if underflow { 1 } else { 80 };
            let mut q = packed(seed, rows * half, lo, 40);
            let mut kt = packed(seed ^ 1, (g_lo + groups) * half * LANES, lo, 40);
            let mut p = packed(seed ^ 2, rows * (pairs + 3), lo, 40);
            let mut v = packed(seed ^ 3, pairs * d, lo, 40);
            for x in [&mut q, &mut kt, &mut p, &mut v] {
                for j in (0..x.len()).step_by(7) {
                    x[j] &= 0xffff_0000;
                }
            }
            let p: Vec<u16> = p.into_iter().flat_map(|x| [x as u16, (x >> 16) as u16]).collect();
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();

            let width = groups * LANES;
            let (mut fma, mut portable) = (vec![1.0; rows * width], vec![2.0; rows * width]);
            let mut maxes = vec![f32::NEG_INFINITY; rows];
            let keys = width - pairs % 16;
            let k = (&kt[..], min_exponent(&kt));
            // One scratch for both products: reused, of another size each time.
            let mut widened = Widened::default();
            let out = (&mut fma[..], &mut widened);
            let ran = scores(&q, rows, d, k, g_lo, groups, out, Some((&mut maxes, keys)));
            super::super::bf16::scores_portable(&q, rows, d, &kt, g_lo, groups, &mut portable);
            prop_assert_eq!(ran, !underflow);
            if ran {
                prop_assert_eq!(bits(&fma), bits(&portable));
                for (r, &m) in maxes.iter().enumerate() {
                    let row = &portable[r * width..r * width + keys];
                    let want = row.iter().fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
                    prop_assert_eq!(m.to_bits(), want.to_bits());
                }
            } else {
                prop_assert!(fma.iter().all(|&x| x == 1.0));
                prop_assert!(maxes.iter().all(|&m| m == f32::NEG_INFINITY));
            }

            let p_row = 2 * (pairs + 3);
            let stride = d + 5;
            let (mut fma, mut portable) = (vec![1.0; rows * stride], vec![1.0; rows * stride]);
            let values = (&v[..], min_exponent(&v));
            let out = (&mut fma[..], stride);
            let ran = weighted_sum(&p, rows, p_row, values, pairs, d, out, &mut widened);
            super::super::bf16::weighted_sum_portable(&p, rows, p_row, &v, pairs, d, &mut portable, stride);
            prop_assert_eq!(ran, d % 16 == 0 && !(underflow && pairs > 0));
            if ran {
                prop_assert_eq!(bits(&fma), bits(&portable));
            } else {
                prop_assert!(fma.iter().all(|&x| x == 1.0));
            }
        }
    }
}
