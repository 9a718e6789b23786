//! Semantic search in memory: embeds documents with the document prompt (`"検索文書: "`),
//! each query with the query prompt (`"検索クエリ: "`), and prints the closest documents by
//! cosine similarity.
//!
//! ```sh
//! cargo run --release --example search -- --model path/to/ruri-v3-30m "瑠璃色はどんな色？"
//! cargo run --release --example search -- --docs my_docs.txt --top-k 5 "質問1" "質問2"
//! ```
//!
//! Documents come from `--docs FILE` (one per line, blank lines skipped), by default from
//! `examples/data/search_docs.txt`: 95 short, varied Japanese sentences written for this
//! example. Queries are the positional arguments, or a few built-in ones. With the default
//! tiny random-weight test model the ranking is meaningless; point `--model` at a real Ruri v3
//! folder for real results.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use ruri::candle::{CandleEmbedder, DType};
use ruri::ort::{OrtEmbedder, Precision as OrtPrecision};
use ruri::{Embedder, top_k};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BackendArg {
    /// ONNX Runtime (fp32, int8).
    Ort,
    /// candle on the CPU (fp32, bf16).
    Candle,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Precision {
    Fp32,
    Int8,
    Bf16,
}

/// Search Japanese documents by meaning with a Ruri v3 model.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Queries (default: a few examples).
    queries: Vec<String>,
    /// Documents, one per line (default: examples/data/search_docs.txt).
    #[arg(long)]
    docs: Option<PathBuf>,
    /// Index only the first N documents.
    #[arg(long)]
    limit: Option<usize>,
    /// Documents shown per query.
    #[arg(long, default_value_t = 3)]
    top_k: usize,
    /// Model folder (sentence-transformers layout with onnx/, or an ONNX port). Default: the
    /// committed tiny random-weight test model.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Inference backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Ort)]
    backend: BackendArg,
    /// Weights precision.
    #[arg(long, value_enum, default_value_t = Precision::Fp32)]
    precision: Precision,
}

const EXAMPLE_QUERIES: &[&str] = &[
    "瑠璃色はどんな色？",
    "簡単な朝ごはんを知りたい",
    "地震のときはどうすればいい？",
    "京都への行き方",
];

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Formats an error with its chain of causes.
fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

fn run(args: Args) -> Result<(), String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let docs_file = args
        .docs
        .clone()
        .unwrap_or_else(|| root.join("examples/data/search_docs.txt"));
    let text = std::fs::read_to_string(&docs_file)
        .map_err(|e| format!("cannot read {}: {e}", docs_file.display()))?;
    let docs: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .take(args.limit.unwrap_or(usize::MAX))
        .collect();
    if docs.is_empty() {
        return Err(format!("no documents in {}", docs_file.display()));
    }

    let model = args
        .model
        .clone()
        .unwrap_or_else(|| root.join("testdata/tiny"));
    let embedder = load(&args, &model).map_err(|e| describe(&e))?;
    if args.model.is_none() {
        println!(
            "note: no --model given; {} is a random-weight TEST model, so these rankings mean nothing",
            model.display()
        );
    }

    let started = Instant::now();
    let index = embedder.embed_documents(&docs).map_err(|e| describe(&e))?;
    let truncated = index.truncated_flags().iter().filter(|&&t| t).count();
    println!(
        "indexed {} documents from {} in {:.0} ms ({} dimensions{})",
        index.len(),
        docs_file.display(),
        started.elapsed().as_secs_f64() * 1e3,
        index.dim(),
        if truncated > 0 {
            format!(", {truncated} truncated to the model's maximum length")
        } else {
            String::new()
        }
    );

    let queries: Vec<&str> = if args.queries.is_empty() {
        EXAMPLE_QUERIES.to_vec()
    } else {
        args.queries.iter().map(String::as_str).collect()
    };
    let vectors = embedder.embed_queries(&queries).map_err(|e| describe(&e))?;
    for (query, vector) in queries.iter().zip(vectors.iter()) {
        println!("\n{query}");
        for (rank, (i, score)) in top_k(vector, &index, args.top_k).into_iter().enumerate() {
            println!("  {}. {score:.4}  {}", rank + 1, docs[i]);
        }
    }
    Ok(())
}

fn load(args: &Args, model: &std::path::Path) -> ruri::Result<Box<dyn Embedder>> {
    Ok(match (args.backend, args.precision) {
        (BackendArg::Ort, Precision::Fp32 | Precision::Int8) => {
            let precision = match args.precision {
                Precision::Int8 => OrtPrecision::Int8,
                _ => OrtPrecision::Fp32,
            };
            Box::new(
                OrtEmbedder::builder()
                    .precision(precision)
                    .build_from_dir(model)?,
            )
        }
        (BackendArg::Candle, Precision::Fp32 | Precision::Bf16) => {
            let dtype = match args.precision {
                Precision::Bf16 => DType::BF16,
                _ => DType::F32,
            };
            Box::new(
                CandleEmbedder::builder()
                    .dtype(dtype)
                    .build_from_dir(model)?,
            )
        }
        (BackendArg::Ort, Precision::Bf16) => {
            return Err(ruri::Error::InvalidOption {
                name: "--precision",
                value: "bf16".into(),
                reason: "bf16 needs --backend candle",
            });
        }
        (BackendArg::Candle, Precision::Int8) => {
            return Err(ruri::Error::InvalidOption {
                name: "--precision",
                value: "int8".into(),
                reason: "int8 needs --backend ort (an int8 ONNX file)",
            });
        }
    })
}
