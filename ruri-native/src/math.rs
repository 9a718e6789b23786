//! The float steps around the GEMMs, in plain IEEE operations (no fused multiply-add, no
//! platform math library), in a fixed summation order: the same input gives the same bits
//! on every CPU this crate compiles for. `exp` and `erf` are written here for that reason.

/// Partial sums kept in this many lanes: wide enough for the compiler to vectorize the
/// loops without reassociating anything.
pub(crate) const LANES: usize = 8;

/// 1.5 · 2²³: adding and subtracting it rounds an f32 of magnitude < 2²² to the nearest
/// integer, ties to even (the IEEE default), as NumPy's `rint` does; the sum's low mantissa
/// bits are that integer.
pub(crate) const ROUND_MAGIC: f32 = 12_582_912.0;

/// Σ xᵢ in [`LANES`] interleaved partial sums, then the lanes in order.
#[inline]
pub(crate) fn sum(x: &[f32]) -> f32 {
    let mut partials = Partials::new();
    partials.add(x);
    partials.total()
}

/// [`sum`]'s partial sums, for values that arrive piece by piece: pieces added in turn give
/// `sum` of their concatenation, bit for bit, when every piece but the last is a multiple of
/// [`LANES`] long.
pub(crate) struct Partials([f32; LANES]);

impl Partials {
    pub(crate) fn new() -> Self {
        Self([0.0; LANES])
    }

    /// Value `j` of `x` into partial `j mod LANES`, in order.
    #[inline(always)]
    pub(crate) fn add(&mut self, x: &[f32]) {
        let (chunks, tail) = x.as_chunks::<LANES>();
        for c in chunks {
            for (a, &v) in self.0.iter_mut().zip(c) {
                *a += v;
            }
        }
        for (a, &v) in self.0.iter_mut().zip(tail) {
            *a += v;
        }
    }

    /// The partials added in order, from +0.
    #[inline(always)]
    pub(crate) fn total(&self) -> f32 {
        self.0.iter().fold(0.0, |s, &a| s + a)
    }
}

/// LayerNorm without bias (ModernBERT's `nn.LayerNorm(bias=False)`): biased variance,
/// `(x − mean) / sqrt(var + eps) · weight`, as torch computes it in f32. Inlined, so that
/// `simd_f32::layer_norm`'s AVX2 and AVX-512 copies vectorize it (out of line it was
/// compiled once, for the baseline's SSE2).
#[inline(always)]
pub(crate) fn layer_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len() as f32;
    let mean = sum(x) / n;
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            let d = v - mean;
            *a += d * d;
        }
    }
    for (a, &v) in acc.iter_mut().zip(tail) {
        let d = v - mean;
        *a += d * d;
    }
    let var = acc.iter().fold(0.0, |s, &a| s + a) / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = (v - mean) * inv * w;
    }
}

/// eˣ in f32 from IEEE operations only: x = n·ln 2 + r with |r| ≤ ln 2 / 2 (Cody–Waite,
/// two-part ln 2), e^r by its Taylor polynomial to r⁷ (relative error < 2e-8 there), times
/// 2ⁿ built from the exponent bits. Relative error about 1 ulp; inputs are clamped to
/// [−87.3, 88.7] (below, the result stays e^−87.3 ≈ 1.2e-38: nothing here needs less).
#[inline]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n · LN2_HI is exact for |n| < 2⁹.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // A NaN passes through the clamp and every step below (no branch: the loops vectorize).
    let x = x.clamp(-87.3, 88.7);
    // n = rint(x · log2 e) by the 1.5 · 2²³ addition (`round_even`), whose low mantissa bits
    // are then n itself: no saturating float-to-int conversion (which does not vectorize).
    let shifted = x * LOG2E + ROUND_MAGIC;
    let n = shifted - ROUND_MAGIC;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // n ∈ [−126, 128]; build 2ⁿ in two halves so that n = 128 does not overflow the bits.
    let n = (shifted.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    let half = n / 2;
    let two_a = f32::from_bits((half.wrapping_add(127) as u32) << 23);
    let two_b = f32::from_bits((n.wrapping_sub(half).wrapping_add(127) as u32) << 23);
    p * two_a * two_b
}

/// erf(x) as x · P(x²) / Q(x²), P of degree 5 and Q of degree 5 in x² (Q(0) = 1), for
/// |x| ≤ 3.92 (beyond, erf(x) rounds to ±1 in f32): |error| ≤ 3.7e-7 in f32 over the whole
/// line (A&S 7.1.26 with [`exp`], used before, reached 5.5e-7 near 0, where `1 − poly · e^(−x²)`
/// cancels). The coefficients are this project's own fit (iteratively reweighted least
/// squares on Chebyshev points of [0, 3.92], in f64, then rounded to f32; all positive, so
/// Horner's steps do not cancel). 27 IEEE operations a value against about 50 for A&S with
/// `exp`: no exponential, one division. The result is clamped to [−1, 1] (the rounded fit reaches
/// 1 + 2⁻²³ near the end of the range).
#[inline]
pub(crate) fn erf(x: f32) -> f32 {
    let mut e = 0.0;
    erf_steps(&[x], 1.0, |_, v| e = v);
    e
}

/// `put(i, erf(x[i] · scale))` for a block of values (`x · 1.0` is `x`, bit for bit), each
/// step over the whole block before the next (for one value, [`erf`] itself): a value's
/// steps are one long dependent chain (two Horner chains, a division), and steps over `W`
/// values give the CPU `W / lanes` independent vectors at each step. Each value gets the
/// same operations in the same order, whatever `W`.
#[inline(always)]
fn erf_steps<const W: usize>(x: &[f32; W], scale: f32, mut put: impl FnMut(usize, f32)) {
    const X_MAX: f32 = 3.92;
    // erf′(0) = 2/√π (the fit's own value was 2 ulp from it).
    const P0: f32 = std::f32::consts::FRAC_2_SQRT_PI;
    const P1: f32 = 0.192_756_47;
    const P2: f32 = 0.053_059_29;
    const P3: f32 = 0.003_867_941_2;
    const P4: f32 = 0.000_287_460_5;
    const P5: f32 = 2.034_667e-6;
    const Q1: f32 = 0.504_157_66;
    const Q2: f32 = 0.115_081_31;
    const Q3: f32 = 0.015_171_545;
    const Q4: f32 = 0.001_188_001_6;
    const Q5: f32 = 3.806_893e-5;
    // A NaN passes through both clamps and every step (no branch: the loops vectorize).
    let (mut y, mut s) = ([0.0f32; W], [0.0f32; W]);
    for i in 0..W {
        y[i] = (x[i] * scale).clamp(-X_MAX, X_MAX);
    }
    for i in 0..W {
        s[i] = y[i] * y[i];
    }
    // p = P0 + s·(P1 + s·(P2 + s·(P3 + s·(P4 + s·P5)))), innermost first; q alike.
    let (mut p, mut q) = ([0.0f32; W], [0.0f32; W]);
    for i in 0..W {
        p[i] = P4 + s[i] * P5;
    }
    for c in [P3, P2, P1, P0] {
        for (p, &s) in p.iter_mut().zip(&s) {
            *p = c + s * *p;
        }
    }
    for i in 0..W {
        q[i] = Q4 + s[i] * Q5;
    }
    for c in [Q3, Q2, Q1, 1.0] {
        for (q, &s) in q.iter_mut().zip(&s) {
            *q = c + s * *q;
        }
    }
    // The last step hands each value on, so that the GELU finishes it in the same loop (a
    // block of erfs stored and read back by a second loop ran the GeGLU bench ≈ 5 % slower).
    for i in 0..W {
        put(i, (y[i] * p[i] / q[i]).clamp(-1.0, 1.0));
    }
}

/// The exact (erf) GELU of transformers' `ACT2FN["gelu"]`: x · ½ · (1 + erf(x / √2)).
#[inline]
pub(crate) fn gelu(x: f32) -> f32 {
    x * 0.5 * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// `out[i] = gelu(u[i]) · g[i]` for a block of values, with [`gelu`]'s operations in its
/// order (the same bits), the erf's steps over the whole block ([`erf_steps`]).
#[inline(always)]
pub(crate) fn gelu_gated<const W: usize>(u: &[f32; W], g: &[f32; W], out: &mut [f32; W]) {
    erf_steps(u, std::f32::consts::FRAC_1_SQRT_2, |i, e| {
        out[i] = u[i] * 0.5 * (1.0 + e) * g[i];
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gated_blocks_give_gelus_bits() {
        // Every 2⁻¹⁰ step over the GELU's whole range and beyond, the clamps' edges, zeros,
        // infinities and a NaN.
        let mut u: Vec<f32> = (-8 * 1024..=8 * 1024).map(|i| i as f32 / 1024.0).collect();
        u.extend([
            3.92 * std::f32::consts::SQRT_2,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        u.extend([f32::NAN, f32::MIN_POSITIVE, 1e-30, -1e30, 5.543_717]);
        while !u.len().is_multiple_of(64) {
            u.push(0.25);
        }
        for (block, g) in u
            .chunks_exact(64)
            .zip([1.0f32, -0.75, 3.5].into_iter().cycle())
        {
            let gate = [g; 64];
            let mut out = [0.0f32; 64];
            gelu_gated::<64>(block.try_into().unwrap(), &gate, &mut out);
            for (&x, &o) in block.iter().zip(&out) {
                assert_eq!(o.to_bits(), (gelu(x) * g).to_bits(), "gelu({x}) · {g}");
            }
        }
    }

    #[test]
    fn exp_is_within_two_ulp_of_f64() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_37;
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-200.0), exp(-87.3));
        assert!(exp(-200.0) < 1.3e-38);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn erf_and_gelu_match_f64() {
        let mut worst = 0.0f64;
        let mut x = -8.0f32;
        while x < 8.0 {
            let want = libm::erf(x as f64);
            worst = worst.max((erf(x) as f64 - want).abs());
            let g = 0.5 * (x as f64) * (1.0 + libm::erf(x as f64 / std::f64::consts::SQRT_2));
            assert!(
                (gelu(x) as f64 - g).abs() <= 2e-7 * (1.0 + (x as f64).abs()),
                "gelu({x})"
            );
            x += 0.000_97;
        }
        // The fit's 1.6e-8 plus the f32 rounding of its steps (measured 3.7e-7 in NumPy's f32).
        assert!(worst < 4e-7, "worst erf error {worst}");
        assert!(erf(f32::NAN).is_nan());
        assert_eq!((erf(3.92), erf(-3.92), erf(100.0)), (1.0, -1.0, 1.0));
        assert_eq!(erf(0.0), 0.0);
    }

    #[test]
    fn layer_norm_matches_f64() {
        let x: Vec<f32> = (0..37)
            .map(|i| ((i * 7919) % 101) as f32 / 13.0 - 3.0)
            .collect();
        let w: Vec<f32> = (0..37).map(|i| 1.0 + i as f32 / 100.0).collect();
        let mut out = vec![0.0; 37];
        layer_norm(&x, &w, 1e-5, &mut out);
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / 37.0;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / 37.0;
        for i in 0..37 {
            let want = (x[i] as f64 - mean) / (var + 1e-5).sqrt() * w[i] as f64;
            assert!((out[i] as f64 - want).abs() < 1e-5, "{i}");
        }
    }
}
