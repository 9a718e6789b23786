//! The Rust side of the side-by-side benchmark (see BENCHMARKS.md and tools/bench/).
//!
//! For each system (backend × precision) it starts **a fresh process** of itself, which loads
//! the model, embeds one query (cold start: exec → first vector, timed from the parent's
//! clock), then measures document throughput over the workload and single-query latency (with
//! `--cold-queries MB`, also with the CPU caches evicted before each query, and with
//! `--concurrent-queries N`, from N threads at once), and
//! reports its peak RSS. One JSON object per system goes to stdout, with the same keys as
//! `tools/bench/python_peers.py`, so `tools/bench/table.py` can put all in one table.
//!
//! ```sh
//! cargo run --release --example compare -- --systems native_int8,fused_int8,ort_int8
//! ```

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use ruri::Embedder;
use ruri::candle::DType;
use ruri::native::EmbeddingTable;
use ruri::ort::{Graph, Int8Activations, Precision};

/// Side-by-side benchmark runner for ruri's backends.
#[derive(Debug, Parser)]
struct Args {
    /// Model folder (default: the ruri-v3-30m-shaped random model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// ONNX file for the ort systems (relative to the model folder, or absolute) instead of
    /// the one their precision finds.
    #[arg(long)]
    onnx_file: Option<PathBuf>,
    /// Workload folder with documents.jsonl and queries.jsonl.
    #[arg(long)]
    workload: Option<PathBuf>,
    /// Comma-separated systems: ort_fp32, ort_int8, ort_fp32_x2, ort_int8_x2 (the folder's
    /// ONNX files; _x2: two single-threaded sessions), fused_fp32, fused_int8, fused_fp32_x2,
    /// fused_int8_x2 (ruri's fused graph from model.safetensors), fused_int8_pertensor
    /// (fused, int8 activations per tensor), native_int8, native_fp32 (ruri's own engine, one
    /// worker per core), native_int8_t1, native_fp32_t1 (one thread), native_int8_plain
    /// (no outlier channels in f32), native_int8_table8, native_fp32_table8 (the token
    /// embeddings held in int8, per row), native_int8_prequant, native_int8_table8_prequant
    /// (native_int8 and native_int8_table8 read from the folder's model.ruri-int8.safetensors,
    /// written by `ruri quantize` with the same embedding table), candle_f32, candle_bf16.
    /// A native system's name followed by `_bf16attn` (native_int8_bf16attn, …) runs
    /// attention's products in bf16 (`AttentionPrecision::Bf16`), by `_int13attn` in 13-bit
    /// integers (`AttentionPrecision::Int13`), by `_f32attn` in f32; without a suffix, the
    /// builder's default (int13 at int8, f32 at fp32).
    #[arg(long, default_value = "native_int8,native_fp32")]
    systems: String,
    /// Timed passes over the documents (the median is reported).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// ONNX Runtime intra-op threads (default: ONNX Runtime's choice).
    #[arg(long)]
    threads: Option<usize>,
    /// Padded-token budget per batch (default: the library's).
    #[arg(long)]
    max_batch_tokens: Option<usize>,
    /// Texts per batch at most (default: the library's).
    #[arg(long)]
    max_batch_size: Option<usize>,
    /// Internal: run one system in this process; the value is the parent's clock at spawn
    /// (seconds since the epoch).
    /// Instead of the workload: embed one document of at least this many tokens (documents
    /// of the workload joined; truncated at the model's maximum length), --repeats times, and
    /// report its time, its token count and the peak RSS.
    #[arg(long)]
    long_text: Option<usize>,
    /// Instead of timing: the cosine of each system's normalized vectors to fused_fp32's
    /// (which equals sentence-transformers within 1e-5) over the first N documents, each
    /// text alone and inside the default batches, and the cosine between the two.
    #[arg(long)]
    agreement: Option<usize>,
    /// Also time each query with cold caches: before it, read a buffer of this many MB (not
    /// timed; 256 is several times the L3 of the machines measured), as a service sees after
    /// other work ran. Adds p50_cold_ms and p99_cold_ms; the peak RSS is taken before the
    /// buffer exists.
    #[arg(long)]
    cold_queries: Option<usize>,
    /// Also embed the queries from this many threads at once on the one embedder (each
    /// thread all 200, from its own starting point, twice): adds concurrent_queries_per_s,
    /// concurrent_p50_ms and concurrent_p99_ms (over every query of every thread).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    concurrent_queries: Option<u16>,
    #[arg(long, hide = true)]
    child_started_at: Option<f64>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn now_epoch() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn read_jsonl(path: &std::path::Path) -> Result<Vec<String>, String> {
    #[derive(serde::Deserialize)]
    struct Line {
        text: String,
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str::<Line>(l)
                .map(|l| l.text)
                .map_err(|e| format!("{} line {}: {e}", path.display(), i + 1))
        })
        .collect()
}

/// Peak resident set (VmHWM) of this process in MB, from /proc.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Percentile in ms with linear interpolation between neighbours (numpy's default, as
/// tools/bench/python_peers.py).
fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let rank = (sorted.len() as f64 - 1.0) * p;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    let (a, b) = (sorted[lo].as_secs_f64(), sorted[hi].as_secs_f64());
    (a + (b - a) * (rank - lo as f64)) * 1e3
}

fn build(system: &str, args: &Args, model: &std::path::Path) -> Result<Box<dyn Embedder>, String> {
    let describe = |e: ruri::Error| ruri::error_chain(&e).to_string();
    use ruri::native::AttentionPrecision;
    let suffixed = [
        ("_bf16attn", AttentionPrecision::Bf16),
        ("_int13attn", AttentionPrecision::Int13),
        ("_f32attn", AttentionPrecision::F32),
    ]
    .into_iter()
    .find_map(|(suffix, a)| Some((system.strip_suffix(suffix)?, suffix, a)));
    let (system, attention) = match suffixed {
        Some((base, _, a)) if base.starts_with("native_") => (base, Some(a)),
        Some((_, suffix, _)) => return Err(format!("{system}: only native systems take {suffix}")),
        None => (system, None),
    };
    let mut batching = ruri::BatchOptions::default();
    if let Some(t) = args.max_batch_tokens {
        batching = batching.max_batch_tokens(t);
    }
    if let Some(n) = args.max_batch_size {
        batching = batching.max_batch_size(n);
    }
    // `sessions`: the pool size; with more than one, each session gets one thread (one
    // session per core, see `ruri::ort::OrtBuilder::sessions`).
    let ort_with = |graph: Graph, precision: Precision, sessions: usize, activations| {
        let mut builder = ruri::ort::builder()
            .graph(graph)
            .precision(precision)
            .int8_activations(activations)
            .sessions(sessions)
            .batching(batching);
        if sessions > 1 {
            builder = builder.intra_threads(1);
        }
        if let Some(file) = &args.onnx_file {
            builder = builder.onnx_file(file);
        }
        if let Some(t) = args.threads {
            builder = builder.intra_threads(t);
        }
        builder
            .build_from_dir(model)
            .map(|e| Box::new(e) as Box<dyn Embedder>)
            .map_err(describe)
    };
    let ort = |graph: Graph, precision: Precision, sessions: usize| {
        ort_with(graph, precision, sessions, Int8Activations::PerRow)
    };
    let candle = |dtype: DType| {
        ruri::candle::builder()
            .dtype(dtype)
            .batching(batching)
            .build_from_dir(model)
            .map(|e| Box::new(e) as Box<dyn Embedder>)
            .map_err(describe)
    };
    let native_file = |precision: ruri::native::Precision,
                       threads: Option<usize>,
                       outliers,
                       table,
                       prequantized| {
        let mut builder = ruri::native::builder()
            .precision(precision)
            .outlier_channels(outliers)
            .embedding_table(table)
            .prequantized(prequantized)
            .batching(batching);
        if let Some(t) = threads.or(args.threads) {
            builder = builder.threads(t);
        }
        if let Some(attention) = attention {
            builder = builder.attention(attention);
        }
        builder
            .build_from_dir(model)
            .map(|e| Box::new(e) as Box<dyn Embedder>)
            .map_err(describe)
    };
    let native_table = |precision, threads, outliers, table| {
        native_file(precision, threads, outliers, table, false)
    };
    let native_with = |precision, threads, outliers| {
        native_table(precision, threads, outliers, EmbeddingTable::F32)
    };
    let native = |precision, threads| native_with(precision, threads, true);
    match system {
        "ort_fp32" => ort(Graph::OnnxFile, Precision::Fp32, 1),
        "ort_int8" => ort(Graph::OnnxFile, Precision::Int8, 1),
        "ort_fp32_x2" => ort(Graph::OnnxFile, Precision::Fp32, 2),
        "ort_int8_x2" => ort(Graph::OnnxFile, Precision::Int8, 2),
        "fused_fp32" => ort(Graph::Fused, Precision::Fp32, 1),
        "fused_int8" => ort(Graph::Fused, Precision::Int8, 1),
        "fused_fp32_x2" => ort(Graph::Fused, Precision::Fp32, 2),
        "fused_int8_x2" => ort(Graph::Fused, Precision::Int8, 2),
        "fused_int8_pertensor" => {
            ort_with(Graph::Fused, Precision::Int8, 1, Int8Activations::PerTensor)
        }
        "native_int8" => native(ruri::native::Precision::Int8, None),
        "native_fp32" => native(ruri::native::Precision::Fp32, None),
        "native_int8_t1" => native(ruri::native::Precision::Int8, Some(1)),
        "native_fp32_t1" => native(ruri::native::Precision::Fp32, Some(1)),
        "native_int8_plain" => native_with(ruri::native::Precision::Int8, None, false),
        "native_int8_table8" => native_table(
            ruri::native::Precision::Int8,
            None,
            true,
            EmbeddingTable::Int8,
        ),
        // ruri's int8 file (`ruri quantize`) of the model folder, with these options.
        "native_int8_prequant" => native_file(
            ruri::native::Precision::Int8,
            None,
            true,
            EmbeddingTable::F32,
            true,
        ),
        "native_int8_table8_prequant" => native_file(
            ruri::native::Precision::Int8,
            None,
            true,
            EmbeddingTable::Int8,
            true,
        ),
        "native_fp32_table8" => native_table(
            ruri::native::Precision::Fp32,
            None,
            true,
            EmbeddingTable::Int8,
        ),
        "candle_f32" => candle(DType::F32),
        "candle_bf16" => candle(DType::BF16),
        other => Err(format!("unknown system {other:?}")),
    }
}

impl Args {
    /// `--model` and `--workload`, or their defaults.
    fn folders(&self) -> (PathBuf, PathBuf) {
        let model = self
            .model
            .clone()
            .unwrap_or_else(|| root().join("testdata/generated/ruri-v3-30m-shape"));
        let workload = self
            .workload
            .clone()
            .unwrap_or_else(|| root().join("testdata/generated/bench"));
        (model, workload)
    }
}

fn child(args: &Args, system: &str, started_at: f64) -> Result<serde_json::Value, String> {
    let (model, workload) = args.folders();
    let queries = read_jsonl(&workload.join("queries.jsonl"))?;
    if queries.is_empty() {
        return Err(format!("{} has no queries", workload.display()));
    }

    let embedder = build(system, args, &model)?;
    embedder
        .embed_query(&queries[0])
        .map_err(|e| e.to_string())?;
    let cold_start_s = now_epoch() - started_at;

    let documents = read_jsonl(&workload.join("documents.jsonl"))?;
    if documents.is_empty() {
        return Err(format!("{} has no documents", workload.display()));
    }
    if let Some(tokens) = args.long_text {
        return long_text(args, system, &*embedder, &documents, tokens, cold_start_s);
    }
    let docs: Vec<&str> = documents.iter().map(String::as_str).collect();
    let warm = embedder.embed_documents(&docs).map_err(|e| e.to_string())?;
    let tokens: usize = warm.token_counts().iter().sum();
    let mut passes: Vec<f64> = (0..args.repeats.max(1))
        .map(|_| {
            let t = Instant::now();
            embedder
                .embed_documents(&docs)
                .map(|_| t.elapsed().as_secs_f64())
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    passes.sort_by(f64::total_cmp);
    let median = passes[passes.len() / 2];

    // One warm-up pass over the queries, then the timed pass (the peers' protocol).
    for q in &queries {
        embedder.embed_query(q).map_err(|e| e.to_string())?;
    }
    let mut latencies: Vec<Duration> = queries
        .iter()
        .map(|q| {
            let t = Instant::now();
            embedder.embed_query(q).map(|_| t.elapsed())
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    latencies.sort();
    let peak_rss = peak_rss_mb();
    let cold = args
        .cold_queries
        .map(|mb| cold_latencies(&*embedder, &queries, mb))
        .transpose()?;
    let concurrent = args
        .concurrent_queries
        .map(|threads| concurrent_latencies(&*embedder, &queries, threads.into()))
        .transpose()?;

    Ok(serde_json::json!({
        "system": format!("ruri {system}"),
        "texts_per_s": docs.len() as f64 / median,
        "tokens_per_s": tokens as f64 / median,
        "p50_ms": percentile(&latencies, 0.5),
        "p99_ms": percentile(&latencies, 0.99),
        "cold_start_s": cold_start_s,
        "peak_rss_mb": peak_rss,
        "p50_cold_ms": cold.as_ref().map(|c| percentile(c, 0.5)),
        "p99_cold_ms": cold.as_ref().map(|c| percentile(c, 0.99)),
        "concurrent_queries_per_s": concurrent.as_ref().map(|c| c.1),
        "concurrent_p50_ms": concurrent.as_ref().map(|c| percentile(&c.0, 0.5)),
        "concurrent_p99_ms": concurrent.as_ref().map(|c| percentile(&c.0, 0.99)),
        "details": {
            "cold_queries_mb": args.cold_queries,
            "concurrent_threads": args.concurrent_queries,
            "documents": docs.len(),
            "document_tokens": tokens,
            "queries": queries.len(),
            "repeats": passes.len(),
            "pass_seconds": passes,
            "threads": args.threads,
            "max_batch_tokens": args.max_batch_tokens,
            "max_batch_size": args.max_batch_size,
            "model": model,
        }
    }))
}

/// `--cold-queries`: each query's latency after reading `mb` MB that evict the caches (the
/// reading is not timed), sorted.
fn cold_latencies(
    embedder: &dyn Embedder,
    queries: &[String],
    mb: usize,
) -> Result<Vec<Duration>, String> {
    let mut buffer = vec![1u64; mb << 17];
    // Written once so that its pages exist (a fresh allocation maps one zero page).
    buffer
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = i as u64);
    let mut sink = 0u64;
    let mut latencies = Vec::with_capacity(queries.len());
    for q in queries {
        // One read a cache line.
        sink = buffer
            .iter()
            .step_by(8)
            .fold(sink, |s, &v| s.wrapping_add(v));
        let t = Instant::now();
        embedder.embed_query(q).map_err(|e| e.to_string())?;
        latencies.push(t.elapsed());
    }
    std::hint::black_box(sink);
    latencies.sort();
    Ok(latencies)
}

/// `--concurrent-queries`: `threads` threads embed every query twice, each from its own
/// starting point, at once; every latency (sorted) and the queries per second of the whole.
fn concurrent_latencies(
    embedder: &dyn Embedder,
    queries: &[String],
    threads: usize,
) -> Result<(Vec<Duration>, f64), String> {
    let start = Instant::now();
    let per_thread: Vec<Result<Vec<Duration>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let from = t * queries.len() / threads;
                    (0..2 * queries.len())
                        .map(|i| {
                            let q = &queries[(from + i) % queries.len()];
                            let started = Instant::now();
                            embedder
                                .embed_query(q)
                                .map(|_| started.elapsed())
                                .map_err(|e| e.to_string())
                        })
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a query thread panicked".into()))
            })
            .collect()
    });
    let wall = start.elapsed().as_secs_f64();
    let mut all = Vec::new();
    for latencies in per_thread {
        all.extend(latencies?);
    }
    all.sort();
    let per_s = all.len() as f64 / wall;
    Ok((all, per_s))
}

/// `--long-text`: one long document, timed `--repeats` times (median), and the peak RSS.
fn long_text(
    args: &Args,
    system: &str,
    embedder: &dyn Embedder,
    documents: &[String],
    tokens: usize,
    cold_start_s: f64,
) -> Result<serde_json::Value, String> {
    // 2.7–3.5 characters a token on this workload: 4 per token overshoots, and the text is
    // truncated to the model's maximum length when that is lower; the count is reported.
    let mut text = String::new();
    for d in documents.iter().cycle() {
        if text.chars().count() >= tokens * 4 {
            break;
        }
        text.push_str(d);
    }
    let mut seconds = Vec::new();
    let mut counted = 0;
    for _ in 0..args.repeats.max(1) {
        let t = Instant::now();
        let out = embedder
            .embed_documents(&[text.as_str()])
            .map_err(|e| e.to_string())?;
        seconds.push(t.elapsed().as_secs_f64());
        counted = out.token_counts()[0];
    }
    seconds.sort_by(f64::total_cmp);
    Ok(serde_json::json!({
        "system": format!("ruri {system}"),
        "long_text_tokens": counted,
        "seconds": seconds[seconds.len() / 2],
        "cold_start_s": cold_start_s,
        "peak_rss_mb": peak_rss_mb(),
        "details": { "pass_seconds": seconds },
    }))
}

/// `--agreement N`: in this process, every system against fused_fp32.
fn agreement(args: &Args, n: usize) -> Result<(), String> {
    let (model, workload) = args.folders();
    let documents = read_jsonl(&workload.join("documents.jsonl"))?;
    let docs: Vec<&str> = documents.iter().take(n).map(String::as_str).collect();
    let alone = |e: &dyn Embedder| -> Result<Vec<Vec<f32>>, String> {
        docs.iter()
            .map(|d| {
                e.embed_documents(&[*d])
                    .map(|v| v.get(0).map(<[f32]>::to_vec).unwrap_or_default())
                    .map_err(|e| e.to_string())
            })
            .collect()
    };
    let batched = |e: &dyn Embedder| -> Result<Vec<Vec<f32>>, String> {
        let v = e.embed_documents(&docs).map_err(|e| e.to_string())?;
        Ok((0..docs.len())
            .map(|i| v.get(i).map(<[f32]>::to_vec).unwrap_or_default())
            .collect())
    };
    let cos = |a: &[f32], b: &[f32]| -> f64 {
        let dot: f64 = a
            .iter()
            .zip(b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        dot / (na * nb)
    };
    let stats = |a: &[Vec<f32>], b: &[Vec<f32>]| -> (f64, f64) {
        let mut c: Vec<f64> = a.iter().zip(b).map(|(x, y)| cos(x, y)).collect();
        c.sort_by(f64::total_cmp);
        (c[0], c[c.len() / 2])
    };
    let reference = alone(&*build("fused_fp32", args, &model)?)?;
    println!(
        "| system | vs fp32 alone: min / median | vs fp32 batched: min / median | batched vs alone: min |"
    );
    println!("|---|---|---|---|");
    for system in args.systems.split(',') {
        let e = build(system, args, &model)?;
        let (a, b) = (alone(&*e)?, batched(&*e)?);
        let (am, amed) = stats(&a, &reference);
        let (bm, bmed) = stats(&b, &reference);
        let (xm, _) = stats(&b, &a);
        println!("| {system} | {am:.5} / {amed:.5} | {bm:.5} / {bmed:.5} | {xm:.6} |");
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(n) = args.agreement {
        return match agreement(&args, n) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(started_at) = args.child_started_at {
        return match child(&args, &args.systems, started_at) {
            Ok(report) => {
                println!("{report}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("error: cannot find this executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut failed = false;
    for system in args
        .systems
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let mut cmd = Command::new(&exe);
        cmd.arg("--systems").arg(system);
        cmd.arg("--repeats").arg(args.repeats.to_string());
        if let Some(m) = &args.model {
            cmd.arg("--model").arg(m);
        }
        if let Some(w) = &args.workload {
            cmd.arg("--workload").arg(w);
        }
        if let Some(f) = &args.onnx_file {
            cmd.arg("--onnx-file").arg(f);
        }
        if let Some(t) = args.threads {
            cmd.arg("--threads").arg(t.to_string());
        }
        if let Some(n) = args.long_text {
            cmd.arg("--long-text").arg(n.to_string());
        }
        if let Some(t) = args.max_batch_tokens {
            cmd.arg("--max-batch-tokens").arg(t.to_string());
        }
        if let Some(n) = args.max_batch_size {
            cmd.arg("--max-batch-size").arg(n.to_string());
        }
        if let Some(mb) = args.cold_queries {
            cmd.arg("--cold-queries").arg(mb.to_string());
        }
        if let Some(threads) = args.concurrent_queries {
            cmd.arg("--concurrent-queries").arg(threads.to_string());
        }
        // The clock is read last, right before exec.
        cmd.arg("--child-started-at")
            .arg(format!("{:.6}", now_epoch()));
        match cmd.output() {
            Ok(out) if out.status.success() => print!("{}", String::from_utf8_lossy(&out.stdout)),
            Ok(out) => {
                eprintln!("{system} failed: {}", String::from_utf8_lossy(&out.stderr));
                failed = true;
            }
            Err(e) => {
                eprintln!("{system}: cannot start: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
