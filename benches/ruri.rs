//! Criterion benches on the ruri-v3-30m-shaped model (speed does not depend on weight values):
//! tokenization, single-query latency and document throughput, per backend and precision.
//!
//! Needs `testdata/generated/ruri-v3-30m-shape` (`tools/testdata/generate.sh 30m`) and the
//! workload `testdata/generated/bench/` (`tools/bench/make_workload.py`); without them the
//! benches print how to make them and measure nothing. `RURI_BENCH_MODEL` and
//! `RURI_BENCH_WORKLOAD` point elsewhere.
//!
//! ```sh
//! cargo bench --bench ruri                 # everything
//! cargo bench --bench ruri -- ort_int8     # one system
//! ```
// criterion's and proptest's macros generate undocumented public items.
#![allow(missing_docs)]

mod ruri {
    pub mod batch;
    pub mod query;
    pub mod support;
    pub mod tokenize;
}

use criterion::{Criterion, criterion_group, criterion_main};

fn config() -> Criterion {
    // Two shared cores: few, longer samples beat many short ones.
    Criterion::default()
        .sample_size(10)
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(5))
}

criterion_group! {
    name = benches;
    config = config();
    targets = ruri::tokenize::bench, ruri::query::bench, ruri::batch::bench
}
criterion_main!(benches);
