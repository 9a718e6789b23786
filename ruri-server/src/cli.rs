//! The `ruri-server` command line: every flag, each also read from an environment variable
//! (`RURI_<FLAG>`), and [`run`], which is the whole binary.
//!
//! `--model` (or `RURI_MODEL`) is required: an installed binary has no test model to fall
//! back on, and serving random-weight vectors by accident would be worse than refusing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use ruri::cli::WhitespaceArg;
use ruri::{AttentionPrecision, BackendKind, EmbedderConfig, Precision};

use crate::{Config, Connections, describe};

/// The environment variable that holds the API key (never a flag: command lines are visible
/// to every user of the machine).
pub const API_KEY_VAR: &str = "RURI_API_KEY";

/// Serve Ruri v3 embeddings over HTTP (OpenAI and text-embeddings-inference shapes).
///
/// Listens at once and loads the model on a thread of its own: `GET /health` is 200 from the
/// start, `GET /ready` 503 until the model is loaded and warmed up. Routes: POST
/// /v1/embeddings, POST /embed (also POST /), POST /tokenize, GET /info, GET /health (also
/// GET /), GET /ready, GET /metrics.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "ruri-server",
    version,
    about,
    after_help = "Every flag can also be set through the environment variable shown with it \
                  (a flag given on the command line wins). \
                  RURI_API_KEY (environment only): when set, POST /v1/embeddings, POST /embed \
                  (and POST /), POST /tokenize and GET /info need \"Authorization: Bearer \
                  <key>\"; /health (and GET /), /ready and /metrics stay open. SIGTERM or \
                  Ctrl-C stops accepting connections and finishes the requests in flight."
)]
pub struct Args {
    /// Address to listen on (0.0.0.0:8080 in a container).
    #[arg(long, env = "RURI_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: String,
    /// The model to serve.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Worker threads of the native engine, or ONNX Runtime's intra-op threads (default: the
    /// backend's choice, one per core). With ort on cores shared with other work, 1 avoids
    /// its pool threads spinning between operators. Not for candle.
    #[arg(long, env = "RURI_THREADS")]
    pub threads: Option<usize>,
    /// ONNX Runtime sessions running one call's batches at once (default 1; ort only). More
    /// sessions with `--threads 1` give more throughput for more memory.
    #[arg(long, env = "RURI_SESSIONS")]
    pub sessions: Option<usize>,
    /// Model name echoed in OpenAI answers (default: the model folder's name).
    #[arg(long, env = "RURI_MODEL_NAME")]
    pub model_name: Option<String>,
    /// Prompt for requests that name none: query, document, topic (default: no prompt).
    #[arg(long, env = "RURI_DEFAULT_PROMPT_NAME")]
    pub default_prompt_name: Option<String>,
    /// Largest request body, in bytes.
    #[arg(long, env = "RURI_MAX_BODY_BYTES", default_value_t = Config::default().max_body_bytes)]
    pub max_body_bytes: usize,
    /// Most inputs in one request.
    #[arg(long, env = "RURI_MAX_INPUTS", default_value_t = Config::default().max_inputs)]
    pub max_inputs: usize,
    /// Tokens allowed to wait for the model; past it requests get 429.
    #[arg(long, env = "RURI_MAX_QUEUE_TOKENS", default_value_t = Config::default().max_queue_tokens)]
    pub max_queue_tokens: usize,
    /// Most tokens merged into one backend call.
    #[arg(long, env = "RURI_MAX_MERGE_TOKENS", default_value_t = Config::default().max_merge_tokens)]
    pub max_merge_tokens: usize,
    /// Seconds an embedding request may take in all (body, tokenizing, queue, answer); past
    /// it the answer is 503 with error code "timeout" and the request leaves the queue.
    #[arg(long, env = "RURI_REQUEST_TIMEOUT", default_value = "60", value_parser = seconds)]
    pub request_timeout: Duration,
    /// Seconds a client has to send a request's headers; a slower connection is closed
    /// (slowloris). Also closes keep-alive connections idle that long.
    #[arg(long, env = "RURI_HEADER_READ_TIMEOUT", default_value = "10", value_parser = seconds)]
    pub header_read_timeout: Duration,
    /// Connections open at once; more wait in the listen backlog.
    #[arg(long, env = "RURI_MAX_CONNECTIONS", default_value_t = Connections::default().max_connections)]
    pub max_connections: usize,
    /// Requests tokenizing at once, before queue admission (default: the number of CPUs).
    #[arg(long, env = "RURI_MAX_TOKENIZING")]
    pub max_tokenizing: Option<usize>,
    /// Seconds requests in flight get to finish after SIGTERM or Ctrl-C; then the remaining
    /// connections are closed.
    #[arg(long, env = "RURI_SHUTDOWN_TIMEOUT", default_value = "30", value_parser = seconds)]
    pub shutdown_timeout: Duration,
}

/// A positive number of seconds (`2`, `0.5`).
fn seconds(text: &str) -> Result<Duration, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{text:?}: give a positive number of seconds"))
}

/// The model flags: the facade's vocabulary ([`ruri::BackendKind`], [`ruri::Precision`]),
/// each flag with its `RURI_*` variable, and `--model` required.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    /// Model folder (sentence-transformers layout, or an ONNX port), or a Hugging Face Hub
    /// model id (org/name; only the files the backend and precision need are downloaded into
    /// the Hub's cache; HF_ENDPOINT, HF_HUB_CACHE, HF_TOKEN and HF_HUB_OFFLINE apply). An
    /// existing folder wins over an id. Required.
    #[arg(long, env = "RURI_MODEL")]
    pub model: PathBuf,
    /// Branch, tag or commit of a Hub model id (default: main; pin a commit in production).
    #[arg(long, env = "RURI_REVISION")]
    pub revision: Option<String>,
    /// Inference backend: native (ruri's own engine; reads model.safetensors), ort (ONNX
    /// Runtime; also runs ONNX files, and an ONNX-only folder needs it) or candle. Default:
    /// the best one compiled in (native, else ort, else candle).
    #[arg(long, env = "RURI_BACKEND", value_enum, default_value_t = BackendKind::best())]
    pub backend: BackendKind,
    /// Weights precision (native: fp32, or int8 with exact integer kernels; ort: of its graph
    /// built from model.safetensors, which int8 quantizes at load, or else which ONNX file of
    /// the folder runs; candle: the dtype).
    #[arg(long, env = "RURI_PRECISION", value_enum, default_value_t = Precision::Fp32)]
    pub precision: Precision,
    /// Run this ONNX file (relative to the model folder, or absolute) instead of the one
    /// --precision finds (ort only).
    #[arg(long, env = "RURI_ONNX_FILE")]
    pub onnx_file: Option<PathBuf>,
    /// Whitespace at the ends of prompt + text.
    #[arg(long, env = "RURI_WHITESPACE", value_enum, default_value_t = WhitespaceArg::Keep)]
    pub whitespace: WhitespaceArg,
    /// Read ruri's int8 file, model.ruri-int8.safetensors (written by `ruri quantize`),
    /// instead of quantizing model.safetensors at start: the same vectors, a faster start
    /// (backend native, --precision int8).
    #[arg(long, env = "RURI_PREQUANTIZED")]
    pub prequantized: bool,
    /// Attention's two products in f32, in bfloat16 with f32 sums, or in 13-bit integers with
    /// exact sums (bf16 and int13: backend native, fp32 or int8): about half the attention
    /// time on long texts, bf16 on CPUs with AVX-512 BF16, int13 on CPUs with AVX-512 VNNI;
    /// the same vectors on every CPU, a little further from sentence-transformers'. Default:
    /// int13 at native int8, else f32.
    #[arg(long, env = "RURI_ATTENTION", value_enum)]
    pub attention: Option<AttentionPrecision>,
}

impl Args {
    /// The loader's configuration these flags ask for (not yet validated).
    pub fn embedder_config(&self) -> EmbedderConfig {
        let model = &self.model;
        let config = EmbedderConfig::new()
            .backend(model.backend)
            .precision(model.precision)
            .whitespace(model.whitespace.into())
            .prequantized(model.prequantized)
            .attention(model.attention)
            .threads(self.threads)
            .sessions(self.sessions);
        match &model.onnx_file {
            Some(file) => config.onnx_file(file),
            None => config,
        }
    }

    /// Checks the flags together and turns them into the server's [`Config`], reading
    /// `RURI_API_KEY` from the environment. What the loader cannot run (a precision the
    /// backend lacks, a backend this binary was built without, `--onnx-file` or `--threads`
    /// with candle) is refused here, before the server listens.
    pub fn config(&self) -> Result<Config, String> {
        self.embedder_config()
            .validate()
            .map_err(|e| describe(&e))?;
        for (name, value) in [
            ("--max-inputs", self.max_inputs),
            ("--max-queue-tokens", self.max_queue_tokens),
            ("--max-merge-tokens", self.max_merge_tokens),
            ("--max-body-bytes", self.max_body_bytes),
            ("--threads", self.threads.unwrap_or(1)),
            ("--sessions", self.sessions.unwrap_or(1)),
            ("--max-connections", self.max_connections),
            ("--max-tokenizing", self.max_tokenizing.unwrap_or(1)),
        ] {
            if value == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        let api_key = match std::env::var(API_KEY_VAR) {
            Ok(key) if key.is_empty() => {
                return Err(format!(
                    "{API_KEY_VAR} is set but empty; unset it or give it a value"
                ));
            }
            Ok(key) => Some(key),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(format!("{API_KEY_VAR} is not valid UTF-8"));
            }
        };
        let model_name = self
            .model_name
            .clone()
            .unwrap_or_else(|| folder_name(&self.model.model));
        Ok(Config {
            model_name,
            default_prompt_name: self.default_prompt_name.clone(),
            max_body_bytes: self.max_body_bytes,
            max_inputs: self.max_inputs,
            max_queue_tokens: self.max_queue_tokens,
            max_merge_tokens: self.max_merge_tokens,
            api_key,
            request_timeout: self.request_timeout,
            max_tokenizing: self
                .max_tokenizing
                .unwrap_or(Config::default().max_tokenizing),
            model_id: Some(self.model.model.to_string_lossy().into_owned()),
            model_dtype: Some(tei_dtype(self.model.precision).to_owned()),
            backend: Some(self.model.backend.name().to_owned()),
        })
    }

    /// The connection limits these flags ask for.
    pub fn connections(&self) -> Connections {
        Connections {
            header_read_timeout: self.header_read_timeout,
            max_connections: self.max_connections,
            shutdown_timeout: self.shutdown_timeout,
        }
    }
}

/// A precision as TEI's `/info` names dtypes (`float32`, `float16`, `bfloat16`); int8, which
/// TEI does not serve, as `int8`.
fn tei_dtype(precision: Precision) -> &'static str {
    match precision {
        Precision::Fp32 => "float32",
        Precision::Fp16 => "float16",
        Precision::Bf16 => "bfloat16",
        other => other.name(),
    }
}

/// The folder's last component (`ruri-v3-30m` for `models/ruri-v3-30m/`), else `ruri`.
fn folder_name(dir: &Path) -> String {
    dir.components()
        .next_back()
        .and_then(|last| match last {
            std::path::Component::Normal(name) => Some(name.to_string_lossy().into_owned()),
            _ => None,
        })
        .unwrap_or_else(|| "ruri".to_owned())
}

/// The whole `ruri-server` binary: checks the flags, listens, loads the model on its own
/// thread, serves until SIGTERM or Ctrl-C, then waits for the model thread. The error is the
/// message to print after `error: `.
pub fn run(args: Args) -> Result<(), String> {
    // Refuse impossible flag combinations before listening, not through /ready.
    let config = args.config()?;
    let connections = args.connections();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the async runtime: {e}"))?;
    let worker = runtime.block_on(async move {
        let shutdown =
            crate::shutdown_signal().map_err(|e| format!("cannot listen for signals: {e}"))?;
        // Bind first: a busy port fails at once, and the platform sees a listener before the
        // model is in memory.
        let listener = tokio::net::TcpListener::bind(&args.addr)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", args.addr))?;
        let local = listener
            .local_addr()
            .map_err(|e| format!("cannot read the bound address: {e}"))?;
        eprintln!(
            "listening on http://{local}; loading {} ({:?} {:?}, attention {})",
            args.model.model.display(),
            args.model.backend,
            args.model.precision,
            args.embedder_config().get_attention()
        );
        let (router, worker) = crate::start(config, move || {
            args.embedder_config()
                .build_from_arg(&args.model.model, args.model.revision.as_deref())
                .map_err(|e| describe(&e))
        })
        .map_err(|e| format!("cannot start the model thread: {e}"))?;
        crate::serve_with(listener, router, shutdown, connections)
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn every_flag_has_an_environment_variable_and_help_lists_them() {
        let command = Args::command();
        let help = Args::command().render_long_help().to_string();
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            let env = arg
                .get_env()
                .unwrap_or_else(|| panic!("--{id} has no environment variable"))
                .to_string_lossy()
                .into_owned();
            assert_eq!(env, format!("RURI_{}", id.to_uppercase()), "--{id}");
            assert!(
                help.contains(&format!("[env: {env}=")),
                "{env} not in\n{help}"
            );
            assert!(arg.get_help().is_some(), "--{id} is undocumented");
        }
        assert!(help.contains(API_KEY_VAR), "{help}");
    }

    #[test]
    fn the_model_is_required() {
        let error = Args::try_parse_from(["ruri-server"]).unwrap_err();
        assert_eq!(
            error.kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
        assert!(error.to_string().contains("--model"), "{error}");
    }

    #[test]
    fn impossible_combinations_are_refused_before_listening() {
        let config = |flags: &[&str]| {
            let mut all = vec!["ruri-server", "--model", "m"];
            all.extend_from_slice(flags);
            Args::try_parse_from(all).unwrap().config()
        };
        let error = config(&["--backend", "candle", "--threads", "2"]).unwrap_err();
        assert!(error.contains("ONNX Runtime options"), "{error}");
        let error = config(&["--backend", "ort", "--precision", "bf16"]).unwrap_err();
        assert!(error.contains("bf16 needs backend candle"), "{error}");
        // The default backend, native, runs fp32 and int8, and has no sessions.
        if cfg!(feature = "native") {
            let error = config(&["--precision", "bf16"]).unwrap_err();
            assert!(
                error.contains(
                    "the native engine runs fp32 and int8; fp16 and bf16 need backend candle"
                ),
                "{error}"
            );
            let error = config(&["--sessions", "2"]).unwrap_err();
            assert!(error.contains("invalid option sessions = 2"), "{error}");
        }
        let error = config(&["--backend", "candle", "--precision", "int8"]).unwrap_err();
        assert!(error.contains("int8 needs backend ort"), "{error}");
        // bf16 attention is the native engine's.
        for backend in ["ort", "candle"] {
            let error = config(&["--backend", backend, "--attention", "bf16"]).unwrap_err();
            assert!(error.contains("invalid option attention = bf16"), "{error}");
            assert!(error.contains("backend native only"), "{error}");
        }
        let error = config(&["--backend", "candle", "--onnx-file", "x.onnx"]).unwrap_err();
        assert!(error.contains("onnx_file = x.onnx"), "{error}");
        let error = config(&["--max-inputs", "0"]).unwrap_err();
        assert!(error.contains("--max-inputs must be positive"), "{error}");
        let error = config(&["--backend", "ort", "--sessions", "0"]).unwrap_err();
        assert!(error.contains("--sessions must be positive"), "{error}");
        let error = config(&["--max-connections", "0"]).unwrap_err();
        assert!(
            error.contains("--max-connections must be positive"),
            "{error}"
        );
        let error = config(&["--max-tokenizing", "0"]).unwrap_err();
        assert!(
            error.contains("--max-tokenizing must be positive"),
            "{error}"
        );
    }

    /// With no --backend or RURI_BACKEND, the server runs the native engine at fp32, and
    /// says so in GET /info (`backend`, `model_dtype`). Fails if the default moves.
    #[cfg(feature = "native")]
    #[test]
    fn the_default_backend_is_native_at_fp32() {
        let args = Args::try_parse_from(["ruri-server", "--model", "m"]).unwrap();
        assert_eq!(args.model.backend, BackendKind::Native);
        assert_eq!(args.model.precision, Precision::Fp32);
        assert_eq!(args.embedder_config(), EmbedderConfig::new());
        let config = args.config().unwrap();
        assert_eq!(config.backend.as_deref(), Some("native"));
        assert_eq!(config.model_dtype.as_deref(), Some("float32"));
        // Native's worker threads are accepted; ort is still one flag away.
        let args = Args::try_parse_from(["ruri-server", "--model", "m", "--threads", "2"]).unwrap();
        assert!(args.config().is_ok());
        let args =
            Args::try_parse_from(["ruri-server", "--model", "m", "--backend", "ort"]).unwrap();
        assert_eq!(args.config().unwrap().backend.as_deref(), Some("ort"));
    }

    /// `--attention` reaches the loader's configuration (`RURI_ATTENTION`: in
    /// tests/front_ends.rs, which owns the environment); unset by default (the loader's
    /// default: f32 at fp32, int13 at native int8), an unknown name refused by clap, bf16 and
    /// int13 accepted at both of native's precisions.
    #[test]
    fn attention_is_parsed_and_reaches_the_config() {
        let parse = |flags: &[&str]| {
            let mut all = vec!["ruri-server", "--model", "m"];
            all.extend_from_slice(flags);
            Args::try_parse_from(all)
        };
        let args = parse(&[]).unwrap();
        assert_eq!(args.model.attention, None);
        assert_eq!(
            args.embedder_config().get_attention(),
            AttentionPrecision::F32
        );
        for (precision, wanted) in [
            ("fp32", AttentionPrecision::F32),
            ("int8", AttentionPrecision::Int13),
        ] {
            let flags = ["--backend", "native", "--precision", precision];
            let args = parse(&flags).unwrap();
            assert_eq!(
                args.embedder_config().get_attention(),
                wanted,
                "{precision}"
            );
        }
        for (flag, wanted) in [
            ("f32", AttentionPrecision::F32),
            ("bf16", AttentionPrecision::Bf16),
            ("int13", AttentionPrecision::Int13),
        ] {
            for precision in ["fp32", "int8"] {
                let args = parse(&["--precision", precision, "--attention", flag]).unwrap();
                assert_eq!(args.model.attention, Some(wanted), "{flag}");
                assert_eq!(args.embedder_config().get_attention(), wanted, "{flag}");
            }
        }
        let error = parse(&["--attention", "int8"]).unwrap_err();
        assert_eq!(error.kind(), clap::error::ErrorKind::InvalidValue);
        assert!(error.to_string().contains("bf16"), "{error}");
        if cfg!(feature = "native") {
            for precision in ["fp32", "int8"] {
                for attention in ["bf16", "int13"] {
                    let flags = ["--precision", precision, "--attention", attention];
                    assert!(parse(&flags).unwrap().config().is_ok(), "{precision}");
                }
            }
        }
    }

    #[test]
    fn timeouts_are_positive_seconds() {
        let parse = |flags: &[&str]| {
            let mut all = vec!["ruri-server", "--model", "m"];
            all.extend_from_slice(flags);
            Args::try_parse_from(all)
        };
        let args = parse(&[]).unwrap();
        assert_eq!(args.request_timeout, Duration::from_secs(60));
        assert_eq!(args.header_read_timeout, Duration::from_secs(10));
        assert_eq!(args.shutdown_timeout, Duration::from_secs(30));
        assert_eq!(args.max_connections, 1024);
        let args = parse(&["--request-timeout", "0.25", "--header-read-timeout", "2"]).unwrap();
        assert_eq!(args.request_timeout, Duration::from_millis(250));
        assert_eq!(
            args.connections().header_read_timeout,
            Duration::from_secs(2)
        );
        assert_eq!(
            args.config().unwrap().request_timeout,
            Duration::from_millis(250)
        );
        for bad in ["0", "-1", "soon", "NaN"] {
            let flag = format!("--shutdown-timeout={bad}");
            let error = parse(&[&flag]).unwrap_err().to_string();
            assert!(error.contains("seconds"), "{bad}: {error}");
        }
    }

    #[test]
    fn the_model_name_defaults_to_the_folder_name() {
        assert_eq!(folder_name(Path::new("models/ruri-v3-30m/")), "ruri-v3-30m");
        assert_eq!(folder_name(Path::new("ruri-v3-30m")), "ruri-v3-30m");
        assert_eq!(folder_name(Path::new("/")), "ruri");
        assert_eq!(folder_name(Path::new("..")), "ruri");
    }
}
