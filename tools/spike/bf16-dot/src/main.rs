//! See README.md: instruction rates for attention's candidate arithmetics, and a check of
//! `vdpbf16ps` against scalar models of it, bit for bit.

use std::arch::x86_64::*;
use std::time::Instant;

/// Loop trips per timing; each trip issues `ACC` instructions.
const ITERS: usize = 20_000_000;
/// Independent accumulators: more than latency × throughput on the CPUs measured.
const ACC: usize = 12;

/// Times `body` five times and prints the best rate; a step is one instruction (one multiply
/// and its add for `vmulps + vaddps`).
fn rate(name: &str, macs_per_instr: usize, body: impl Fn() -> f64) {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        std::hint::black_box(body());
        best = best.min(t.elapsed().as_secs_f64());
    }
    let instr = (ITERS * ACC) as f64;
    println!(
        "{name:<20} {:>6.2} G steps/s {:>7.1} G multiply-adds/s",
        instr / best / 1e9,
        instr * macs_per_instr as f64 / best / 1e9
    );
}

/// A register-only loop: `ACC` accumulators, each updated `ITERS` times by `$step` (a
/// closure of the accumulator), then summed so that nothing is dead code.
macro_rules! loop_body {
    ($features:literal, $name:ident, $zero:expr, $step:expr, $reduce:expr) => {
        #[target_feature(enable = $features)]
        fn $name() -> f64 {
            // Opaque starting values: nothing about the loop can be worked out at compile time.
            let mut a = std::hint::black_box([$zero; ACC]);
            for _ in 0..ITERS {
                for acc in a.iter_mut() {
                    *acc = $step(*acc);
                }
            }
            a.iter().map(|&v| $reduce(v) as f64).sum()
        }
    };
}

// The multiply takes the accumulator, so that it runs every time: a product of two
// loop-invariant values is hoisted out of the loop (and only the adds were timed).
loop_body!(
    "avx512f",
    mul_add,
    _mm512_set1_ps(1.0),
    |acc| _mm512_add_ps(acc, _mm512_mul_ps(acc, _mm512_set1_ps(1e-8))),
    _mm512_reduce_add_ps
);
loop_body!(
    "avx512f",
    fma,
    _mm512_setzero_ps(),
    |acc| _mm512_fmadd_ps(_mm512_set1_ps(1.000_001), _mm512_set1_ps(0.999_999), acc),
    _mm512_reduce_add_ps
);
loop_body!(
    "avx512f,avx512bf16",
    dpbf16,
    _mm512_setzero_ps(),
    |acc| {
        let x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1.01), _mm512_set1_ps(0.99));
        _mm512_dpbf16_ps(acc, x, x)
    },
    _mm512_reduce_add_ps
);
loop_body!(
    "avx512f,avx512vnni",
    dpbusd,
    _mm512_setzero_si512(),
    |acc| _mm512_dpbusd_epi32(acc, _mm512_set1_epi8(3), _mm512_set1_epi8(3)),
    _mm512_reduce_add_epi32
);

/// The shape of ruri-native's f32 attention tiles: per step, 4 vectors loaded (keys) and 3
/// values broadcast (queries) from a small array in L1, and `ACC` = 3 × 4 accumulators, each
/// `acc + q · k`; the products do not depend on the accumulators, as in the tiles. `FMA`
/// fuses the multiply and the add.
#[target_feature(enable = "avx512f")]
fn tile<const FMA: bool>() -> f64 {
    // 64 steps of keys (4 vectors each) and queries (3 values each), reused in turn. The
    // keys 64-byte aligned: unaligned, every load splits across two cache lines (runs with a
    // Vec moved between 26 and 43 G). The queries are broadcast one value at a time.
    #[repr(C, align(64))]
    struct Keys([f32; 64 * 64]);
    let mut keys = Box::new(Keys([0.0; 64 * 64]));
    for (i, k) in keys.0.iter_mut().enumerate() {
        *k = 1.0 + i as f32 * 1e-7;
    }
    let queries: [f32; 64 * 3] = std::array::from_fn(|i| 1e-9 * i as f32);
    let (keys, queries) = (std::hint::black_box(keys), std::hint::black_box(queries));
    // (An opaque scalar, not an opaque array: the array would stay in memory, a store per
    // update.)
    let mut a = [_mm512_set1_ps(std::hint::black_box(0.0)); ACC];
    let kp = keys.0.as_ptr();
    for _ in 0..ITERS / 64 {
        for (step, qs) in queries.chunks_exact(3).enumerate() {
            // SAFETY: step < 64 and n < 4, so the load reads keys[step·64 + n·16..][..16],
            // inside the 64 · 64 keys.
            let k: [__m512; 4] =
                std::array::from_fn(|n| unsafe { _mm512_loadu_ps(kp.add(step * 64 + n * 16)) });
            for (r, &qv) in qs.iter().enumerate() {
                let q = _mm512_set1_ps(qv);
                for n in 0..4 {
                    let acc = &mut a[r * 4 + n];
                    *acc = if FMA {
                        _mm512_fmadd_ps(q, k[n], *acc)
                    } else {
                        _mm512_add_ps(*acc, _mm512_mul_ps(q, k[n]))
                    };
                }
            }
        }
    }
    a.iter().map(|&v| _mm512_reduce_add_ps(v) as f64).sum()
}

/// One `vdpbf16ps`: 16 accumulators, 32 bf16 pairs (lane j takes elements 2j and 2j + 1).
fn dpbf16_once(acc: &[f32; 16], a: &[u16; 32], b: &[u16; 32]) -> [f32; 16] {
    assert!(is_x86_feature_detected!("avx512bf16"));
    // SAFETY: the CPU has AVX-512 BF16 (checked above); every load and store is of 64 bytes
    // from or into a 64-byte array.
    unsafe { dpbf16_once_impl(acc, a, b) }
}

#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dpbf16_once_impl(acc: &[f32; 16], a: &[u16; 32], b: &[u16; 32]) -> [f32; 16] {
    let mut out = [0f32; 16];
    // SAFETY: see the caller; `__m512bh` and `__m512i` are both 64 bytes of plain data.
    unsafe {
        let va: __m512bh = std::mem::transmute(_mm512_loadu_si512(a.as_ptr().cast()));
        let vb: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.as_ptr().cast()));
        let r = _mm512_dpbf16_ps(_mm512_loadu_ps(acc.as_ptr()), va, vb);
        _mm512_storeu_ps(out.as_mut_ptr(), r);
    }
    out
}

fn bf16(x: u16) -> f32 {
    f32::from_bits((x as u32) << 16)
}

/// Subnormal → zero of its sign.
fn flush(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// xorshift64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// A bf16 of random sign and mantissa, biased exponent in `lo..lo + span`.
    fn bf16(&mut self, lo: u64, span: u64) -> u16 {
        let r = self.next();
        let exp = (lo + r % span) as u16;
        (((r >> 8) & 1) as u16) << 15 | exp << 7 | ((r >> 16) & 0x7f) as u16
    }
    /// An f32 of random sign and mantissa, biased exponent in `lo..lo + span`.
    fn f32(&mut self, lo: u64, span: u64) -> f32 {
        let r = self.next();
        let exp = (lo + r % span) as u32;
        f32::from_bits(((r >> 8) as u32 & 0x807f_ffff) | exp << 23)
    }
}

/// Scalar models of one lane: `acc`, then the pairs (odd, even) as the SDM lists them.
type Model = fn(f32, (f32, f32), (f32, f32)) -> f32;

const MODELS: [(&str, Model); 6] = [
    (
        "SDM order (odd, then even), f32 products, no flushing",
        |c, (ae, be), (ao, bo)| (c + ao * bo) + ae * be,
    ),
    ("even, then odd", |c, (ae, be), (ao, bo)| {
        (c + ae * be) + ao * bo
    }),
    ("the pair summed first", |c, (ae, be), (ao, bo)| {
        c + (ae * be + ao * bo)
    }),
    ("one rounding at the end", |c, (ae, be), (ao, bo)| {
        (c as f64 + ae as f64 * be as f64 + ao as f64 * bo as f64) as f32
    }),
    (
        "SDM order, f32 products, every value and sum flushed",
        |c, (ae, be), (ao, bo)| flush(flush(flush(c) + flush(ao * bo)) + flush(ae * be)),
    ),
    (
        "SDM order, exact products, accumulator flushed in and after each rounded add",
        |c, (ae, be), (ao, bo)| {
            // Products of two bf16 (8-bit significands) are exact in f64, whatever their size.
            let s = flush((flush(c) as f64 + ao as f64 * bo as f64) as f32);
            flush((s as f64 + ae as f64 * be as f64) as f32)
        },
    ),
];

/// Counts, per model, the lanes where it gives `vdpbf16ps`'s bits.
fn exactness(
    label: &str,
    calls: usize,
    rng: &mut Rng,
    draw: impl Fn(&mut Rng) -> ([f32; 16], [u16; 32], [u16; 32]),
) {
    let mut equal = [0u64; MODELS.len()];
    let mut lanes = 0u64;
    for _ in 0..calls {
        let (acc, a, b) = draw(rng);
        let got = dpbf16_once(&acc, &a, &b);
        for j in 0..16 {
            let even = (bf16(a[2 * j]), bf16(b[2 * j]));
            let odd = (bf16(a[2 * j + 1]), bf16(b[2 * j + 1]));
            for (e, (_, model)) in equal.iter_mut().zip(MODELS) {
                *e += (model(acc[j], even, odd).to_bits() == got[j].to_bits()) as u64;
            }
            lanes += 1;
        }
    }
    println!("{label}: {lanes} lanes; equal to vdpbf16ps, bit for bit:");
    for (e, (name, _)) in equal.iter().zip(MODELS) {
        println!(
            "  {e:>10} ({:6.2} %)  {name}",
            100.0 * *e as f64 / lanes as f64
        );
    }
}

fn main() {
    if !(is_x86_feature_detected!("avx512bf16") && is_x86_feature_detected!("avx512vnni")) {
        eprintln!("this spike needs AVX-512 BF16 and VNNI; this CPU lacks one of them");
        std::process::exit(2);
    }
    // SAFETY: the CPU has AVX-512 F, BF16 and VNNI (checked above), all that these six
    // functions need; their bodies touch registers only, and `tile` its own arrays.
    unsafe {
        rate("vmulps + vaddps", 16, || mul_add());
        rate("vfmadd231ps", 16, || fma());
        rate("tile, mul + add", 16, || tile::<false>());
        rate("tile, FMA", 16, || tile::<true>());
        rate("vdpbf16ps", 32, || dpbf16());
        rate("vpdpbusd", 64, || dpbusd());
    }

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Biased exponents (first, count) of the two bf16 operands and of the accumulators.
    let cases = [
        (
            "normal range (operands 2^-12..2^12, accumulators 2^-17..2^12)",
            2_000_000,
            [(115, 25), (115, 25), (110, 30)],
        ),
        (
            "near underflow (products 2^-193..2^-28, accumulators subnormal or below 2^-123)",
            500_000,
            [(1, 70), (60, 40), (0, 4)],
        ),
    ];
    for (label, calls, [(a_lo, a_n), (b_lo, b_n), (c_lo, c_n)]) in cases {
        exactness(label, calls, &mut rng, |r| {
            let (mut acc, mut a, mut b) = ([0f32; 16], [0u16; 32], [0u16; 32]);
            a.iter_mut().for_each(|v| *v = r.bf16(a_lo, a_n));
            b.iter_mut().for_each(|v| *v = r.bf16(b_lo, b_n));
            acc.iter_mut().for_each(|v| *v = r.f32(c_lo, c_n));
            (acc, a, b)
        });
    }
}
