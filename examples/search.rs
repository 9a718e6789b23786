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

// Shared by several examples, each using part of it: this one has its own default-model
// notice, so `dir_or_tiny` goes unused here.
#[allow(dead_code)]
mod common;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use common::describe;
use ruri::top_k;

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
    #[command(flatten)]
    model_args: ruri::cli::ModelArgs,
}

const EXAMPLE_QUERIES: &[&str] = &[
    "瑠璃色はどんな色？",
    "簡単な朝ごはんを知りたい",
    "地震のときはどうすればいい？",
    "京都への行き方",
];

fn main() -> ExitCode {
    common::exit_code(run(Args::parse()))
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
        .model_args
        .model
        .clone()
        .unwrap_or_else(common::tiny_model_dir);
    let embedder = common::load(&args.model_args, &model, None)?;
    if args.model_args.model.is_none() {
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
        let hits = top_k(vector, &index, args.top_k).map_err(|e| describe(&e))?;
        for (rank, (i, score)) in hits.into_iter().enumerate() {
            println!("  {}. {score:.4}  {}", rank + 1, docs[i]);
        }
    }
    Ok(())
}
