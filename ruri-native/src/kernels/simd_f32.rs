//! Attention's two f32 loops, compiled three times (baseline, AVX2, AVX-512F) from one
//! generic body and chosen at run time. Each SIMD lane is a different output (a key, a
//! channel) and each output's terms are added one after another with separate multiplies
//! and adds, so every version gives the same bits (tested below): the wider ones are only
//! faster.

/// `out[r][j] = Σ_c q[r][c] · kt[c][lo + j]` (c in order) for `rows` queries and `width`
/// keys; `kt` is `d × len` (keys transposed), `out` holds `rows × width`, zeroed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores(
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
    assert!(out.len() >= rows * width);
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked); the body is safe Rust.
            unsafe { scores_avx512(q, rows, d, kt, len, lo, width, out) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked); the body is safe Rust.
            unsafe { scores_avx2(q, rows, d, kt, len, lo, width, out) };
            return;
        }
    }
    scores_body(q, rows, d, kt, len, lo, width, out);
}

/// `out[c] += Σ_j p[j] · v[j][c]` (j in order); `v` is `p.len() × d`.
pub(crate) fn weighted_sum(p: &[f32], v: &[f32], d: usize, out: &mut [f32]) {
    assert!(v.len() >= p.len() * d && out.len() >= d);
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked); the body is safe Rust.
            unsafe { weighted_sum_avx512(p, v, d, out) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked); the body is safe Rust.
            unsafe { weighted_sum_avx2(p, v, d, out) };
            return;
        }
    }
    weighted_sum_body(p, v, d, out);
}

/// `out[j] = gelu(input[j]) · gate[j]` (ModernBERT's GeGLU), with `crate::math::gelu`.
pub(crate) fn geglu(input: &[f32], gate: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked); the body is safe Rust.
            unsafe { geglu_avx512(input, gate, out) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked); the body is safe Rust.
            unsafe { geglu_avx2(input, gate, out) };
            return;
        }
    }
    geglu_body(input, gate, out);
}

#[inline(always)]
fn geglu_body(input: &[f32], gate: &[f32], out: &mut [f32]) {
    for ((o, &u), &g) in out.iter_mut().zip(input).zip(gate) {
        *o = crate::math::gelu(u) * g;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn geglu_avx512(input: &[f32], gate: &[f32], out: &mut [f32]) {
    geglu_body(input, gate, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn geglu_avx2(input: &[f32], gate: &[f32], out: &mut [f32]) {
    geglu_body(input, gate, out);
}

/// Keys per tile: a tile's outputs and key rows stay in L1.
const TILE: usize = 256;

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
    for t0 in (0..width).step_by(TILE) {
        let tw = TILE.min(width - t0);
        for c in 0..d {
            let keys = &kt[c * len + lo + t0..c * len + lo + t0 + tw];
            for r in 0..rows {
                let qc = q[r * d + c];
                let o = &mut out[r * width + t0..r * width + t0 + tw];
                for (x, &k) in o.iter_mut().zip(keys) {
                    *x += qc * k;
                }
            }
        }
    }
}

#[inline(always)]
fn weighted_sum_body(p: &[f32], v: &[f32], d: usize, out: &mut [f32]) {
    let out = &mut out[..d];
    for (&pj, vj) in p.iter().zip(v.chunks_exact(d)) {
        for (o, &x) in out.iter_mut().zip(vj) {
            *o += pj * x;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
fn scores_avx512(
    q: &[f32],
    rows: usize,
    d: usize,
    kt: &[f32],
    len: usize,
    lo: usize,
    width: usize,
    out: &mut [f32],
) {
    scores_body(q, rows, d, kt, len, lo, width, out);
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
fn scores_avx2(
    q: &[f32],
    rows: usize,
    d: usize,
    kt: &[f32],
    len: usize,
    lo: usize,
    width: usize,
    out: &mut [f32],
) {
    scores_body(q, rows, d, kt, len, lo, width, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn weighted_sum_avx512(p: &[f32], v: &[f32], d: usize, out: &mut [f32]) {
    weighted_sum_body(p, v, d, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn weighted_sum_avx2(p: &[f32], v: &[f32], d: usize, out: &mut [f32]) {
    weighted_sum_body(p, v, d, out);
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
                .prop_flat_map(|(rows, d, len, lo, _, seed)| (Just(rows), Just(d), Just(len), Just(lo), 1..=len - lo, Just(seed)))
        ) {
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
        }
    }
}
