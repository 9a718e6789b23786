//! The `ruri-server` command line: every flag, each also read from an environment variable
//! (`RURI_<FLAG>`), and [`run`], which is the whole binary.
//!
//! `--model` (or `RURI_MODEL`) is required: an installed binary has no test model to fall
//! back on, and serving random-weight vectors by accident would be worse than refusing.

use std::path::{Path, PathBuf};

use clap::{Parser, ValueEnum};
use ruri::TextEmbedder;

use crate::{Config, describe};

/// The environment variable that holds the API key (never a flag: command lines are visible
/// to every user of the machine).
pub const API_KEY_VAR: &str = "RURI_API_KEY";

/// Serve Ruri v3 embeddings over HTTP (OpenAI and text-embeddings-inference shapes).
///
/// Listens at once and loads the model on a thread of its own: `GET /health` is 200 from the
/// start, `GET /ready` 503 until the model is loaded and warmed up. Routes: POST
/// /v1/embeddings, POST /embed, GET /health, GET /ready, GET /metrics.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "ruri-server",
    version,
    about,
    after_help = "Every flag can also be set through the environment variable shown with it \
                  (a flag given on the command line wins). \
                  RURI_API_KEY (environment only): when set, POST /v1/embeddings and POST \
                  /embed need \"Authorization: Bearer <key>\"; /health, /ready and /metrics stay \
                  open. SIGTERM or Ctrl-C stops accepting connections and finishes the requests \
                  in flight."
)]
pub struct Args {
    /// Address to listen on (0.0.0.0:8080 in a container).
    #[arg(long, env = "RURI_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: String,
    /// The model to serve.
    #[command(flatten)]
    pub model: ModelArgs,
    /// ONNX Runtime intra-op threads (default: ONNX Runtime's choice, one per physical core).
    /// On cores shared with other work, 1 avoids its pool threads spinning between operators.
    #[arg(long, env = "RURI_THREADS")]
    pub threads: Option<usize>,
    /// ONNX Runtime sessions running one call's batches at once (default 1). More sessions
    /// with `--threads 1` give more throughput for more memory.
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
}

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// ONNX Runtime (fp32, int8, fp16 ONNX files).
    Ort,
    /// candle on the CPU (fp32, bf16, fp16 from model.safetensors).
    Candle,
}

/// `--precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Precision {
    /// 32-bit floats (both backends).
    Fp32,
    /// The int8 (quantized) ONNX file (ort).
    Int8,
    /// 16-bit floats (ort: an fp16 ONNX file; candle: the dtype).
    Fp16,
    /// bfloat16 (candle).
    Bf16,
}

/// `--whitespace`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WhitespaceArg {
    /// Prompt + text as given (sentence-transformers ≥ 5.4).
    Keep,
    /// Strip prompt + text as Python's str.strip() (sentence-transformers 2.x–5.3, what Ruri
    /// v3 was trained with and most existing indexes were built with).
    Strip,
}

/// The model flags.
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
    /// Inference backend.
    #[arg(long, env = "RURI_BACKEND", value_enum, default_value_t = BackendArg::Ort)]
    pub backend: BackendArg,
    /// Weights precision (ort: of its graph built from model.safetensors, or else which ONNX
    /// file of the folder runs; candle: the dtype).
    #[arg(long, env = "RURI_PRECISION", value_enum, default_value_t = Precision::Fp32)]
    pub precision: Precision,
    /// Run this ONNX file (relative to the model folder, or absolute) instead of the one
    /// --precision finds (ort only).
    #[arg(long, env = "RURI_ONNX_FILE")]
    pub onnx_file: Option<PathBuf>,
    /// Whitespace at the ends of prompt + text.
    #[arg(long, env = "RURI_WHITESPACE", value_enum, default_value_t = WhitespaceArg::Keep)]
    pub whitespace: WhitespaceArg,
}

impl ModelArgs {
    /// Refuses what cannot work before the server listens: a precision the backend lacks, a
    /// backend this binary was built without, `--onnx-file` with candle.
    pub fn check(&self) -> Result<(), String> {
        if let Some((_, reason)) = unsupported(self.backend, self.precision) {
            return Err(format!("--precision {reason}"));
        }
        if self.onnx_file.is_some() && self.backend == BackendArg::Candle {
            return Err("--onnx-file needs --backend ort (candle reads model.safetensors)".into());
        }
        if let Some(feature) = missing_feature(self.backend) {
            return Err(format!(
                "this ruri-server was built without the {feature:?} feature, so --backend \
                 {feature} is unavailable (build it with --features {feature})"
            ));
        }
        Ok(())
    }

    fn whitespace(&self) -> ruri::Whitespace {
        match self.whitespace {
            WhitespaceArg::Keep => ruri::Whitespace::Keep,
            WhitespaceArg::Strip => ruri::Whitespace::Strip,
        }
    }

    /// Loads the model with the chosen backend and precision; `threads` and `sessions` are
    /// ONNX Runtime's (candle ignores them). A precision the backend lacks is
    /// [`ruri::Error::InvalidOption`].
    pub fn load(
        &self,
        threads: Option<usize>,
        sessions: Option<usize>,
    ) -> ruri::Result<TextEmbedder> {
        if let Some((value, reason)) = unsupported(self.backend, self.precision) {
            return Err(ruri::Error::InvalidOption {
                name: "--precision",
                value: value.into(),
                reason,
            });
        }
        match self.backend {
            BackendArg::Ort => self.load_ort(threads, sessions),
            BackendArg::Candle => self.load_candle(),
        }
    }

    #[cfg(feature = "ort")]
    fn load_ort(
        &self,
        threads: Option<usize>,
        sessions: Option<usize>,
    ) -> ruri::Result<TextEmbedder> {
        use ruri::ort::Precision as OrtPrecision;
        let precision = match self.precision {
            Precision::Int8 => OrtPrecision::Int8,
            Precision::Fp16 => OrtPrecision::Fp16,
            Precision::Fp32 | Precision::Bf16 => OrtPrecision::Fp32,
        };
        let mut builder = ruri::ort::builder()
            .precision(precision)
            .whitespace(self.whitespace());
        if let Some(file) = &self.onnx_file {
            builder = builder.onnx_file(file);
        }
        if let Some(threads) = threads {
            builder = builder.intra_threads(threads);
        }
        if let Some(sessions) = sessions {
            builder = builder.sessions(sessions);
        }
        self.source()?.build_ort(builder)
    }

    #[cfg(not(feature = "ort"))]
    fn load_ort(&self, _: Option<usize>, _: Option<usize>) -> ruri::Result<TextEmbedder> {
        Err(feature_error("ort"))
    }

    #[cfg(feature = "candle")]
    fn load_candle(&self) -> ruri::Result<TextEmbedder> {
        use ruri::candle::DType;
        let dtype = match self.precision {
            Precision::Bf16 => DType::BF16,
            Precision::Fp16 => DType::F16,
            Precision::Fp32 | Precision::Int8 => DType::F32,
        };
        let builder = ruri::candle::builder()
            .dtype(dtype)
            .whitespace(self.whitespace());
        self.source()?.build_candle(builder)
    }

    /// `--model` and `--revision`.
    #[cfg(any(feature = "ort", feature = "candle"))]
    fn source(&self) -> ruri::Result<Source> {
        Source::parse(&self.model, self.revision.as_deref())
    }

    #[cfg(not(feature = "candle"))]
    fn load_candle(&self) -> ruri::Result<TextEmbedder> {
        Err(feature_error("candle"))
    }
}

/// `--model`: a folder, or (with the `hub` feature) a Hub model id.
#[cfg(feature = "hub")]
struct Source(ruri::hub::ModelSource);

#[cfg(feature = "hub")]
impl Source {
    fn parse(model: &Path, revision: Option<&str>) -> ruri::Result<Self> {
        ruri::hub::ModelSource::parse(model, revision).map(Source)
    }
}

/// `--model`: a folder only (this build has no `hub` feature).
#[cfg(not(feature = "hub"))]
struct Source(PathBuf);

#[cfg(not(feature = "hub"))]
impl Source {
    fn parse(model: &Path, revision: Option<&str>) -> ruri::Result<Self> {
        match revision {
            Some(revision) => Err(ruri::Error::InvalidOption {
                name: "--revision",
                value: revision.to_owned(),
                reason: "this ruri-server was built without the `hub` feature: --model takes a \
                         folder only",
            }),
            None => Ok(Source(model.to_path_buf())),
        }
    }
}

impl Source {
    #[cfg(feature = "ort")]
    fn build_ort(self, builder: ruri::ort::OrtBuilder) -> ruri::Result<TextEmbedder> {
        #[cfg(feature = "hub")]
        return builder.build(self.0);
        #[cfg(not(feature = "hub"))]
        return builder.build_from_dir(self.0);
    }

    #[cfg(feature = "candle")]
    fn build_candle(self, builder: ruri::candle::CandleBuilder) -> ruri::Result<TextEmbedder> {
        #[cfg(feature = "hub")]
        return builder.build(self.0);
        #[cfg(not(feature = "hub"))]
        return builder.build_from_dir(self.0);
    }
}

#[cfg(not(all(feature = "ort", feature = "candle")))]
fn feature_error(feature: &'static str) -> ruri::Error {
    ruri::Error::InvalidOption {
        name: "--backend",
        value: feature.into(),
        reason: "this ruri-server was built without that backend's feature",
    }
}

/// The cargo feature `backend` needs, when this build lacks it.
fn missing_feature(backend: BackendArg) -> Option<&'static str> {
    match backend {
        BackendArg::Ort if cfg!(not(feature = "ort")) => Some("ort"),
        BackendArg::Candle if cfg!(not(feature = "candle")) => Some("candle"),
        _ => None,
    }
}

/// The `--precision` value and the reason, when the backend cannot run that precision.
fn unsupported(backend: BackendArg, precision: Precision) -> Option<(&'static str, &'static str)> {
    match (backend, precision) {
        (BackendArg::Ort, Precision::Bf16) => Some(("bf16", "bf16 needs --backend candle")),
        (BackendArg::Candle, Precision::Int8) => {
            Some(("int8", "int8 needs --backend ort (an int8 ONNX file)"))
        }
        _ => None,
    }
}

impl Args {
    /// Checks the flags together and turns them into the server's [`Config`], reading
    /// `RURI_API_KEY` from the environment.
    pub fn config(&self) -> Result<Config, String> {
        self.model.check()?;
        if self.model.backend == BackendArg::Candle
            && (self.threads.is_some() || self.sessions.is_some())
        {
            return Err(
                "--threads and --sessions are ONNX Runtime options (candle follows RAYON_NUM_THREADS)"
                    .into(),
            );
        }
        for (name, value) in [
            ("--max-inputs", self.max_inputs),
            ("--max-queue-tokens", self.max_queue_tokens),
            ("--max-merge-tokens", self.max_merge_tokens),
            ("--max-body-bytes", self.max_body_bytes),
            ("--threads", self.threads.unwrap_or(1)),
            ("--sessions", self.sessions.unwrap_or(1)),
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
        })
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
            "listening on http://{local}; loading {} ({:?} {:?})",
            args.model.model.display(),
            args.model.backend,
            args.model.precision
        );
        let (router, worker) = crate::start(config, move || {
            args.model
                .load(args.threads, args.sessions)
                .map_err(|e| describe(&e))
        })
        .map_err(|e| format!("cannot start the model thread: {e}"))?;
        crate::serve(listener, router, shutdown)
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
        let error = config(&["--precision", "bf16"]).unwrap_err();
        assert!(error.contains("--backend candle"), "{error}");
        let error = config(&["--backend", "candle", "--precision", "int8"]).unwrap_err();
        assert!(error.contains("--backend ort"), "{error}");
        let error = config(&["--backend", "candle", "--onnx-file", "x.onnx"]).unwrap_err();
        assert!(error.contains("--onnx-file"), "{error}");
        let error = config(&["--max-inputs", "0"]).unwrap_err();
        assert!(error.contains("--max-inputs must be positive"), "{error}");
        let error = config(&["--sessions", "0"]).unwrap_err();
        assert!(error.contains("--sessions must be positive"), "{error}");
    }

    #[test]
    fn the_model_name_defaults_to_the_folder_name() {
        assert_eq!(folder_name(Path::new("models/ruri-v3-30m/")), "ruri-v3-30m");
        assert_eq!(folder_name(Path::new("ruri-v3-30m")), "ruri-v3-30m");
        assert_eq!(folder_name(Path::new("/")), "ruri");
        assert_eq!(folder_name(Path::new("..")), "ruri");
    }
}
