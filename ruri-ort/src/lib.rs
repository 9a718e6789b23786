//! Ruri v3 embeddings on ONNX Runtime (CPU): on ruri's own graph built from
//! `model.safetensors`, or from fp32, int8 or fp16 ONNX files.
//!
//! [`builder()`] makes a [`ruri_core::TextEmbedder`]: the shared pipeline of `ruri-core`
//! (prompts, whitespace and truncation policies, length-sorted token-budget batches, pooling,
//! normalization) around an [`OrtBackend`], a pool of ONNX Runtime sessions.
//!
//! ```
//! use ruri_ort::Precision;
//!
//! # let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tiny");
//! // `folder`: a Ruri v3 folder with ONNX files (here the repository's tiny test model).
//! let embedder = ruri_ort::builder().precision(Precision::Int8).build_from_dir(folder)?;
//! let query = embedder.embed_query("瑠璃色はどんな色？")?;
//! assert_eq!(query.len(), embedder.dim());
//! # Ok::<(), ruri_core::Error>(())
//! ```
//!
//! # Graphs
//!
//! [`OrtBuilder::graph`] chooses what ONNX Runtime runs; the default, [`Graph::Auto`], is the
//! fused graph whenever the folder has `model.safetensors` (and the precision is fp32 or
//! int8), else the folder's ONNX file.
//!
//! * [`Graph::Fused`]: ruri builds the ModernBERT graph itself, in process, from
//!   `config.json` + `model.safetensors` (ONNX Runtime's Model Editor API; no export step,
//!   no ONNX file, no Python), so the official cl-nagoya folders run as they are. 15 nodes
//!   a layer at fp32 (about 50 with per-row int8) where the TorchScript export has 150+:
//!   faster session creation and less per-operator overhead on short texts. fp32 equals
//!   sentence-transformers within 1e-5. int8 is quantized at load: weights per output
//!   channel (7-bit range, so that x86's 16-bit `vpmaddubsw` sums never saturate and every
//!   x86 CPU computes the same integers),
//!   activations per token row ([`Int8Activations::PerRow`]: a text's int8 vector does not
//!   depend on its batch neighbours), with an exact fp32 rescaling of outlier channels folded
//!   into the LayerNorm weights and the linears after them. Texts over
//!   [`OrtBuilder::long_text_tokens`] run on a second graph whose attention memory is linear
//!   in the length (local layers by blocks, global layers unmasked), so one 8,192-token text
//!   fits in a few hundred MB.
//! * [`Graph::OnnxFile`]: the folder's ONNX file for the [`Precision`], or
//!   [`OrtBuilder::onnx_file`].
//!
//! ```
//! use ruri_ort::{Graph, Precision};
//!
//! # let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tiny");
//! // No ONNX file needed: the graph is built from model.safetensors.
//! let embedder = ruri_ort::builder()
//!     .graph(Graph::Fused)
//!     .precision(Precision::Int8)
//!     .build_from_dir(folder)?;
//! let fused = embedder.backend_as::<ruri_ort::FusedBackend>().expect("the fused backend");
//! assert!(fused.is_int8());
//! # Ok::<(), ruri_core::Error>(())
//! ```
//!
//! # Model folders
//!
//! Either layout works: a sentence-transformers folder with ONNX files, or an ONNX port such as
//! sirasagi62/ruri-v3-30m-ONNX (`config.json`, `tokenizer.json`, `onnx/model.onnx`,
//! `onnx/model_quantized.onnx`). [`Precision`] finds its file under every name real ports use,
//! in a fixed order ([`Precision::candidates`]); [`OrtBuilder::onnx_file`] runs a given
//! file instead. A missing precision is [`ruri_core::Error::NoModelFile`], listing the names
//! tried and the ONNX files the folder has. The official cl-nagoya folders ship no ONNX file;
//! they run on the fused graph.
//!
//! The model must take `input_ids` and `attention_mask` (int64, `batch × seq`) and give
//! `sentence_embedding` (`batch × dim`, mean pooled) or `token_embeddings` /
//! `last_hidden_state` (`batch × seq × dim`, pooled here), as float32 or float16. Some exports
//! bake L2 normalization into `sentence_embedding` (found at load by running two short texts):
//! then `token_embeddings` is pooled instead when the file has it, and otherwise raw vectors
//! (`normalize(false)`) are refused rather than returned normalized.
//!
//! # The ONNX Runtime library
//!
//! Loaded at run time (`ort`'s `load-dynamic`; nothing is downloaded or linked at build
//! time): from [`OrtBuilder::runtime_path`], else `ORT_DYLIB_PATH`, else ruri's default folder
//! ([`default_install_dir`]: `~/.cache/ruri/onnxruntime-1.31.1/`), else the system library
//! path. A missing or too old library is [`ruri_core::Error::RuntimeUnavailable`], whose
//! message gives the steps: unpack `libonnxruntime.so.1.31.1` from the `onnxruntime` wheel on
//! PyPI into the default folder, point `ORT_DYLIB_PATH` at an installed onnxruntime Python
//! package's library, or use a system library.
//!
//! # Threads
//!
//! An embedder holds a small pool of sessions (one by default). A call takes a session for
//! each of its batches in turn, so calls from several threads run concurrently up to the pool
//! size; set
//! [`OrtBuilder::sessions`] and [`OrtBuilder::intra_threads`] so that
//! `sessions × intra_threads` matches the cores you want used.

#![deny(missing_docs)]

mod discover;
mod fused;
#[cfg(feature = "hub")]
mod hub;
mod pool;
mod runtime;

use std::path::{Path, PathBuf};

use ndarray::{Ix2, Ix3};
use ort::session::builder::{GraphOptimizationLevel, PrepackedWeights};
use ort::session::{HasSelectedOutputs, OutputSelector, RunOptions, Session};
use ort::value::TensorRef;
use ruri_core::{
    Backend, BackendOutput, BatchOptions, Error, ModelDir, PaddedBatch, Result, TextEmbedder,
    Whitespace,
};

pub use fused::FusedBackend;
pub use runtime::{ONNXRUNTIME_VERSION, default_install_dir, loaded_runtime_path};

use pool::Pool;

/// Which ONNX file of the folder to run: each precision is looked for under the names real
/// Ruri ports use, in a fixed order ([`Precision::candidates`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Precision {
    /// Full precision (`onnx/model.onnx`, else `model.onnx`): equal to sentence-transformers
    /// within 1e-5.
    #[default]
    Fp32,
    /// int8: on the fused graph, quantized at load from `model.safetensors` (see "Graphs" in
    /// the crate docs); from an ONNX file, the dynamically quantized file
    /// (`onnx/model_quantized.onnx`, `onnx/model_int8.onnx`, sentence-transformers'
    /// `onnx/model_qint8_*.onnx`, …). Smaller and faster, cosine ≥ 0.99 to fp32.
    Int8,
    /// Half precision (`onnx/model_fp16.onnx`); float16 outputs are read as float16 and
    /// widened to f32.
    Fp16,
}

impl Precision {
    /// The file names this precision is looked for under, relative to the model folder, most
    /// preferred first; the first that exists is run.
    ///
    /// * fp32: `onnx/model.onnx`, `model.onnx`.
    /// * int8: `onnx/model_quantized.onnx`, `onnx/model_int8.onnx`,
    ///   `onnx/model_qint8_avx512_vnni.onnx`, `onnx/model_qint8_avx512.onnx`,
    ///   `onnx/model_qint8_avx2.onnx`, `onnx/model_qint8_arm64.onnx` (on aarch64 the arm64
    ///   file comes before the x86 ones), `model_quantized.onnx`, `model_int8.onnx`.
    /// * fp16: `onnx/model_fp16.onnx`, `model_fp16.onnx`.
    pub fn candidates(self) -> &'static [&'static str] {
        discover::candidates(self)
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::Fp32 => "fp32",
            Precision::Int8 => "int8",
            Precision::Fp16 => "fp16",
        })
    }
}

/// ONNX Runtime's graph optimization level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OptimizationLevel {
    /// No graph rewrites.
    Disable,
    /// Constant folding and redundant-node elimination.
    Basic,
    /// Basic plus fusions (attention, GELU, LayerNorm, …).
    Extended,
    /// Everything, layout transformations included (the default for ONNX files).
    #[default]
    All,
}

impl OptimizationLevel {
    fn to_ort(self) -> GraphOptimizationLevel {
        match self {
            OptimizationLevel::Disable => GraphOptimizationLevel::Disable,
            OptimizationLevel::Basic => GraphOptimizationLevel::Level1,
            OptimizationLevel::Extended => GraphOptimizationLevel::Level2,
            // `Level3` is only the layout level in ort rc.15; `All` is the full set.
            OptimizationLevel::All => GraphOptimizationLevel::All,
        }
    }
}

/// Which graph ONNX Runtime runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Graph {
    /// [`Fused`](Graph::Fused) when the folder has `model.safetensors` and the precision is
    /// fp32 or int8, else [`OnnxFile`](Graph::OnnxFile) (the default). An explicit
    /// [`OrtBuilder::onnx_file`] always runs that file.
    #[default]
    Auto,
    /// ruri's own graph, built in process from `config.json` + `model.safetensors`: runs
    /// the official cl-nagoya folders (which ship no ONNX file); fp32 or int8 (quantized at
    /// load, see [`Precision::Int8`]).
    Fused,
    /// The folder's ONNX file for the precision ([`Precision::candidates`]), or
    /// [`OrtBuilder::onnx_file`].
    OnnxFile,
}

/// How the fused graph quantizes activations for its int8 linears (weights are always int8
/// per output channel).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Int8Activations {
    /// A scale per token row (the default): a text's int8 vector does not depend on the
    /// other texts of its batch.
    #[default]
    PerRow,
    /// One scale per batch tensor (`com.microsoft.DynamicQuantizeMatMul`, what dynamically
    /// quantized ONNX files and every peer do): a text's vector depends on its batch
    /// neighbours. For comparison.
    PerTensor,
}

/// Starts a builder of a [`TextEmbedder`] on ONNX Runtime (`ruri::ort::builder()` in the
/// facade).
pub fn builder() -> OrtBuilder {
    OrtBuilder::default()
}

/// Builds a [`TextEmbedder`] on ONNX Runtime. Setters never fail; everything is checked in
/// [`build_from_dir`](OrtBuilder::build_from_dir).
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct OrtBuilder {
    precision: Precision,
    onnx_file: Option<PathBuf>,
    runtime_path: Option<PathBuf>,
    intra_threads: Option<usize>,
    sessions: Option<usize>,
    optimization: Option<OptimizationLevel>,
    batching: Option<BatchOptions>,
    whitespace: Whitespace,
    graph: Graph,
    int8_activations: Int8Activations,
    intra_op_spinning: Option<bool>,
    long_text_tokens: Option<usize>,
}

/// Default of [`OrtBuilder::long_text_tokens`].
pub const DEFAULT_LONG_TEXT_TOKENS: usize = 1024;

impl OrtBuilder {
    /// fp32 (default), int8 or fp16: which ONNX file of the folder runs, found under the
    /// names of [`Precision::candidates`]. Ignored when [`onnx_file`](Self::onnx_file) is set.
    pub fn precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// Runs this ONNX file instead of the precision's default; a relative path is taken
    /// relative to the model folder.
    pub fn onnx_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.onnx_file = Some(path.into());
        self
    }

    /// Loads ONNX Runtime from this shared library instead of searching for it.
    pub fn runtime_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.runtime_path = Some(path.into());
        self
    }

    /// Threads each session uses inside an operator (ONNX Runtime's default: one per
    /// physical core).
    pub fn intra_threads(mut self, threads: usize) -> Self {
        self.intra_threads = Some(threads);
        self
    }

    /// Sessions in the pool (default 1): how many batches run at once, whether they come from
    /// one call (its batches are spread over the sessions) or from concurrent calls.
    ///
    /// For throughput on a CPU, pair it with [`intra_threads(1)`](Self::intra_threads): one
    /// single-threaded session per core avoids ONNX Runtime's per-operator thread
    /// synchronization, which dominates on short texts. It raises throughput and memory
    /// alike: the sessions share their prepacked weights, not the rest (figures in the
    /// repository's BENCHMARKS.md).
    pub fn sessions(mut self, sessions: usize) -> Self {
        self.sessions = Some(sessions);
        self
    }

    /// Graph optimization level. Default: [`OptimizationLevel::All`] for ONNX files,
    /// [`OptimizationLevel::Basic`] for the fused graph, which is fused by construction (the
    /// extended level would turn its Add + LayerNormalization into ONNX Runtime's CPU
    /// SkipLayerNormalization, a scalar loop 8× slower).
    pub fn optimization(mut self, level: OptimizationLevel) -> Self {
        self.optimization = Some(level);
        self
    }

    /// Batch limits of the pipeline (padded-token budget, texts per batch); default:
    /// [`BatchOptions::default`], tuned for CPUs.
    pub fn batching(mut self, batching: BatchOptions) -> Self {
        self.batching = Some(batching);
        self
    }

    /// Whitespace policy for prompt + text (default [`Whitespace::Keep`]; [`Whitespace::Strip`]
    /// reproduces sentence-transformers 2.x–5.3). Calls may override it with
    /// [`EmbedOptions::whitespace`](ruri_core::EmbedOptions::whitespace).
    pub fn whitespace(mut self, whitespace: Whitespace) -> Self {
        self.whitespace = whitespace;
        self
    }

    /// Which graph runs (default [`Graph::Auto`]: the fused graph when the folder has
    /// `model.safetensors`).
    pub fn graph(mut self, graph: Graph) -> Self {
        self.graph = graph;
        self
    }

    /// The fused graph's int8 activation scales (default [`Int8Activations::PerRow`]).
    pub fn int8_activations(mut self, activations: Int8Activations) -> Self {
        self.int8_activations = activations;
        self
    }

    /// Whether ONNX Runtime's intra-op threads spin while waiting for work. Default: only for
    /// single-threaded sessions (where there is nothing to spin); multi-threaded sessions
    /// do not spin, which costs little latency and gives the cores back to the rest of the
    /// process (spinning threads keep every core busy between batches).
    pub fn intra_op_spinning(mut self, spin: bool) -> Self {
        self.intra_op_spinning = Some(spin);
        self
    }

    /// Fused graph: batches whose longest text has more than this many tokens run text by
    /// text on the long-text graph, whose attention memory is linear in the length (default
    /// [`DEFAULT_LONG_TEXT_TOKENS`]; 0 sends every batch there).
    pub fn long_text_tokens(mut self, tokens: usize) -> Self {
        self.long_text_tokens = Some(tokens);
        self
    }

    /// Opens the model folder, loads ONNX Runtime if needed, and builds the sessions.
    pub fn build_from_dir(self, dir: impl AsRef<Path>) -> Result<TextEmbedder> {
        let dir = ModelDir::open(dir)?;
        if let Some(fused) = self.fused_checkpoint(&dir)? {
            return self.build_fused(&dir, fused);
        }
        let onnx = match &self.onnx_file {
            Some(path) if path.is_absolute() => {
                if !path.is_file() {
                    return Err(Error::MissingFile { path: path.clone() });
                }
                path.clone()
            }
            Some(path) => dir.file(path)?,
            None => discover::find(dir.path(), self.precision)?,
        };
        let sessions = self.check_counts()?;
        let embedder = TextEmbedder::load(&dir, self.batching, || {
            let environment = runtime::environment(self.runtime_path.as_deref())?;
            // Sessions of one pool share their prepacked (reordered) weights.
            let prepacked = (sessions > 1).then(PrepackedWeights::new);
            let mut first = self.build_session(&environment, &onnx, prepacked.as_ref())?;
            let config = dir.config();
            let mut signature = Signature::inspect(&first, &onnx, config.hidden_size)?;
            let word = 7.min(config.vocab_size.saturating_sub(1)) as i64;
            signature.check_normalized(
                &mut first,
                &onnx,
                [
                    i64::from(config.bos_token_id),
                    i64::from(config.eos_token_id),
                    i64::from(config.pad_token_id),
                    word,
                ],
            )?;
            let mut all = vec![first];
            for _ in 1..sessions {
                all.push(self.build_session(&environment, &onnx, prepacked.as_ref())?);
            }
            // Fetch only the output we use: a model with both outputs would otherwise copy out
            // `batch × seq × dim` token embeddings on every run.
            let output_name = signature.output.name().to_owned();
            let lanes = all
                .into_iter()
                .map(|session| {
                    let run_options = RunOptions::new()
                        .map_err(|e| Error::Backend {
                            backend: "ort",
                            context: "creating run options".into(),
                            source: Box::new(e),
                        })?
                        .with_outputs(OutputSelector::no_default().with(output_name.clone()));
                    Ok(Lane {
                        session,
                        run_options,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let backend = OrtBackend {
                pool: Pool::new(lanes),
                signature,
                onnx,
            };
            Ok(backend)
        })?
        .with_whitespace(self.whitespace);
        Ok(embedder)
    }

    /// Whether the fused graph runs, given whether the folder (or Hub repository) has
    /// `model.safetensors`; choices that contradict each other are errors. `Graph::Fused`
    /// answers yes even without the file: the caller reports it missing.
    pub(crate) fn runs_fused(&self, has_weights: bool) -> Result<bool> {
        let fusable = matches!(self.precision, Precision::Fp32 | Precision::Int8);
        match self.graph {
            Graph::OnnxFile => Ok(false),
            Graph::Auto => Ok(self.onnx_file.is_none() && fusable && has_weights),
            Graph::Fused if self.onnx_file.is_some() => Err(Error::InvalidOption {
                name: "graph",
                value: "fused".into(),
                reason: "an ONNX file was given too; choose one graph",
            }),
            Graph::Fused if !fusable => Err(Error::InvalidOption {
                name: "precision",
                value: self.precision.to_string(),
                reason: "the fused graph runs fp32 and int8 (fp16 needs an ONNX file)",
            }),
            Graph::Fused => Ok(true),
        }
    }

    /// The checkpoint of the fused graph, when it is the one to run.
    fn fused_checkpoint(&self, dir: &ModelDir) -> Result<Option<PathBuf>> {
        let weights = dir.path().join("model.safetensors");
        if !self.runs_fused(weights.is_file())? {
            return Ok(None);
        }
        if !weights.is_file() {
            return Err(Error::MissingFile { path: weights });
        }
        Ok(Some(weights))
    }

    fn build_fused(self, dir: &ModelDir, safetensors: PathBuf) -> Result<TextEmbedder> {
        let sessions = self.check_counts()?;
        let linears = match (self.precision, self.int8_activations) {
            (Precision::Int8, Int8Activations::PerRow) => fused::Linears::Int8PerRow,
            (Precision::Int8, Int8Activations::PerTensor) => fused::Linears::Int8PerTensor,
            _ => fused::Linears::Fp32,
        };
        let embedder = TextEmbedder::load(dir, self.batching, || {
            let environment = runtime::environment(self.runtime_path.as_deref())?;
            let prepacked = (sessions > 1).then(PrepackedWeights::new);
            let settings = self.clone();
            let origin = safetensors.clone();
            let commit = move |model: ort::editor::Model| -> Result<Session> {
                let fail = |context: &str, e: ort::Error| Error::Backend {
                    backend: "ort",
                    context: format!("{context} (the fused graph of {})", origin.display()),
                    source: Box::new(e),
                };
                let level = settings.optimization.unwrap_or(OptimizationLevel::Basic);
                let builder = settings
                    .session_builder(&environment, prepacked.as_ref(), level)
                    .map_err(|(c, e)| fail(c, e))?;
                model
                    .into_session(&builder)
                    .map_err(|e| fail("creating the session", e))
            };
            fused::FusedBackend::load(fused::Recipe {
                safetensors: safetensors.clone(),
                config: dir.config().clone(),
                linears,
                sessions,
                long_text_tokens: self.long_text_tokens.unwrap_or(DEFAULT_LONG_TEXT_TOKENS),
                commit: Box::new(commit),
            })
        })?
        .with_whitespace(self.whitespace);
        Ok(embedder)
    }

    /// `sessions`, after refusing zero sessions or zero threads.
    fn check_counts(&self) -> Result<usize> {
        let sessions = self.sessions.unwrap_or(1);
        if sessions == 0 {
            return Err(Error::InvalidOption {
                name: "sessions",
                value: "0".into(),
                reason: "at least one session is needed",
            });
        }
        if self.intra_threads == Some(0) {
            return Err(Error::InvalidOption {
                name: "intra_threads",
                value: "0".into(),
                reason: "leave it unset for ONNX Runtime's default",
            });
        }
        Ok(sessions)
    }

    /// Session options: optimization level, threads, spinning, shared prepacked weights.
    fn session_builder(
        &self,
        environment: &ort::environment::Environment,
        prepacked: Option<&PrepackedWeights>,
        level: OptimizationLevel,
    ) -> std::result::Result<ort::session::builder::SessionBuilder, (&'static str, ort::Error)>
    {
        let mut builder = Session::builder(environment)
            .map_err(|e| ("creating session options", e))?
            .with_optimization_level(level.to_ort())
            .map_err(|e| ("setting the optimization level", e.into()))?;
        if let Some(threads) = self.intra_threads {
            builder = builder
                .with_intra_threads(threads)
                .map_err(|e| ("setting intra-op threads", e.into()))?;
        }
        let spin = self
            .intra_op_spinning
            .unwrap_or(self.intra_threads == Some(1));
        builder = builder
            .with_intra_op_spinning(spin)
            .map_err(|e| ("setting intra-op spinning", e.into()))?;
        if let Some(prepacked) = prepacked {
            builder = builder
                .with_prepacked_weights(prepacked)
                .map_err(|e| ("sharing prepacked weights", e.into()))?;
        }
        Ok(builder)
    }

    fn build_session(
        &self,
        environment: &ort::environment::Environment,
        onnx: &Path,
        prepacked: Option<&PrepackedWeights>,
    ) -> Result<Session> {
        let fail = |context: &str, e: ort::Error| Error::Backend {
            backend: "ort",
            context: format!("{context} ({})", onnx.display()),
            source: Box::new(e),
        };
        let level = self.optimization.unwrap_or_default();
        self.session_builder(environment, prepacked, level)
            .map_err(|(c, e)| fail(c, e))?
            .commit_from_file(onnx)
            .map_err(|e| fail("loading the ONNX model", e))
    }
}

/// Which output of the ONNX model carries the vectors.
#[derive(Debug, Clone)]
enum OutputKind {
    /// `batch × dim`, already pooled.
    Pooled(String),
    /// `batch × seq × dim`, pooled by the pipeline.
    Tokens(String),
}

impl OutputKind {
    fn name(&self) -> &str {
        match self {
            OutputKind::Pooled(n) | OutputKind::Tokens(n) => n,
        }
    }
}

/// The element type of the output read: float32, or float16 widened to f32 on the way out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Element {
    F32,
    F16,
}

#[derive(Debug, Clone)]
struct Signature {
    output: OutputKind,
    element: Element,
    /// A token-level output, when the model has one besides the pooled one.
    tokens_fallback: Option<(String, Element)>,
    /// The pooled output is L2-normalized and no token-level output exists.
    normalized: bool,
    dim: usize,
}

impl Signature {
    /// Checks the model's inputs and picks its output, preferring the pooled one (no
    /// `batch × seq × dim` copy out of ONNX Runtime).
    fn inspect(session: &Session, onnx: &Path, hidden_size: usize) -> Result<Self> {
        let unsupported = |what: String| Error::Unsupported {
            path: onnx.to_path_buf(),
            what,
        };
        let inputs: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
        for needed in ["input_ids", "attention_mask"] {
            if !inputs.contains(&needed) {
                return Err(unsupported(format!(
                    "an ONNX model without a {needed:?} input (inputs: {inputs:?})"
                )));
            }
        }
        if let Some(extra) = inputs
            .iter()
            .find(|n| !matches!(**n, "input_ids" | "attention_mask"))
        {
            return Err(unsupported(format!(
                "an ONNX model with the extra input {extra:?} (inputs: {inputs:?})"
            )));
        }
        let outputs: Vec<&str> = session.outputs().iter().map(|o| o.name()).collect();
        let tokens = ["token_embeddings", "last_hidden_state"]
            .into_iter()
            .find(|n| outputs.contains(n));
        let output = if outputs.contains(&"sentence_embedding") {
            OutputKind::Pooled("sentence_embedding".into())
        } else if let Some(name) = tokens {
            OutputKind::Tokens(name.into())
        } else {
            return Err(unsupported(format!(
                "an ONNX model without sentence_embedding, token_embeddings or \
                 last_hidden_state outputs (outputs: {outputs:?})"
            )));
        };
        let describe = |name: &str| -> Result<(Element, Option<i64>)> {
            let outlet = session
                .outputs()
                .iter()
                .find(|o| o.name() == name)
                .expect("the name was taken from the session's outputs");
            match outlet.dtype() {
                ort::value::ValueType::Tensor { ty, shape, .. } => {
                    let element = match ty {
                        ort::value::TensorElementType::Float32 => Element::F32,
                        ort::value::TensorElementType::Float16 => Element::F16,
                        other => {
                            return Err(unsupported(format!(
                                "the output {name} of element type {other:?} (ruri reads \
                                 float32 and float16 outputs)"
                            )));
                        }
                    };
                    Ok((element, shape.last().copied()))
                }
                other => Err(unsupported(format!(
                    "the output {name} of type {other:?} (ruri reads tensors)"
                ))),
            }
        };
        let (element, declared) = describe(output.name())?;
        // A static last dimension that disagrees with config.json means the wrong folder.
        if let Some(d) = declared.filter(|&d| d > 0 && d as usize != hidden_size) {
            return Err(Error::InvalidConfig {
                path: onnx.to_path_buf(),
                reason: format!(
                    "the ONNX output {} has {d} dimensions but config.json's hidden_size is {hidden_size}",
                    output.name()
                ),
            });
        }
        let tokens_fallback = match (&output, tokens) {
            (OutputKind::Pooled(_), Some(name)) => Some((name.to_owned(), describe(name)?.0)),
            _ => None,
        };
        Ok(Self {
            output,
            element,
            tokens_fallback,
            normalized: false,
            dim: hidden_size,
        })
    }

    /// Some ports bake L2 normalization into `sentence_embedding`. Raw means raw: such a
    /// pooled output is replaced by the token-level one when the model has it (the pipeline
    /// then pools, and normalizes only when asked), else marked so that raw vectors are
    /// refused. Found by running two short texts: a mean-pooled vector of unit length by
    /// chance, twice, is not a risk worth a wrong answer.
    fn check_normalized(
        &mut self,
        session: &mut Session,
        onnx: &Path,
        probe: [i64; 4],
    ) -> Result<()> {
        if !matches!(self.output, OutputKind::Pooled(_)) {
            return Ok(());
        }
        let [bos, eos, pad, word] = probe;
        let fail = |e: ort::Error| Error::Backend {
            backend: "ort",
            context: format!("probing the output of {}", onnx.display()),
            source: Box::new(e),
        };
        let ids = ndarray::arr2(&[[bos, eos, pad], [bos, word, eos]]);
        let mask = ndarray::arr2(&[[1i64, 1, 0], [1, 1, 1]]);
        let ids = TensorRef::from_array_view(ids.view()).map_err(fail)?;
        let mask = TensorRef::from_array_view(mask.view()).map_err(fail)?;
        let outputs = session
            .run(ort::inputs!["input_ids" => ids, "attention_mask" => mask])
            .map_err(fail)?;
        let pooled = extract(&outputs[self.output.name()], self.element).map_err(fail)?;
        // float16 outputs carry ~3 decimal digits.
        let tolerance = match self.element {
            Element::F32 => 1e-4,
            Element::F16 => 1e-2,
        };
        let unit = pooled.outer_iter().all(|row| {
            let norm = row
                .iter()
                .map(|&x| f64::from(x) * f64::from(x))
                .sum::<f64>()
                .sqrt();
            (norm - 1.0).abs() < tolerance
        });
        if unit {
            match self.tokens_fallback.take() {
                Some((name, element)) => {
                    self.output = OutputKind::Tokens(name);
                    self.element = element;
                }
                None => self.normalized = true,
            }
        }
        Ok(())
    }
}

/// An output as an owned f32 array: float32 copied, float16 widened.
fn extract(
    value: &ort::value::DynValue,
    element: Element,
) -> std::result::Result<ndarray::ArrayD<f32>, ort::Error> {
    Ok(match element {
        Element::F32 => value.try_extract_array::<f32>()?.to_owned(),
        Element::F16 => value.try_extract_array::<half::f16>()?.mapv(f32::from),
    })
}

/// The ONNX Runtime [`Backend`]: a pool of sessions over one ONNX file. Reach it from a
/// [`TextEmbedder`] with `embedder.backend_as::<OrtBackend>()`.
#[derive(Debug)]
pub struct OrtBackend {
    pool: Pool<Lane>,
    signature: Signature,
    onnx: PathBuf,
}

/// A session with its run options (which are not `Sync`, so they travel with the session).
struct Lane {
    session: Session,
    run_options: RunOptions<HasSelectedOutputs>,
}

impl OrtBackend {
    /// The ONNX file the sessions run.
    pub fn onnx_file(&self) -> &Path {
        &self.onnx
    }

    fn run_error(&self, e: ort::Error) -> Error {
        Error::Backend {
            backend: "ort",
            context: format!("running {}", self.onnx.display()),
            source: Box::new(e),
        }
    }
}

impl Backend for OrtBackend {
    fn dim(&self) -> usize {
        self.signature.dim
    }

    /// One batch per session at a time.
    fn parallelism(&self) -> usize {
        self.pool.size()
    }

    fn forward(&self, batch: &PaddedBatch) -> Result<BackendOutput> {
        let shape = [batch.batch_size(), batch.seq_len()];
        let ids = TensorRef::from_array_view((shape, batch.input_ids()))
            .map_err(|e| self.run_error(e))?;
        let mask = TensorRef::from_array_view((shape, batch.attention_mask()))
            .map_err(|e| self.run_error(e))?;
        let shape_error = |e: ndarray::ShapeError| Error::ModelOutput {
            reason: format!(
                "{} gave an output of unexpected rank: {e}",
                self.onnx.display()
            ),
        };
        self.pool.with(|lane| {
            let outputs = lane
                .session
                .run_with_options(
                    ort::inputs!["input_ids" => ids, "attention_mask" => mask],
                    &lane.run_options,
                )
                .map_err(|e| self.run_error(e))?;
            // Copy out while the session is held: the output lives in ONNX Runtime's memory.
            let array = extract(
                &outputs[self.signature.output.name()],
                self.signature.element,
            )
            .map_err(|e| self.run_error(e))?;
            Ok(match &self.signature.output {
                OutputKind::Pooled(_) => {
                    BackendOutput::Pooled(array.into_dimensionality::<Ix2>().map_err(shape_error)?)
                }
                OutputKind::Tokens(_) => BackendOutput::TokenEmbeddings(
                    array.into_dimensionality::<Ix3>().map_err(shape_error)?,
                ),
            })
        })
    }

    fn output_is_normalized(&self) -> bool {
        self.signature.normalized
    }
}
