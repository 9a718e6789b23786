//! The f32 loops around the GEMMs, each compiled three times (baseline, AVX2, AVX-512F) from
//! one generic body and chosen at run time. Each SIMD lane is a different output (a key, a
//! channel, an element) and each output's terms are combined in one fixed order with
//! separate multiplies and adds, so every version gives the same bits (tested below): the
//! wider ones are only faster.

/// Defines `pub(crate) fn $name` that runs `$body` compiled for the widest of AVX-512F,
/// AVX2 or the baseline that this CPU has. The body is safe Rust; only the call into a
/// `#[target_feature]` copy needs `unsafe`, after the feature was detected.
macro_rules! multiversion {
    ($(#[$meta:meta])* fn $name:ident / $body:ident ($($arg:ident : $ty:ty),*) $(-> $ret:ty)?) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[allow(clippy::too_many_arguments)]
                #[target_feature(enable = "avx512f")]
                fn wide($($arg: $ty),*) $(-> $ret)? { $body($($arg),*) }
                #[allow(clippy::too_many_arguments)]
                #[target_feature(enable = "avx2")]
                fn narrow($($arg: $ty),*) $(-> $ret)? { $body($($arg),*) }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F (checked); the body is safe Rust.
                    return unsafe { wide($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2 (checked); the body is safe Rust.
                    return unsafe { narrow($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

multiversion! {
    /// `out[r][j] = Σ_c q[r][c] · kt[c][lo + j]` (c in order) for `rows` queries and `width`
    /// keys; `kt` is `d × len` (keys transposed), `out` holds `rows × width`, zeroed.
    fn scores / scores_body(q: &[f32], rows: usize, d: usize, kt: &[f32], len: usize, lo: usize, width: usize, out: &mut [f32])
}

multiversion! {
    /// `out[c] += Σ_j p[j] · v[j][c]` (j in order); `v` is `p.len() × d`.
    fn weighted_sum / weighted_sum_body(p: &[f32], v: &[f32], d: usize, out: &mut [f32])
}

multiversion! {
    /// `out[j] = gelu(input[j]) · gate[j]` (ModernBERT's GeGLU), with `crate::math::gelu`.
    fn geglu / geglu_body(input: &[f32], gate: &[f32], out: &mut [f32])
}

multiversion! {
    /// `crate::math::layer_norm` of one row.
    fn layer_norm / layer_norm_body(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32])
}

multiversion! {
    /// Quantizes a row to symmetric 8-bit: returns `max |x|` (the caller derives the
    /// scale); `out[i] = rint(x[i] · 127 / max)`, or 0 where `max` is 0 or not finite.
    fn quantize_row / quantize_row_body(x: &[f32], out: &mut [i8]) -> f32
}

multiversion! {
    /// `out[j] (+)= (f32(acc[j]) · sa) · sw[j]`.
    fn dequantize_row / dequantize_row_body(acc: &[i32], sa: f32, sw: &[f32], out: &mut [f32], accumulate: bool)
}

/// Outputs per accumulator: one AVX-512 vector (two AVX2 ones, four SSE ones).
const VEC: usize = 16;

/// Callers pass `width` as a multiple of [`VEC`] (the keys beyond are zero padding).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn scores_body(
    q: &[f32],
    rows: usize,
    d: usize,
    kt: &[f32],
    len: usize,
    lo: usize,
    width: usize,
    out: &mut [f32],
) {
    assert!(q.len() >= rows * d && kt.len() >= d * len && lo + width <= len);
    assert!(out.len() >= rows * width && width.is_multiple_of(VEC));
    for r in 0..rows {
        let qr = &q[r * d..(r + 1) * d];
        for j0 in (0..width).step_by(VEC) {
            // One accumulator in registers over all of d, one channel after another.
            let mut acc = [0.0f32; VEC];
            for (c, &qc) in qr.iter().enumerate() {
                let keys: &[f32; VEC] = kt[c * len + lo + j0..c * len + lo + j0 + VEC]
                    .try_into()
                    .expect("a slice of VEC keys");
                for (a, &k) in acc.iter_mut().zip(keys) {
                    *a += qc * k;
                }
            }
            out[r * width + j0..r * width + j0 + VEC].copy_from_slice(&acc);
        }
    }
}

#[inline(always)]
fn weighted_sum_body(p: &[f32], v: &[f32], d: usize, out: &mut [f32]) {
    let out = &mut out[..d];
    let mut c0 = 0;
    while c0 < d {
        let w = VEC.min(d - c0);
        // Accumulators in registers over all keys, one key after another.
        let mut acc = [0.0f32; VEC];
        acc[..w].copy_from_slice(&out[c0..c0 + w]);
        if w == VEC {
            for (&pj, vj) in p.iter().zip(v.chunks_exact(d)) {
                let vj: &[f32; VEC] = vj[c0..c0 + VEC].try_into().expect("VEC values");
                for (a, &x) in acc.iter_mut().zip(vj) {
                    *a += pj * x;
                }
            }
        } else {
            for (&pj, vj) in p.iter().zip(v.chunks_exact(d)) {
                for (a, &x) in acc.iter_mut().zip(&vj[c0..c0 + w]) {
                    *a += pj * x;
                }
            }
        }
        out[c0..c0 + w].copy_from_slice(&acc[..w]);
        c0 += w;
    }
}

#[inline(always)]
fn geglu_body(input: &[f32], gate: &[f32], out: &mut [f32]) {
    for ((o, &u), &g) in out.iter_mut().zip(input).zip(gate) {
        *o = crate::math::gelu(u) * g;
    }
}

#[inline(always)]
fn layer_norm_body(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    crate::math::layer_norm(x, weight, eps, out);
}

#[inline(always)]
fn quantize_row_body(x: &[f32], out: &mut [i8]) -> f32 {
    // max |x| on the bit patterns: for non-negative floats their order is the integers'
    // (and an integer max vectorizes; a NaN, above infinity, is caught below).
    let max = f32::from_bits(
        x.iter()
            .fold(0u32, |m, &v| m.max(v.to_bits() & 0x7fff_ffff)),
    );
    if max == 0.0 || !max.is_finite() {
        out.iter_mut().for_each(|o| *o = 0);
        return max;
    }
    let inv = 127.0 / max;
    for (o, &v) in out.iter_mut().zip(x) {
        // Clamped to ±127 (|v · inv| ≤ 127 up to rounding), then rounded to the nearest
        // integer, ties to even, by the 1.5 · 2²³ addition, whose low mantissa byte then
        // is the integer in two's complement: no saturating float-to-int conversion.
        let t = (v * inv).clamp(-127.0, 127.0) + crate::math::ROUND_MAGIC;
        *o = t.to_bits() as u8 as i8;
    }
    max
}

#[inline(always)]
fn dequantize_row_body(acc: &[i32], sa: f32, sw: &[f32], out: &mut [f32], accumulate: bool) {
    if accumulate {
        for ((o, &a), &s) in out.iter_mut().zip(acc).zip(sw) {
            *o += (a as f32) * sa * s;
        }
    } else {
        for ((o, &a), &s) in out.iter_mut().zip(acc).zip(sw) {
            *o = (a as f32) * sa * s;
        }
    }
}

/// Columns of a packed fp32 weight panel (four AVX-512 vectors).
pub(crate) const FP32_PANEL: usize = 64;
/// Rows of one fp32 tile, and rows per block (a block of x stays in cache while every
/// panel of W streams by).
const FP32_MR: usize = 6;
const FP32_ROW_BLOCK: usize = 8 * FP32_MR;

/// Packs `w` (`n × k`, one row per output channel) into panels of [`FP32_PANEL`] columns,
/// each `k × FP32_PANEL` (k-major), zero-padded past `n`.
pub(crate) fn pack_fp32(w: &[f32], n: usize, k: usize) -> Vec<f32> {
    let panels = n.div_ceil(FP32_PANEL);
    let mut packed = vec![0.0f32; panels * k * FP32_PANEL];
    for (col, row) in w.chunks_exact(k).enumerate().take(n) {
        let (p, j) = (col / FP32_PANEL, col % FP32_PANEL);
        for (kk, &v) in row.iter().enumerate() {
            packed[(p * k + kk) * FP32_PANEL + j] = v;
        }
    }
    packed
}

/// `out (+)= x · Wᵀ` for `rows` rows of `x` (`rows × k`) with W packed by [`pack_fp32`];
/// `out` is `rows × n`. fp32 is not promised the same bits everywhere: the AVX2 and
/// AVX-512 versions fuse multiply and add (FMA), the baseline does not.
pub(crate) fn fp32_gemm(
    x: &[f32],
    rows: usize,
    k: usize,
    packed: &[f32],
    n: usize,
    out: &mut [f32],
    accumulate: bool,
) {
    assert!(x.len() >= rows * k && out.len() >= rows * n);
    assert!(packed.len() >= n.div_ceil(FP32_PANEL) * k * FP32_PANEL);
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,fma")]
        fn wide(x: &[f32], rows: usize, k: usize, p: &[f32], n: usize, o: &mut [f32], acc: bool) {
            fp32_gemm_body::<true>(x, rows, k, p, n, o, acc)
        }
        #[target_feature(enable = "avx2,fma")]
        fn narrow(x: &[f32], rows: usize, k: usize, p: &[f32], n: usize, o: &mut [f32], acc: bool) {
            fp32_gemm_body::<true>(x, rows, k, p, n, o, acc)
        }
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX-512F and FMA (checked); the body is safe Rust.
            return unsafe { wide(x, rows, k, packed, n, out, accumulate) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked); the body is safe Rust.
            return unsafe { narrow(x, rows, k, packed, n, out, accumulate) };
        }
    }
    fp32_gemm_body::<false>(x, rows, k, packed, n, out, accumulate)
}

#[inline(always)]
fn fp32_gemm_body<const FMA: bool>(
    x: &[f32],
    rows: usize,
    k: usize,
    packed: &[f32],
    n: usize,
    out: &mut [f32],
    accumulate: bool,
) {
    // A block of x, transposed tile by tile (`[tile][k][FP32_MR]`, short tiles zero-padded),
    // so that the tile loop reads fixed-size arrays only (no bounds check keeps the
    // accumulators out of registers).
    let mut xt = vec![0.0f32; FP32_ROW_BLOCK * k];
    for row0 in (0..rows).step_by(FP32_ROW_BLOCK) {
        let row_end = (row0 + FP32_ROW_BLOCK).min(rows);
        let tiles = (row_end - row0).div_ceil(FP32_MR);
        xt[..tiles * k * FP32_MR].iter_mut().for_each(|v| *v = 0.0);
        for r in row0..row_end {
            let (t, i) = ((r - row0) / FP32_MR, (r - row0) % FP32_MR);
            for (kk, &v) in x[r * k..(r + 1) * k].iter().enumerate() {
                xt[(t * k + kk) * FP32_MR + i] = v;
            }
        }
        for p in 0..n.div_ceil(FP32_PANEL) {
            let panel = &packed[p * k * FP32_PANEL..(p + 1) * k * FP32_PANEL];
            let cols = FP32_PANEL.min(n - p * FP32_PANEL);
            for t in 0..tiles {
                let r = row0 + t * FP32_MR;
                let mr = (row_end - r).min(FP32_MR);
                let acc = fp32_tile::<FMA>(&xt[t * k * FP32_MR..(t + 1) * k * FP32_MR], panel);
                for (i, acc) in acc.iter().enumerate().take(mr) {
                    let at = (r + i) * n + p * FP32_PANEL;
                    let o = &mut out[at..at + cols];
                    if accumulate {
                        for (o, &a) in o.iter_mut().zip(acc) {
                            *o += a;
                        }
                    } else {
                        o.copy_from_slice(&acc[..cols]);
                    }
                }
            }
        }
    }
}

/// One tile: `FP32_MR × FP32_PANEL` accumulators held in registers over all of k.
#[inline(always)]
fn fp32_tile<const FMA: bool>(xt: &[f32], panel: &[f32]) -> [[f32; FP32_PANEL]; FP32_MR] {
    let mut acc = [[0.0f32; FP32_PANEL]; FP32_MR];
    for (xk, w) in xt.chunks_exact(FP32_MR).zip(panel.chunks_exact(FP32_PANEL)) {
        let xk: &[f32; FP32_MR] = xk.try_into().expect("a tile column");
        let w: &[f32; FP32_PANEL] = w.try_into().expect("a panel row");
        for (acc, &xv) in acc.iter_mut().zip(xk) {
            for (a, &wv) in acc.iter_mut().zip(w) {
                *a = if FMA {
                    xv.mul_add(wv, *a)
                } else {
                    *a + xv * wv
                };
            }
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// The dispatched version (the widest this CPU runs) gives the baseline's bits.
        #[test]
        fn every_width_gives_the_same_bits(
            (rows, d, len, lo, width, seed) in (1usize..5, 1usize..70, 1usize..600)
                .prop_flat_map(|(rows, d, len)| (Just(rows), Just(d), Just(len), 0..len, Just(0usize), any::<u32>()))
                .prop_flat_map(|(rows, d, len, lo, _, seed)| (Just(rows), Just(d), Just(len + VEC), Just(lo), 1..=len - lo, Just(seed)))
        ) {
            let width = width.div_ceil(VEC) * VEC;
            let value = |i: usize| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.5;
            let q: Vec<f32> = (0..rows * d).map(value).collect();
            let kt: Vec<f32> = (0..d * len).map(|i| value(i + 7)).collect();
            let (mut a, mut b) = (vec![0.0; rows * width], vec![0.0; rows * width]);
            scores(&q, rows, d, &kt, len, lo, width, &mut a);
            scores_body(&q, rows, d, &kt, len, lo, width, &mut b);
            prop_assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            let p: Vec<f32> = (0..width).map(|i| value(i + 3)).collect();
            let v: Vec<f32> = (0..width * d).map(|i| value(i + 11)).collect();
            let (mut a, mut b) = (vec![0.25; d], vec![0.25; d]);
            weighted_sum(&p, &v, d, &mut a);
            weighted_sum_body(&p, &v, d, &mut b);
            prop_assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            let u: Vec<f32> = (0..width).map(|i| value(i + 5) * 40.0).collect();
            let (mut a, mut b) = (vec![0.0; width], vec![0.0; width]);
            geglu(&u, &p, &mut a);
            geglu_body(&u, &p, &mut b);
            prop_assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            let w: Vec<f32> = (0..width).map(|i| 1.0 + value(i + 9)).collect();
            layer_norm(&u, &w, 1e-5, &mut a);
            layer_norm_body(&u, &w, 1e-5, &mut b);
            prop_assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            let (mut qa, mut qb) = (vec![0i8; width], vec![0i8; width]);
            prop_assert_eq!(quantize_row(&u, &mut qa).to_bits(), quantize_row_body(&u, &mut qb).to_bits());
            prop_assert_eq!(&qa, &qb);
            // And the magic-number rounding is rint: ties to even, clamped.
            let max = u.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
            for (&q, &v) in qa.iter().zip(&u) {
                let want = if max == 0.0 { 0.0 } else { (v * (127.0 / max)).round_ties_even().clamp(-127.0, 127.0) };
                prop_assert_eq!(f32::from(q), want);
            }
            let acc: Vec<i32> = (0..width).map(|i| (value(i + 13) * 1e6) as i32).collect();
            for accumulate in [false, true] {
                let (mut a, mut b) = (vec![0.5; width], vec![0.5; width]);
                dequantize_row(&acc, 0.003, &w, &mut a, accumulate);
                dequantize_row_body(&acc, 0.003, &w, &mut b, accumulate);
                prop_assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            }
        }
    }

    /// The packed fp32 GEMM (the widest version this CPU runs) against an f64 sum, on
    /// shapes with every kind of tail, storing and accumulating.
    #[test]
    fn fp32_gemm_matches_f64() {
        for (rows, n, k) in [(1, 1, 1), (7, 65, 33), (13, 130, 257), (49, 64, 16)] {
            let x: Vec<f32> = (0..rows * k)
                .map(|i| ((i * 37) % 23) as f32 / 11.0 - 1.0)
                .collect();
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 53) % 29) as f32 / 14.0 - 1.0)
                .collect();
            let packed = pack_fp32(&w, n, k);
            for accumulate in [false, true] {
                let mut out = vec![0.5f32; rows * n];
                fp32_gemm(&x, rows, k, &packed, n, &mut out, accumulate);
                for r in 0..rows {
                    for c in 0..n {
                        let want: f64 = (0..k)
                            .map(|kk| x[r * k + kk] as f64 * w[c * k + kk] as f64)
                            .sum::<f64>()
                            + if accumulate { 0.5 } else { 0.0 };
                        let got = out[r * n + c] as f64;
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{rows}×{n}×{k} [{r}][{c}]: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
