//! Texts per second of the candle backend on the ruri-v3-30m-shaped model (speed does not
//! depend on weight values), per dtype and text length, and dense vs banded local attention
//! on long texts.
//!
//! Needs `testdata/generated/ruri-v3-30m-shape` (`tools/testdata/generate.sh 30m`);
//! `RURI_BENCH_MODEL` points elsewhere; `RURI_BENCH_DEVICE=cuda:0` runs on a GPU (with the
//! `cuda` feature). Without it the bench says how to make it and measures
//! nothing. Build in release (our crate is not optimized in the dev profile):
//!
//! ```sh
//! cargo bench -p ruri-candle --bench throughput                 # everything
//! cargo bench -p ruri-candle --bench throughput -- candle_f32/  # one dtype
//! ```
// The bench and test macros generate undocumented public items.
#![allow(missing_docs)]

use std::path::PathBuf;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ruri_candle::{DType, Device, LocalAttention};
use ruri_core::{BatchOptions, EmbedOptions, Task, TextEmbedder, Truncation};

/// Ordinary Japanese prose, repeated and cut to the wanted token count.
const PROSE: &str = "瑠璃は古くから珍重されてきた青い宝石で、その深い色は夜空にたとえられる。\
    日本では七宝の一つに数えられ、寺院の装飾や仏具にも用いられてきた。\
    現代でも装身具として人気があり、産地によって色合いや模様が少しずつ異なる。";

/// (tokens per text, texts per call): about 2,048 tokens per call for short texts, so the
/// pipeline sends one batch, as a server batching requests would.
const CASES: [(usize, usize); 3] = [(32, 64), (512, 8), (4096, 1)];

fn model_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("RURI_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| ruri_testkit::repo_root().join("testdata/generated/ruri-v3-30m-shape"));
    if dir.join("model.safetensors").is_file() {
        Some(dir)
    } else {
        eprintln!(
            "skipping the candle benches: no model at {} \
             (make it with `tools/testdata/generate.sh 30m`, or set RURI_BENCH_MODEL)",
            dir.display()
        );
        None
    }
}

/// The longest prefix of the repeated prose with at most `tokens` tokens (specials included).
fn text_of(embedder: &TextEmbedder, tokens: usize) -> String {
    let chars: Vec<char> = PROSE.chars().cycle().take(tokens * 4 + 64).collect();
    let count = |n: usize| {
        let text: String = chars[..n].iter().collect();
        embedder
            .tokenizer()
            .encode("", &text, Truncation::Error)
            .map(|e| e.len())
            .unwrap_or(usize::MAX)
    };
    let (mut lo, mut hi) = (0, chars.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if count(mid) <= tokens {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    chars[..lo].iter().collect()
}

fn device() -> Device {
    match std::env::var("RURI_BENCH_DEVICE").ok().as_deref() {
        None | Some("cpu") => Device::Cpu,
        Some(other) => other
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Device::Cuda)
            .unwrap_or_else(|| panic!("RURI_BENCH_DEVICE={other}: expected cpu or cuda:N")),
    }
}

fn build(dir: &PathBuf, dtype: DType, local: LocalAttention) -> TextEmbedder {
    ruri_candle::builder()
        .device(device())
        .dtype(dtype)
        .local_attention(local)
        .batching(BatchOptions::default())
        .build_from_dir(dir)
        .unwrap_or_else(|e| panic!("loading {}: {e}", dir.display()))
}

fn bench_case(
    c: &mut Criterion,
    group: &str,
    embedder: &TextEmbedder,
    tokens: usize,
    texts: usize,
) {
    let text = text_of(embedder, tokens);
    let batch: Vec<&str> = vec![text.as_str(); texts];
    let options = EmbedOptions::new(Task::None);
    let measured = embedder.embed_with(&batch[..1], &options).unwrap();
    eprintln!(
        "{group}/len_{tokens}: {} tokens per text, {texts} texts per call",
        measured.tokens(0).unwrap_or(0)
    );
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(texts as u64));
    g.bench_function(format!("len_{tokens}"), |b| {
        b.iter(|| embedder.embed_with(&batch, &options).unwrap())
    });
    g.finish();
}

fn throughput(c: &mut Criterion) {
    let Some(dir) = model_dir() else { return };
    eprintln!("device: {}", device());
    eprintln!(
        "candle CPU threads: {} (RAYON_NUM_THREADS, else one per logical core)",
        candle_core::utils::get_num_threads()
    );
    for (name, dtype) in [("candle_f32", DType::F32), ("candle_bf16", DType::BF16)] {
        let embedder = build(&dir, dtype, LocalAttention::Auto);
        for (tokens, texts) in CASES {
            bench_case(c, name, &embedder, tokens, texts);
        }
    }
    let dense = build(&dir, DType::F32, LocalAttention::Dense);
    bench_case(c, "candle_f32_dense_local", &dense, 4096, 1);
}

fn config() -> Criterion {
    // Two shared cores: few, longer samples beat many short ones.
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = throughput
}
criterion_main!(benches);
