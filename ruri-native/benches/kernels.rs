#![allow(missing_docs)] // criterion_group! generates an undocumented function
//! The int8 GEMM kernels (and the fp32 GEMM: `fp32_gemm` the version this CPU picks,
//! `fp32_gemm_avx2` and `fp32_gemm_base` each narrower one it also runs) on the linears of the
//! 30m and 310m shapes (M = 900 token rows, about one
//! 32-document batch of the workload; and the 64- and 96-row chunks the engine multiplies at
//! a time) and on a square shape, in multiply-adds per second
//! (`Throughput::Elements` counts MACs), on every kernel this CPU runs (on AVX-512 CPUs that
//! includes `avx512vnni256`, the AVX-VNNI kernel's source in its EVEX encoding); and the
//! MLP's GeGLU on one 64-row chunk of the 30m shape's 1,024 intermediate channels, in values
//! per second; one text's attention (every head of the 30m shape, tokens per second) and the
//! quantization of int8 inputs and the LayerNorm of a layer's rows (values per second).
//! `cargo bench -p ruri-native --bench kernels`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ruri_native::bench::{Attention, Fp32Gemm, Gemm, geglu, layer_norm_rows, quantize_rows};
use ruri_native::{AttentionPrecision, Kernel};

fn kernels(c: &mut Criterion) {
    // (name, M, N, K): Wqkv, attention Wo, Wi, MLP Wo of ruri-v3-30m; one query; a square;
    // the engine's chunks (MLP_CHUNK = 64 rows of Wi and MLP Wo, ROW_CHUNK = 96 of Wqkv).
    let shapes = [
        ("wqkv", 900, 768, 256),
        ("attn_wo", 900, 256, 256),
        ("wi", 900, 2048, 256),
        ("mlp_wo", 900, 256, 1024),
        ("wi_query", 28, 2048, 256),
        ("square", 1024, 1024, 1024),
        ("wi_64", 64, 2048, 256),
        ("mlp_wo_64", 64, 256, 1024),
        ("wqkv_96", 96, 768, 256),
        // The 310m shape's layers (hidden 768, intermediate 3,072), and its MLP's chunks.
        ("wqkv_310m", 900, 2304, 768),
        ("attn_wo_310m", 900, 768, 768),
        ("wi_310m", 900, 6144, 768),
        ("mlp_wo_310m", 900, 768, 3072),
        ("wi_310m_64", 64, 6144, 768),
        ("mlp_wo_310m_64", 64, 768, 3072),
    ];
    for kernel in Kernel::available() {
        let mut group = c.benchmark_group(format!("int8_gemm/{kernel}"));
        for (name, m, n, k) in shapes {
            let mut gemm = Gemm::new(kernel, m, n, k);
            group.throughput(Throughput::Elements((m * n * k) as u64));
            group.bench_function(name, |b| b.iter(|| std::hint::black_box(gemm.run())));
        }
        group.finish();
    }
    let mut group = c.benchmark_group("fp32_gemm");
    for (name, m, n, k) in shapes {
        let mut gemm = Fp32Gemm::new(m, n, k);
        group.throughput(Throughput::Elements((m * n * k) as u64));
        group.bench_function(name, |b| b.iter(|| std::hint::black_box(gemm.run())));
    }
    group.finish();
    // Each narrower version this CPU also runs (the AVX2 one on an AVX-512 CPU, say).
    for isa in ["avx2", "base"] {
        if Fp32Gemm::new(1, 1, 1).run_isa(isa).is_none() {
            continue;
        }
        let mut group = c.benchmark_group(format!("fp32_gemm_{isa}"));
        for (name, m, n, k) in shapes {
            let mut gemm = Fp32Gemm::new(m, n, k);
            group.throughput(Throughput::Elements((m * n * k) as u64));
            group.bench_function(name, |b| b.iter(|| std::hint::black_box(gemm.run_isa(isa))));
        }
        group.finish();
    }
    // GeGLU: inputs spread over the range the erf sees (GELU's argument in [−6, 6]).
    let len = 64 * 1024;
    let value = |i: usize| ((i.wrapping_mul(2_654_435_761) >> 7) % 4801) as f32 / 400.0 - 6.0;
    let input: Vec<f32> = (0..len).map(value).collect();
    let gate: Vec<f32> = (0..len).map(|i| value(i + 17) / 6.0).collect();
    let mut out = vec![0.0f32; len];
    let mut group = c.benchmark_group("geglu");
    group.throughput(Throughput::Elements(len as u64));
    group.bench_function("mlp_chunk", |b| {
        b.iter(|| {
            geglu(&input, &gate, &mut out);
            std::hint::black_box(out[len / 3])
        })
    });
    group.finish();
    // Attention of one text, all 4 heads of the 30m shape (d = 64): the workload's median
    // document (23 tokens), a query-sized one, one at the key group's edge, and a long
    // one (the global layers' quadratic work).
    let mut group = c.benchmark_group("attention");
    for len in [12, 23, 48, 2048] {
        let mut attention = Attention::new(len, 4, 64);
        group.throughput(Throughput::Elements(len as u64));
        group.bench_function(format!("text_{len}"), |b| {
            b.iter(|| std::hint::black_box(attention.run()))
        });
    }
    // bf16 attention (`AttentionPrecision::Bf16`): what this CPU detects, and each place
    // it can run the products (`bf16_portable`, the loops CPUs without the instructions run;
    // `bf16_vdpbf16ps`, AVX-512 BF16's tiles; `bf16_fma`, AVX-512F's FMA tiles;
    // `bf16_avx2_fma`, AVX2's).
    for len in [23, 2048] {
        let detected = Attention::with_precision(len, 4, 64, AttentionPrecision::Bf16);
        let variants = Attention::bf16_variants(len, 4, 64)
            .into_iter()
            .map(|(name, a)| (format!("bf16_{name}"), a));
        for (name, mut attention) in std::iter::once(("bf16".to_string(), detected)).chain(variants)
        {
            group.throughput(Throughput::Elements(len as u64));
            group.bench_function(format!("text_{len}_{name}"), |b| {
                b.iter(|| std::hint::black_box(attention.run()))
            });
        }
    }
    // int13 attention (`AttentionPrecision::Int13`): each place it can run its products
    // (`int13_portable`, the loops CPUs without the instructions run; `int13_avx512vnni`,
    // the `vpdpwssd` tiles), also on a query-sized text.
    for len in [12, 23, 2048] {
        for (name, mut attention) in Attention::int13_variants(len, 4, 64) {
            group.throughput(Throughput::Elements(len as u64));
            group.bench_function(format!("text_{len}_int13_{name}"), |b| {
                b.iter(|| std::hint::black_box(attention.run()))
            });
        }
    }
    group.finish();
    // Staging int8 inputs: 64 rows of the hidden width (Wqkv, attention Wo, Wi) and of the
    // intermediate width (MLP Wo), in values per second.
    let mut group = c.benchmark_group("quantize");
    for k in [256, 1024] {
        let x: Vec<f32> = (0..64 * k).map(|i| value(i * 3 + 1)).collect();
        let mut q = vec![0i8; 64 * k];
        group.throughput(Throughput::Elements((64 * k) as u64));
        group.bench_function(format!("rows_64x{k}"), |b| {
            b.iter(|| std::hint::black_box(quantize_rows(&x, k, &mut q)))
        });
    }
    group.finish();
    // LayerNorm of 64 rows of the hidden width of the 30m and 310m shapes (every layer
    // norms its rows twice), in values per second.
    let mut group = c.benchmark_group("layer_norm");
    for k in [256, 768] {
        let x: Vec<f32> = (0..64 * k).map(|i| value(i * 5 + 2)).collect();
        let weight: Vec<f32> = (0..k).map(|i| 1.0 + value(i) / 8.0).collect();
        let mut out = vec![0.0f32; 64 * k];
        group.throughput(Throughput::Elements((64 * k) as u64));
        group.bench_function(format!("rows_64x{k}"), |b| {
            b.iter(|| std::hint::black_box(layer_norm_rows(&x, &weight, &mut out)))
        });
    }
    group.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
