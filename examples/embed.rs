//! Embeds text from stdin, one JSON line per input, in input order.
//!
//! ```sh
//! echo "瑠璃色はどんな色？" | cargo run --release --example embed -- --task query
//! ```
//!
//! Each stdin line is one text (or, with `--jsonl`, a JSON object with a `"text"` field).
//! Output lines are `{"embedding": [...], "tokens": n, "truncated": bool}`, plus
//! `"token_ids"` with `--print-token-ids`. Input is read and embedded in chunks, so memory
//! stays bounded however long stdin is.

mod common;

use std::io::{self, BufRead, BufWriter, IsTerminal, Write};
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use common::describe;
use ruri::{EmbedOptions, Error, Task, TextEmbedder, Truncation};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TaskArg {
    /// "検索クエリ: "
    Query,
    /// "検索文書: "
    Document,
    /// "トピック: "
    Topic,
    /// No prompt.
    None,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TruncateArg {
    /// Keep the first tokens and `</s>`, flag the item (sentence-transformers' behaviour).
    Truncate,
    /// Stop with an error naming the line.
    Error,
}

/// Embed Japanese text with a Ruri v3 model.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    model_args: ruri::cli::ModelArgs,
    /// Prompt to prepend.
    #[arg(long, value_enum, default_value_t = TaskArg::None)]
    task: TaskArg,
    /// Policy for texts longer than the model's maximum length.
    #[arg(long, value_enum, default_value_t = TruncateArg::Truncate)]
    truncate: TruncateArg,
    /// Read JSON lines with a "text" field instead of plain lines.
    #[arg(long)]
    jsonl: bool,
    /// Also print the token ids fed to the model.
    #[arg(long)]
    print_token_ids: bool,
    /// Output raw mean-pooled vectors instead of unit-length ones.
    #[arg(long)]
    raw: bool,
    /// Lines read and embedded at a time (bounds memory).
    #[arg(long, default_value_t = 1024)]
    chunk: usize,
    /// Worker threads of the native engine, or ONNX Runtime's intra-op threads (default: the
    /// backend's choice, one per core; candle follows RAYON_NUM_THREADS instead).
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(serde::Deserialize)]
struct JsonInput {
    text: String,
}

#[derive(serde::Serialize)]
struct Output<'a> {
    embedding: &'a [f32],
    tokens: usize,
    truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_ids: Option<&'a [u32]>,
}

fn main() -> ExitCode {
    common::exit_code(run(Args::parse()))
}

fn run(args: Args) -> Result<(), String> {
    if args.chunk == 0 {
        return Err("--chunk must be positive".into());
    }
    let model = common::dir_or_tiny(&args.model_args);
    let embedder = common::load(&args.model_args, &model, args.threads)?;
    let task = match args.task {
        TaskArg::Query => Task::Query,
        TaskArg::Document => Task::Document,
        TaskArg::Topic => Task::Topic,
        TaskArg::None => Task::None,
    };
    stream(&args, &embedder, task)
}

/// Reads stdin in chunks, embeds each chunk, writes one JSON line per input, in order.
fn stream(args: &Args, embedder: &TextEmbedder, task: Task) -> Result<(), String> {
    let truncation = match args.truncate {
        TruncateArg::Truncate => Truncation::Truncate,
        TruncateArg::Error => Truncation::Error,
    };
    let options = EmbedOptions::new(task).truncation(truncation);
    // An unknown prompt name fails before any input is read.
    embedder
        .tokenize(&[""], &options)
        .map_err(|e| describe(&e))?;

    let progress = io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {pos} texts embedded ({per_sec})")
                .expect("the template is valid"),
        );
        bar
    });

    let stdin = io::stdin().lock();
    let mut out = BufWriter::new(io::stdout().lock());
    let mut lines = stdin.lines();
    let mut texts: Vec<String> = Vec::with_capacity(args.chunk);
    let mut line_no = 0usize;
    loop {
        texts.clear();
        let first_line = line_no + 1;
        for line in lines.by_ref().take(args.chunk) {
            line_no += 1;
            let line = line.map_err(|e| format!("reading stdin line {line_no}: {e}"))?;
            let text = if args.jsonl {
                serde_json::from_str::<JsonInput>(&line)
                    .map_err(|e| {
                        format!("line {line_no} is not a JSON object with a \"text\" string: {e}")
                    })?
                    .text
            } else {
                line
            };
            texts.push(text);
        }
        if texts.is_empty() {
            break;
        }
        let encodings = embedder
            .tokenize(&texts, &options)
            .map_err(|e| match e {
                Error::InputTooLong { index, tokens, max } => format!(
                    "line {} has {tokens} tokens, more than the model's {max} (use --truncate truncate)",
                    first_line + index
                ),
                other => describe(&other),
            })?;
        let embeddings = embedder
            .embed_encodings(&encodings, !args.raw)
            .map_err(|e| describe(&e))?;
        for (vector, encoding) in embeddings.iter().zip(&encodings) {
            let record = Output {
                embedding: vector,
                tokens: encoding.len(),
                truncated: encoding.truncated(),
                token_ids: args.print_token_ids.then(|| encoding.ids()),
            };
            serde_json::to_writer(&mut out, &record).map_err(|e| format!("writing output: {e}"))?;
            out.write_all(b"\n")
                .map_err(|e| format!("writing output: {e}"))?;
        }
        if let Some(bar) = &progress {
            bar.inc(texts.len() as u64);
        }
    }
    out.flush().map_err(|e| format!("writing output: {e}"))?;
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    Ok(())
}
