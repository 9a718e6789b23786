//! Every real Ruri v3 shape (30m, 70m, 130m, 310m: hidden 256/384/512/768, 4/6/8/12 heads,
//! intermediate 1024/1536/2048/3072) loads on both backends and matches sentence-transformers
//! at fp32, with random weights rebuilt from a PRNG recipe (`testdata/shapes/`, see its
//! README.md): each input alone and all of them in one padded batch.
//!
//! By default the committed CI-depth models (4 layers: global attention on 0 and 3) run.
//! `RURI_SHAPES_FULL=testdata/generated/shapes-full` runs the full-depth ones (10/13/19/25
//! layers) that `tools/testdata/generate_shapes.sh --full` makes; use a release build for them.
//! Print the figures with `cargo test --test shapes -- --nocapture`.

use ruri::TextEmbedder;
use std::path::Path;
use std::time::Instant;

use ruri::candle::{DType, Device};
use ruri::ort::Precision;
use ruri::{BatchOptions, EmbedOptions, Embedder, Task};
use ruri_testkit::Agreement;
use ruri_testkit::shapes::{ShapeItem, ShapeReference, ShapeSet};

/// The fp32 tolerance of tests/parity.rs: the same math as torch, only summation order
/// differs.
const MIN_COSINE: f64 = 0.99999;
const MAX_ABS_DIFF: f64 = 1e-5;

fn task_of(item: &ShapeItem) -> Task {
    match item.prompt_name.as_str() {
        "" => Task::None,
        "query" => Task::Query,
        "document" => Task::Document,
        "topic" => Task::Topic,
        other => Task::Named(other.to_owned()),
    }
}

/// Everything in one batch, whatever its length.
fn one_batch() -> BatchOptions {
    BatchOptions::default()
        .max_batch_tokens(usize::MAX / 2)
        .max_batch_size(usize::MAX / 2)
        .max_batch_attention(usize::MAX / 2)
}

/// Normalized vectors and token counts of each item alone (with its task), then of all items
/// in one call (prompts written into the texts, so they share one padded batch).
fn embed_both_ways(embedder: &dyn Embedder, items: &[ShapeItem]) -> [Vec<(Vec<f32>, usize)>; 2] {
    let alone = items
        .iter()
        .map(|item| {
            let e = embedder
                .embed_with(
                    &[item.text.as_str()],
                    &EmbedOptions::new(task_of(item)).normalize(true),
                )
                .unwrap();
            (e.get(0).unwrap().to_vec(), e.tokens(0).unwrap())
        })
        .collect();
    let texts: Vec<String> = items
        .iter()
        .map(|i| format!("{}{}", i.prompt, i.text))
        .collect();
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let e = embedder
        .embed_with(&texts, &EmbedOptions::new(Task::None).normalize(true))
        .unwrap();
    let together = (0..items.len())
        .map(|i| (e.get(i).unwrap().to_vec(), e.tokens(i).unwrap()))
        .collect();
    [alone, together]
}

fn check_backend(size: &str, backend: &str, embedder: &dyn Embedder, reference: &ShapeReference) {
    assert_eq!(embedder.dim(), reference.dim, "{size} {backend}: dim");
    let start = Instant::now();
    let [alone, together] = embed_both_ways(embedder, &reference.items);
    let elapsed = start.elapsed();
    for (how, outputs) in [("alone", &alone), ("one batch", &together)] {
        let mut agreement = Agreement::new();
        for ((vector, tokens), item) in outputs.iter().zip(&reference.items) {
            assert_eq!(
                *tokens,
                item.token_ids.len(),
                "{size} {backend} {how}: token count of {}",
                item.id
            );
            agreement.add(vector, &item.st_fp32.normalized);
        }
        eprintln!(
            "{size} ({} layers) {backend} {how}: min cosine 1 − {:.1e}, max |Δ| {:.3e}",
            reference.num_hidden_layers,
            1.0 - agreement.min_cosine,
            agreement.max_abs_diff
        );
        assert!(
            agreement.min_cosine >= MIN_COSINE && agreement.max_abs_diff <= MAX_ABS_DIFF,
            "{size} {backend} {how} vs sentence-transformers fp32: min cosine {}, max |Δ| {}",
            agreement.min_cosine,
            agreement.max_abs_diff
        );
    }
    eprintln!(
        "{size} ({} layers) {backend}: embedding took {:.2} s",
        reference.num_hidden_layers,
        elapsed.as_secs_f64()
    );
}

fn ort(dir: &Path, graph: ruri::ort::Graph) -> TextEmbedder {
    ruri::ort::builder()
        .graph(graph)
        .precision(Precision::Fp32)
        .batching(one_batch())
        .build_from_dir(dir)
        .unwrap_or_else(|e| panic!("building ort fp32 from {}: {e:?}", dir.display()))
}

fn candle(dir: &Path) -> TextEmbedder {
    ruri::candle::builder()
        .device(Device::Cpu)
        .dtype(DType::F32)
        .batching(one_batch())
        .build_from_dir(dir)
        .unwrap_or_else(|e| panic!("building candle f32 from {}: {e:?}", dir.display()))
}

/// The published shapes (hidden, heads, intermediate, layers at full depth), so that a recipe
/// of another shape cannot pass for one of these.
fn real_shape(size: &str) -> [u64; 4] {
    match size {
        "30m" => [256, 4, 1024, 10],
        "70m" => [384, 6, 1536, 13],
        "130m" => [512, 8, 2048, 19],
        "310m" => [768, 12, 3072, 25],
        other => panic!("no Ruri v3 size {other}"),
    }
}

fn run_size(size: &str) {
    let set = ShapeSet::from_env();
    let reference = set.reference(size);
    assert_eq!(reference.size, size);
    let start = Instant::now();
    let dir = set.materialize(size);
    eprintln!(
        "{size} ({} layers): folder materialized in {:.2} s",
        reference.num_hidden_layers,
        start.elapsed().as_secs_f64()
    );
    let config: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("config.json")).expect("config.json"),
    )
    .expect("valid config.json");
    let key = |k: &str| {
        config[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{size}: no {k}"))
    };
    let [hidden, heads, intermediate, layers] = real_shape(size);
    assert_eq!(
        [
            key("hidden_size"),
            key("num_attention_heads"),
            key("intermediate_size"),
        ],
        [hidden, heads, intermediate],
        "{size}: not the published shape"
    );
    for (k, want) in [
        ("global_attn_every_n_layers", 3.0),
        ("local_attention", 128.0),
        ("global_rope_theta", 160_000.0),
        ("local_rope_theta", 10_000.0),
        ("max_position_embeddings", 8192.0),
    ] {
        assert_eq!(config[k].as_f64(), Some(want), "{size}: {k}");
    }
    let depth = if set.full { layers } else { 4 };
    assert_eq!(key("num_hidden_layers"), depth, "{size}: depth");
    assert_eq!(
        reference.num_hidden_layers as u64, depth,
        "{size}: references from another depth"
    );
    assert_eq!(reference.dim as u64, hidden, "{size}: reference width");

    for (graph, name) in [
        (ruri::ort::Graph::OnnxFile, "ort fp32 (ONNX file)"),
        (
            ruri::ort::Graph::Fused,
            "ort fused fp32 (from model.safetensors)",
        ),
    ] {
        let start = Instant::now();
        let embedder = ort(dir.path(), graph);
        eprintln!(
            "{size} {name}: loaded in {:.2} s",
            start.elapsed().as_secs_f64()
        );
        check_backend(size, name, &embedder, &reference);
    }

    let start = Instant::now();
    let embedder = candle(dir.path());
    eprintln!(
        "{size} candle cpu f32: loaded in {:.2} s",
        start.elapsed().as_secs_f64()
    );
    check_backend(size, "candle cpu f32", &embedder, &reference);
}

#[test]
fn shape_30m() {
    run_size("30m");
}

#[test]
fn shape_70m() {
    run_size("70m");
}

#[test]
fn shape_130m() {
    run_size("130m");
}

#[test]
fn shape_310m() {
    run_size("310m");
}
