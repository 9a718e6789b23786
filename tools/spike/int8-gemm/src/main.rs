//! rten-gemm u8 × i8 → i32 (and f32 × f32 for reference) on ruri-v3-30m's four linear
//! shapes, with prepacked weights, at M = 700 and M = 10 rows, on 1 and 2 threads. Prints one
//! JSON line per case: the median of `reps` timed calls after warm-up, in microseconds.
//!
//!     cargo run --release -- [reps]

use std::time::Instant;

use rten_gemm::{GemmExecutor, GemmInputA, GemmInputB, GemmOptions, QuantParams};
use rten_tensor::NdTensorView;

fn median_us(reps: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..reps.div_ceil(10).max(3) {
        f();
    }
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let shapes = [(256, 768), (256, 256), (256, 2048), (1024, 256)];
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            for &(k, n) in &shapes {
                // 7-bit weights (what ruri's fused graph uses), u8 activations.
                let w: Vec<i8> = (0..k * n).map(|_| (next() % 127) as i8 - 63).collect();
                let wf: Vec<f32> = w.iter().map(|&v| f32::from(v) * 0.01).collect();
                for m in [700usize, 10] {
                    let a: Vec<u8> = (0..m * k).map(|_| (next() % 255) as u8 + 1).collect();
                    let af: Vec<f32> = a.iter().map(|&v| (f32::from(v) - 128.0) * 0.01).collect();
                    let zp_a = vec![128u8; m];
                    let zp_b = vec![0i8; n];
                    let q = GemmExecutor::<u8, i8, i32>::default();
                    let packed = q.prepack_b(NdTensorView::from_data([k, n], w.as_slice()));
                    let mut out = vec![0i32; m * n];
                    let int8 = median_us(reps, || {
                        q.gemm(
                            &mut out,
                            GemmInputA::Unpacked(NdTensorView::from_data([m, k], a.as_slice())),
                            GemmInputB::Packed(&packed),
                            GemmOptions {
                                a_quant: Some(QuantParams { zero_point: &zp_a }),
                                b_quant: Some(QuantParams { zero_point: &zp_b }),
                                ..Default::default()
                            },
                        )
                        .unwrap();
                    });
                    let f = GemmExecutor::<f32, f32, f32>::default();
                    let packed_f = f.prepack_b(NdTensorView::from_data([k, n], wf.as_slice()));
                    let mut outf = vec![0f32; m * n];
                    let fp32 = median_us(reps, || {
                        f.gemm(
                            &mut outf,
                            GemmInputA::Unpacked(NdTensorView::from_data([m, k], af.as_slice())),
                            GemmInputB::Packed(&packed_f),
                            GemmOptions::default(),
                        )
                        .unwrap();
                    });
                    println!(
                        "{{\"engine\":\"rten-gemm\",\"kernel\":\"{}\",\"may_saturate\":{},\"k\":{k},\"n\":{n},\"m\":{m},\"threads\":{threads},\"int8_us\":{int8:.1},\"fp32_us\":{fp32:.1}}}",
                        q.kernel_name(),
                        q.may_saturate()
                    );
                }
            }
        });
    }
}
