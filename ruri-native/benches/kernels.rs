#![allow(missing_docs)] // criterion_group! generates an undocumented function
//! The int8 GEMM kernels (and the fp32 GEMM) on the linears of the 30m shape (M = 900 token rows, about one
//! 32-document batch of the workload) and on a square shape, in multiply-adds per second
//! (`Throughput::Elements` counts MACs), on every kernel this CPU runs (on AVX-512 CPUs that
//! includes `avx512vnni256`, the AVX-VNNI kernel's source in its EVEX encoding).
//! `cargo bench -p ruri-native --bench kernels`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ruri_native::Kernel;
use ruri_native::bench::{Fp32Gemm, Gemm};

fn kernels(c: &mut Criterion) {
    // (name, M, N, K): Wqkv, attention Wo, Wi, MLP Wo of ruri-v3-30m; one query; a square.
    let shapes = [
        ("wqkv", 900, 768, 256),
        ("attn_wo", 900, 256, 256),
        ("wi", 900, 2048, 256),
        ("mlp_wo", 900, 256, 1024),
        ("wi_query", 28, 2048, 256),
        ("square", 1024, 1024, 1024),
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
}

criterion_group!(benches, kernels);
criterion_main!(benches);
