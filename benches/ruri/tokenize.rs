//! Tokenization alone: the 102,400-piece tokenizer on the documents, with the document prompt.

use criterion::{Criterion, Throughput};
use ruri::{Tokenizer, Truncation, prompts};

use super::support::{model_dir, workload};

pub fn bench(c: &mut Criterion) {
    let Some(workload) = workload() else { return };
    let tokenizer: Tokenizer = ruri::ModelDir::open(model_dir())
        .and_then(|dir| dir.tokenizer())
        .expect("the bench model's tokenizer loads");
    let mut group = c.benchmark_group("tokenize");
    group.throughput(Throughput::Elements(workload.documents.len() as u64));
    group.bench_function("documents", |b| {
        b.iter(|| {
            tokenizer
                .encode_batch(prompts::DOCUMENT, &workload.documents, Truncation::Truncate)
                .expect("workload texts tokenize")
        })
    });
    group.finish();
}
