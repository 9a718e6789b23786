//! Throughput over all workload documents in one call (length-sorted token-budget batches).

use criterion::{Criterion, Throughput};

use super::support::{SYSTEMS, workload};

pub fn bench(c: &mut Criterion) {
    let Some(workload) = workload() else { return };
    let texts: Vec<&str> = workload.documents.iter().map(String::as_str).collect();
    let mut group = c.benchmark_group("documents");
    group.throughput(Throughput::Elements(texts.len() as u64));
    for system in SYSTEMS {
        let embedder = (system.build)();
        group.bench_function(format!("{}/all_{}", system.name, texts.len()), |b| {
            b.iter(|| embedder.embed_documents(&texts).expect("documents embed"))
        });
    }
    group.finish();
}
