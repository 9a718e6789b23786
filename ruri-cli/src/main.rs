//! `ruri`: Ruri v3 Japanese text embeddings from the command line.
//!
//! * `ruri embed`: a corpus file (a text a line, JSON lines, CSV/TSV, Parquet) or stdin in;
//!   JSON lines, `.npy` or Parquet out, optionally quantized as sentence-transformers'
//!   `quantize_embeddings`; bounded memory, a progress bar on a terminal, `--resume`.
//! * `ruri serve`: the HTTP server (`ruri-server`'s flags and `RURI_*` variables).
//! * `ruri quantize`: ruri's int8 weights file of a model folder
//!   (`model.ruri-int8.safetensors`), which `ruri embed --prequantized` reads.
//!
//! `embed` and `serve` load the model through ruri's one loader (`ruri::EmbedderConfig`);
//! `ruri <command> --help` lists the flags.

mod embed;
mod input;
mod npy;
mod output;
mod quantize;
mod spool;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Ruri v3 Japanese text embeddings.
#[derive(Debug, Parser)]
#[command(name = "ruri", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Embed a corpus file (or stdin) into JSON lines, .npy or Parquet.
    Embed(Box<embed::EmbedArgs>),
    /// Serve embeddings over HTTP: OpenAI's and text-embeddings-inference's routes.
    Serve(Box<ruri_server::cli::Args>),
    /// Write ruri's int8 weights file of a model folder (model.ruri-int8.safetensors).
    Quantize(quantize::QuantizeArgs),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Embed(args) => embed::run(*args),
        Command::Serve(args) => ruri_server::cli::run(*args),
        Command::Quantize(args) => quantize::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
