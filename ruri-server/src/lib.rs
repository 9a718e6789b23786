//! An HTTP server for Ruri v3 embeddings: the shape of a serverless embedding container.
//!
//! `cargo install --path ruri-server` gives the `ruri-server` binary (its flags are
//! [`cli::Args`]); this library is the same server for a program of your own: hand
//! [`start`] a function that loads a [`TextEmbedder`], and [`serve`] the router it returns.
//!
//! # Routes
//!
//! * `POST /v1/embeddings`: OpenAI's shape (`input`, `model` (ignored), `encoding_format`
//!   `float`|`base64`, `dimensions`), plus two extensions: `prompt_name` and `truncate`.
//!   Without `prompt_name` texts get [`Config::default_prompt_name`], by default none: OpenAI
//!   clients send queries and documents alike, so send `"prompt_name": "query"` or
//!   `"document"` for retrieval.
//! * `POST /embed`: text-embeddings-inference's shape (`inputs`, `normalize`, `truncate`,
//!   `prompt_name`, `dimensions`); answers an array of vectors. `POST /` is the same route, as
//!   TEI serves it for an embedding model (huggingface_hub's `InferenceClient(model=URL)
//!   .feature_extraction` posts there).
//! * `POST /tokenize`: TEI's (`inputs`, `add_special_tokens`, `prompt_name`); answers one list
//!   of `{id, text, special, start, stop}` per input (byte offsets into prompt + text; nothing
//!   truncated). `GET /info`: TEI's model description, plus `dimensions`, `backend`, `prompts`
//!   and `default_prompt_name` (the README lists the fields).
//! * `GET /health` and `GET /` (200 from the start), `GET /ready` (503 while loading, 500 with
//!   the error if loading failed, then 200), `GET /metrics` (Prometheus, OpenMetrics text).
//!
//! # The request path, and why
//!
//! auth → parse → validate → tokenize → admit into the queue (a token budget: past it, 429)
//! → the model thread merges every request waiting into one backend call, so the pipeline's
//! length-sorted, token-budgeted batching covers them all → rows back over a oneshot → cut
//! dimensions, normalize, serialize → answer.
//!
//! * **One model thread**, not a task per request: concurrent requests merge into one backend
//!   call (one ONNX Runtime run over a batch instead of many small ones), and inference never
//!   blocks an async worker.
//! * **Small requests stay on the async worker**: tokenizing a short query and serializing
//!   one vector take microseconds, less than a round trip through tokio's blocking pool (two
//!   thread wake-ups, each a context switch on a busy machine). Requests past 1 KiB of text or
//!   2,048 values in the answer go to the blocking pool, so no worker stalls on them. A request
//!   alone in its backend call gets the call's buffer itself, not a copy.
//! * **Timers and limits** ([`Config`], [`Connections`]): a header-read timeout (slowloris),
//!   a whole-request timeout (503 `timeout`; the request leaves the queue), a cap on open
//!   connections and on requests tokenizing at once, and a deadline for graceful shutdown.
//!   The API key is compared as SHA-256 digests in constant time.
//! * Merged requests share batches: on an ONNX-file int8 model (activation scales per batch)
//!   a vector then depends on other requests in its call; fp32, the fused graph's int8 and the
//!   native engine's int8 do not (see the README, "Merged requests").
//! * The server listens **before** the model is loaded: a platform sees a live container at
//!   once, and a busy port fails at once.
//!
//! # Example
//!
//! ```no_run
//! # #[cfg(feature = "native")]
//! # fn main() -> std::io::Result<()> {
//! let runtime = tokio::runtime::Runtime::new()?;
//! runtime.block_on(async {
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//!     let (router, model_thread) = ruri_server::start(ruri_server::Config::default(), || {
//!         ruri::native::builder()
//!             .build_from_dir("path/to/ruri-v3-30m")
//!             .map_err(|e| ruri_server::describe(&e))
//!     })?;
//!     ruri_server::serve(listener, router, ruri_server::shutdown_signal()?).await?;
//!     // Let a load still running end before the process does.
//!     let _ = model_thread.join();
//!     Ok(())
//! })
//! # }
//! # #[cfg(not(feature = "native"))]
//! # fn main() {}
//! ```
//!
//! # Features
//!
//! * `native` (default): `--backend native`, ruri's own pure-Rust engine (fp32, exact int8
//!   from `model.safetensors`); the default backend whenever it is built in.
//! * `ort` (default): `--backend ort`, ONNX Runtime, loaded at run time; the default backend
//!   without `native`, and the one for ONNX files (an ONNX-only model needs it).
//! * `candle` (default): `--backend candle`, candle on the CPU.
//! * `hub` (default): `--model ORG/NAME`, Hugging Face Hub model ids.
//! * `cuda`: CUDA devices for candle (needs the CUDA toolkit to build).
//!
//! A backend left out at build time is refused at start-up with a message naming the feature.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod api;
pub mod cli;
mod metrics;
mod queue;
mod routes;

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use ruri::{Error, TextEmbedder, Truncation};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use metrics::Metrics;
use queue::{Depth, Job};

/// What loading produces: the model, or the message `/ready` and the embedding routes report.
pub type LoadResult = Result<TextEmbedder, String>;

/// Server limits and identity.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `model` echoed in OpenAI answers.
    pub model_name: String,
    /// Prompt used when a request names none (`None`: no prompt).
    pub default_prompt_name: Option<String>,
    /// Larger bodies are refused with 413.
    pub max_body_bytes: usize,
    /// More inputs in one request are refused with 413.
    pub max_inputs: usize,
    /// Tokens allowed to wait for the model; past it, 429.
    pub max_queue_tokens: usize,
    /// Tokens merged into one backend call at most (a single larger request runs alone).
    pub max_merge_tokens: usize,
    /// When set, embedding routes need `Authorization: Bearer <key>` (compared in constant
    /// time, through SHA-256 digests, so neither the key's bytes nor its length show in the
    /// answer's timing).
    pub api_key: Option<String>,
    /// An embedding request (reading its body, waiting for a tokenizing slot and for the
    /// model, the answer) that takes longer is answered 503 (`timeout`, `Retry-After`) and
    /// leaves the queue.
    pub request_timeout: Duration,
    /// Requests tokenizing at once; the others wait for a slot (within their timeout) before
    /// they are admitted into the queue, so a burst of 2 MiB bodies cannot occupy every
    /// thread.
    pub max_tokenizing: usize,
    /// `model_id` in `GET /info`: the model as the server was given it (a folder or a Hub
    /// id). `None`: [`Config::model_name`].
    pub model_id: Option<String>,
    /// `model_dtype` in `GET /info` (`"float32"`, `"int8"`, `"float16"`, `"bfloat16"`);
    /// `None`: reported as `null`.
    pub model_dtype: Option<String>,
    /// `backend` in `GET /info` (`"ort"`, `"candle"`, `"native"`); `None`: `null`.
    pub backend: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            model_name: "ruri".to_owned(),
            default_prompt_name: None,
            max_body_bytes: 2 * 1024 * 1024,
            max_inputs: 256,
            max_queue_tokens: 131_072,
            max_merge_tokens: 16_384,
            api_key: None,
            request_timeout: Duration::from_secs(60),
            max_tokenizing: std::thread::available_parallelism().map_or(2, usize::from),
            model_id: None,
            model_dtype: None,
            backend: None,
        }
    }
}

/// Connection limits of [`serve_with`]: what protects the server from clients that connect
/// and then send slowly, or not at all.
#[derive(Debug, Clone)]
pub struct Connections {
    /// A connection whose request headers have not all arrived this long after the request
    /// started is closed (slowloris; also an idle keep-alive connection).
    pub header_read_timeout: Duration,
    /// Connections open at once; further ones wait in the listener's backlog until one
    /// closes.
    pub max_connections: usize,
    /// After the shutdown signal, requests in flight get this long to finish; then the
    /// remaining connections are closed and [`serve_with`] returns.
    pub shutdown_timeout: Duration,
}

impl Default for Connections {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 1024,
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

/// State shared by the handlers and the model thread.
struct Shared {
    config: Config,
    /// SHA-256 of the API key, when there is one.
    api_key_digest: Option<[u8; 32]>,
    /// Slots for tokenizing ([`Config::max_tokenizing`]).
    tokenizing: Arc<tokio::sync::Semaphore>,
    /// Empty while loading.
    model: OnceLock<Result<Arc<TextEmbedder>, String>>,
    depth: Depth,
    metrics: Metrics,
}

/// The router's state: the shared part and the queue's sending end. The model thread stops
/// once every clone of it is gone.
#[derive(Clone)]
struct App {
    shared: Arc<Shared>,
    jobs: mpsc::UnboundedSender<Job>,
}

/// Builds the router and starts loading on a thread of its own, which then becomes the model
/// thread. Routes answer at once; embedding routes say 503 until `load` has returned.
///
/// The thread ends once the router and every clone of it are dropped (after [`serve`]
/// returns) and the queue is empty; join it before exiting, so that a shutdown during loading
/// does not tear down the runtime libraries under the loading thread.
pub fn start(
    config: Config,
    load: impl FnOnce() -> LoadResult + Send + 'static,
) -> std::io::Result<(Router, std::thread::JoinHandle<()>)> {
    let (jobs, receiver) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        api_key_digest: config.api_key.as_deref().map(routes::digest),
        tokenizing: Arc::new(tokio::sync::Semaphore::new(config.max_tokenizing.max(1))),
        config,
        model: OnceLock::new(),
        depth: Depth::default(),
        metrics: Metrics::new(),
    });
    let worker_shared = Arc::clone(&shared);
    let worker = std::thread::Builder::new()
        .name("ruri-model".into())
        .spawn(move || {
            let shared = worker_shared;
            let engine = load_and_warm_up(&shared, load);
            shared
                .model
                .set(engine.clone())
                .unwrap_or_else(|_| unreachable!("only the model thread sets the model"));
            if let Ok(engine) = engine {
                queue::run_worker(
                    &engine,
                    receiver,
                    &shared.depth,
                    &shared.metrics,
                    shared.config.max_merge_tokens,
                );
            }
        })?;
    Ok((routes::router(App { shared, jobs }), worker))
}

/// Loads, checks the default prompt and warms up, logging the outcome on stderr.
fn load_and_warm_up(
    shared: &Shared,
    load: impl FnOnce() -> LoadResult,
) -> Result<Arc<TextEmbedder>, String> {
    let started = Instant::now();
    let mut loaded_after = None;
    let result = catch_panic(load).and_then(|engine| {
        loaded_after = Some(started.elapsed());
        if let Some(name) = shared.config.default_prompt_name.as_deref() {
            routes::resolve_prompt(engine.prompts(), name)
                .map_err(|e| format!("--default-prompt-name: {}", e.message))?;
        }
        warm_up(&engine)?;
        Ok(Arc::new(engine))
    });
    match &result {
        Ok(engine) => {
            let seconds = started.elapsed().as_secs_f64();
            let load_ms = loaded_after.unwrap_or_default().as_secs_f64() * 1e3;
            eprintln!(
                "model ready in {:.0} ms (load {load_ms:.0} ms, warm-up {:.0} ms; {} dimensions, up to {} tokens per input)",
                seconds * 1e3,
                seconds * 1e3 - load_ms,
                engine.dim(),
                engine.max_length()
            );
            shared.metrics.load_seconds.set(seconds);
            shared.metrics.ready.set(1);
        }
        Err(message) => eprintln!("error: the model failed to load: {message}"),
    }
    result
}

/// Serves `router` on `listener` with the default [`Connections`] limits until `shutdown`
/// resolves, then finishes the requests in flight (within the shutdown deadline).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, router, shutdown, Connections::default()).await
}

/// Serves `router` on `listener` (HTTP/1.1) under `limits` until `shutdown` resolves: then
/// stops accepting, lets the requests in flight finish for at most
/// [`Connections::shutdown_timeout`], closes what is left and returns.
pub async fn serve_with(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: Connections,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::server::graceful::GracefulShutdown;

    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let mut http = hyper::server::conn::http1::Builder::new();
    // hyper enforces the header timeout only with a timer.
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    // Dropping the set (at the deadline) aborts the connections still open.
    let mut connections = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        while connections.try_join_next().is_some() {}
        let permit = tokio::select! {
            () = &mut shutdown => break,
            permit = Arc::clone(&permits).acquire_owned() => {
                permit.expect("the semaphore is never closed")
            }
        };
        let tcp = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Per-connection errors (a reset before accept) end only that
                    // connection; others (out of file descriptors) pass with time, as
                    // axum::serve does.
                    if !is_connection_error(&e) {
                        eprintln!("warning: accept failed: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    continue;
                }
            },
        };
        // Small JSON answers on keep-alive connections: without TCP_NODELAY, Nagle's
        // algorithm and delayed ACKs can hold back their last segment.
        if let Err(e) = tcp.set_nodelay(true) {
            eprintln!("warning: cannot set TCP_NODELAY: {e}");
        }
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(tcp), service));
        connections.spawn(async move {
            let _permit = permit;
            // A client that breaks its connection is no error of the server's.
            let _ = connection.await;
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.shutdown_timeout) => {
            eprintln!(
                "shutdown deadline ({:?}) passed: closing the connections still open",
                limits.shutdown_timeout
            );
        }
    }
    connections.shutdown().await;
    Ok(())
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        e.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    )
}

/// Registers for Ctrl-C and SIGTERM (what container platforms send before stopping) now, so
/// no signal between startup and the first poll takes the default action (dying at once); the
/// future resolves on the first of them.
#[cfg(unix)]
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        eprintln!("shutting down: no new connections; finishing the requests in flight");
    })
}

/// Resolves on Ctrl-C.
#[cfg(not(unix))]
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    Ok(async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            eprintln!("warning: cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
        eprintln!("shutting down: no new connections; finishing the requests in flight");
    })
}

/// An error with its chain of causes, `outer: cause: root cause`: ruri's one formatter,
/// [`ruri::error_chain`], as the `String` the model thread and the routes report.
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    ruri::error_chain(e).to_string()
}

fn catch_panic(load: impl FnOnce() -> LoadResult) -> LoadResult {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(load))
        .unwrap_or_else(|panic| Err(format!("loading panicked: {}", panic_message(&*panic))))
}

/// The message of a panic payload (`panic!` gives a `&str` or a `String`).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

/// One short text through the whole path, so the first request does not pay for ONNX
/// Runtime's first run. Deliberately short: a long warm-up would grow the arenas (and so the
/// resident memory) for nothing.
fn warm_up(engine: &TextEmbedder) -> Result<(), String> {
    let encoding = engine
        .tokenizer()
        .encode("", "ウォームアップ", Truncation::Truncate)
        .map_err(|e| format!("warm-up tokenization failed: {}", describe(&Error::from(e))))?;
    engine
        .embed_encodings(&[encoding], !raw_available(engine))
        .map(drop)
        .map_err(|e| format!("warm-up inference failed: {}", describe(&e)))
}

/// Whether raw (unnormalized) vectors can be had: not from an ONNX file whose only output is
/// already L2-normalized.
fn raw_available(engine: &TextEmbedder) -> bool {
    !engine.backend().output_is_normalized()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_joins_the_chain_of_causes() {
        let inner = std::io::Error::other("disk on fire");
        let e = Error::Io {
            path: "/m/config.json".into(),
            source: inner,
        };
        let text = describe(&e);
        assert!(text.ends_with(": disk on fire"), "{text}");
    }
}
