//! Latency of one short query, embedded alone (the search path of a service).

use criterion::{Criterion, Throughput};

use super::support::{SYSTEMS, workload};

pub fn bench(c: &mut Criterion) {
    let Some(workload) = workload() else { return };
    let mut group = c.benchmark_group("query");
    group.throughput(Throughput::Elements(1));
    for system in SYSTEMS {
        let embedder = (system.build)();
        let mut next = workload.queries.iter().cycle();
        group.bench_function(format!("{}/single", system.name), |b| {
            b.iter(|| {
                let query = next.next().expect("cycle never ends");
                embedder.embed_query(query).expect("queries embed")
            })
        });
    }
    group.finish();
}
