//! The x86 side of ruri-wasm's parity test: the native int8 engine's vector (with ruri-wasm's
//! default options: the token-embedding table in int8) for each item of a
//! reference file (`testdata/generated/reference/ruri-v3-30m-shape.json`, written by
//! `tools/testdata/generate.sh 30m`), each text alone with its prompt, on one thread; and the
//! same engine's speed on the benchmark workload (`testdata/generated/bench/`: its 200 queries
//! one at a time, then its first 512 documents in one call), for BENCHMARKS.md's comparison
//! with ruri-wasm's `tests/bench.mjs`. `tools/wasm/test.sh` runs it:
//!
//! ```text
//! cargo run --release -p ruri-native --example wasm_reference -- MODEL_DIR REFERENCE.json OUT.json [WORKLOAD_DIR]
//! ```
//!
//! OUT.json: `{"kernel", "attention_default", "items": [{"id", "vector"}], "attention":
//! {"f32": [{"id", "vector"}], "int13": […], "bf16": […]}, "query_ms": {"p50", "p99",
//! "runs"}, "documents_per_s"}` (`items`: the builder's default attention, int13 at int8,
//! named by `attention_default`; then the vectors with each attention precision stated; the
//! speed only with a workload, at the default).

use std::time::Instant;

use ruri_core::{EmbedOptions, Task};
use ruri_native::{AttentionPrecision, EmbeddingTable, Precision};
use serde_json::{Value, json};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (model, reference, out, workload) = match args.as_slice() {
        [m, r, o] => (m, r, o, None),
        [m, r, o, w] => (m, r, o, Some(std::path::Path::new(w))),
        _ => {
            return Err(
                "usage: wasm_reference MODEL_DIR REFERENCE.json OUT.json [WORKLOAD_DIR]".into(),
            );
        }
    };
    let reference: Value = serde_json::from_slice(&std::fs::read(reference)?)?;
    let items = reference["items"]
        .as_array()
        .ok_or("no items in the reference")?;
    // ruri-wasm's defaults: int8, the token-embedding table in int8 per row, the builder's
    // default attention; then each attention precision stated.
    let builder = ruri_native::builder()
        .precision(Precision::Int8)
        .embedding_table(EmbeddingTable::Int8)
        .threads(1);
    let build = |attention| builder.clone().attention(attention).build_from_dir(model);
    let vectors =
        |embedder: &ruri_core::TextEmbedder| -> Result<Vec<Value>, Box<dyn std::error::Error>> {
            let mut vectors = Vec::new();
            for item in items {
                let text = item["text"].as_str().ok_or("an item without text")?;
                let task = match item["prompt_name"].as_str().unwrap_or("") {
                    "" => Task::None,
                    "query" => Task::Query,
                    "document" => Task::Document,
                    "topic" => Task::Topic,
                    other => Task::Named(other.to_owned()),
                };
                let out = embedder.embed_with(&[text], &EmbedOptions::new(task))?;
                vectors.push(json!({ "id": item["id"], "vector": out.get(0).ok_or("no vector")? }));
            }
            Ok(vectors)
        };
    let embedder = builder.clone().build_from_dir(model)?;
    let kernel = ruri_native::Kernel::from_env()?;
    let default = embedder
        .backend_as::<ruri_native::NativeBackend>()
        .ok_or("not the native backend")?
        .attention();
    let mut report = json!({
        "kernel": kernel.name(),
        "attention_default": default.to_string(),
        "items": vectors(&embedder)?,
    });
    for (name, attention) in [
        ("f32", AttentionPrecision::F32),
        ("int13", AttentionPrecision::Int13),
        ("bf16", AttentionPrecision::Bf16),
    ] {
        report["attention"][name] = json!(vectors(&build(attention)?)?);
    }
    if let Some(dir) = workload {
        let texts = |file: &str| -> Result<Vec<String>, Box<dyn std::error::Error>> {
            std::fs::read_to_string(dir.join(file))?
                .lines()
                .map(|l| {
                    let v: Value = serde_json::from_str(l)?;
                    Ok(v["text"].as_str().ok_or("a line without text")?.to_owned())
                })
                .collect()
        };
        let queries = texts("queries.jsonl")?;
        let documents: Vec<String> = texts("documents.jsonl")?.into_iter().take(512).collect();
        for q in queries.iter().take(20) {
            embedder.embed_query(q)?;
        }
        let mut times = Vec::new();
        for q in &queries {
            let start = Instant::now();
            embedder.embed_query(q)?;
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        let at = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize];
        let start = Instant::now();
        embedder.embed_documents(&documents)?;
        let per_s = documents.len() as f64 / start.elapsed().as_secs_f64();
        report["query_ms"] = json!({ "p50": at(0.5), "p99": at(0.99), "runs": times.len() });
        report["documents_per_s"] = json!(per_s);
        println!(
            "x86 native int8 ({}), one thread: query p50 {:.3} ms, p99 {:.3} ms; {:.1} documents/s",
            kernel.name(),
            at(0.5),
            at(0.99),
            per_s
        );
    }
    std::fs::write(out, serde_json::to_vec(&report)?)?;
    Ok(())
}
