//! An HTTP embedding server: the shape of a serverless embedding container.
//!
//! ```sh
//! cargo run --release --example serve -- --model path/to/ruri-v3-30m --precision int8
//! curl -s localhost:8080/v1/embeddings -H 'content-type: application/json' \
//!      -d '{"input": ["瑠璃色はどんな色？"], "prompt_name": "query"}'
//! ```
//!
//! It listens at once and loads the model on a thread of its own: `GET /health` is 200 from
//! the start, `GET /ready` is 503 until the model is loaded and warmed up (500 with the error
//! if loading failed), and embedding routes answer 503 with `Retry-After` until then.
//!
//! * `POST /v1/embeddings`: OpenAI's shape (`input`, `model` (ignored), `encoding_format`
//!   `float`|`base64`, `dimensions`), plus two extensions: `prompt_name` and `truncate`.
//!   Without `prompt_name` texts get the `--default-prompt-name` prompt, by default none:
//!   OpenAI clients send queries and documents alike, so send `"prompt_name": "query"` or
//!   `"document"` for retrieval.
//! * `POST /embed`: text-embeddings-inference's shape (`inputs`, `normalize`, `truncate`,
//!   `prompt_name`, `dimensions`); answers an array of vectors.
//! * `GET /metrics`: Prometheus (OpenMetrics text).
//!
//! Concurrent requests are tokenized on the blocking pool, queued, and merged by one model
//! worker into single backend calls, so the pipeline's length-sorted, token-budgeted batching
//! covers them all. Inputs over the model's maximum length are refused (413) unless the
//! request says `"truncate": true`. With `RURI_API_KEY` set, embedding routes need
//! `Authorization: Bearer <key>`. SIGTERM or Ctrl-C stops accepting connections and finishes
//! the requests in flight.

mod common;
#[path = "serve/mod.rs"]
mod server;

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use common::{BackendArg, ModelArgs};

/// Serve Ruri v3 embeddings over HTTP (OpenAI and TEI shapes).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: String,
    #[command(flatten)]
    model_args: ModelArgs,
    /// ONNX Runtime intra-op threads (default: ONNX Runtime's choice).
    #[arg(long)]
    threads: Option<usize>,
    /// ONNX Runtime sessions running one call's batches at once (default 1). More sessions
    /// with `--threads 1` give more throughput for more memory (see BENCHMARKS.md).
    #[arg(long)]
    sessions: Option<usize>,
    /// Model name echoed in OpenAI answers (default: the model folder's name).
    #[arg(long)]
    model_name: Option<String>,
    /// Prompt for requests that name none: query, document, topic (default: no prompt).
    #[arg(long)]
    default_prompt_name: Option<String>,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = server::Config::default().max_body_bytes)]
    max_body_bytes: usize,
    /// Most inputs in one request.
    #[arg(long, default_value_t = server::Config::default().max_inputs)]
    max_inputs: usize,
    /// Tokens allowed to wait for the model; past it requests get 429.
    #[arg(long, default_value_t = server::Config::default().max_queue_tokens)]
    max_queue_tokens: usize,
    /// Most tokens merged into one backend call.
    #[arg(long, default_value_t = server::Config::default().max_merge_tokens)]
    max_merge_tokens: usize,
}

fn main() -> ExitCode {
    common::exit_code(run(Args::parse()))
}

fn run(args: Args) -> Result<(), String> {
    // Refuse impossible flag combinations before listening, not through /ready.
    args.model_args.check()?;
    if matches!(args.model_args.backend, BackendArg::Candle)
        && (args.threads.is_some() || args.sessions.is_some())
    {
        return Err(
            "--threads and --sessions are ONNX Runtime options (candle follows RAYON_NUM_THREADS)"
                .into(),
        );
    }
    for (name, value) in [
        ("--max-inputs", args.max_inputs),
        ("--max-queue-tokens", args.max_queue_tokens),
        ("--max-merge-tokens", args.max_merge_tokens),
        ("--max-body-bytes", args.max_body_bytes),
    ] {
        if value == 0 {
            return Err(format!("{name} must be positive"));
        }
    }
    let api_key = match std::env::var("RURI_API_KEY") {
        Ok(key) if key.is_empty() => {
            return Err("RURI_API_KEY is set but empty; unset it or give it a value".into());
        }
        Ok(key) => Some(key),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err("RURI_API_KEY is not valid UTF-8".into());
        }
    };
    let model = args.model_args.dir_or_tiny();
    let model_name = args.model_name.clone().unwrap_or_else(|| {
        model
            .file_name()
            .map_or_else(|| "ruri".to_owned(), |n| n.to_string_lossy().into_owned())
    });
    let config = server::Config {
        model_name,
        default_prompt_name: args.default_prompt_name.clone(),
        max_body_bytes: args.max_body_bytes,
        max_inputs: args.max_inputs,
        max_queue_tokens: args.max_queue_tokens,
        max_merge_tokens: args.max_merge_tokens,
        api_key,
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the async runtime: {e}"))?;
    let worker = runtime.block_on(async move {
        let shutdown = shutdown_signal()?;
        // Bind first: a busy port fails at once, and the platform sees a listener before the
        // model is in memory.
        let listener = tokio::net::TcpListener::bind(&args.addr)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", args.addr))?;
        let local = listener
            .local_addr()
            .map_err(|e| format!("cannot read the bound address: {e}"))?;
        eprintln!(
            "listening on http://{local}; loading {} ({:?} {:?})",
            model.display(),
            args.model_args.backend,
            args.model_args.precision
        );
        let (router, worker) = server::start(config, move || load(&args, &model))
            .map_err(|e| format!("cannot start the model thread: {e}"))?;
        server::serve(listener, router, shutdown)
            .await
            .map_err(|e| format!("server error: {e}"))?;
        Ok::<_, String>(worker)
    })?;
    // A shutdown during loading waits for the load to end (the worker then finds no senders
    // and returns): exiting under it would run ONNX Runtime's static destructors while the
    // loading thread still uses the library.
    if worker.join().is_err() {
        return Err("the model thread panicked".into());
    }
    eprintln!("stopped");
    Ok(())
}

fn load(args: &Args, model: &std::path::Path) -> server::LoadResult {
    match args.model_args.load(model, args.threads, args.sessions) {
        Ok(loaded) => Ok(Arc::new(loaded)),
        Err(e) => Err(server::describe(&e)),
    }
}

/// Registers for Ctrl-C and SIGTERM (what container platforms send before stopping) now, so
/// no signal between startup and the first poll takes the default action (dying at once); the
/// future resolves on the first of them.
#[cfg(unix)]
fn shutdown_signal() -> Result<impl Future<Output = ()>, String> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot listen for Ctrl-C: {e}"))?;
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|e| format!("cannot listen for SIGTERM: {e}"))?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        eprintln!("shutting down: no new connections; finishing the requests in flight");
    })
}

#[cfg(not(unix))]
fn shutdown_signal() -> Result<impl Future<Output = ()>, String> {
    Ok(async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            eprintln!("warning: cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
        eprintln!("shutting down: no new connections; finishing the requests in flight");
    })
}
