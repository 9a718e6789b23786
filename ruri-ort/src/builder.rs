//! [`OrtBuilder`] and its options: the precision, the graph, threads and sessions; the
//! final step opens the folder and builds the fused backend or the ONNX-file backend.

use std::path::{Path, PathBuf};

use ort::session::Session;
use ort::session::builder::{GraphOptimizationLevel, PrepackedWeights};
use ruri_core::{BatchOptions, Error, ModelDir, Result, TextEmbedder, Whitespace};

use crate::onnx_file::OrtBackend;
use crate::{discover, fused, runtime};

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
    /// `onnx/model_qint8_*.onnx`, …). Smaller and faster; on the 30m-shape test model with
    /// its outlier channel, the lowest cosine to fp32 over 512 documents was 0.9846 (fused
    /// graph) and 0.9834 (the ONNX file, in batches): BENCHMARKS.md, "int8 accuracy".
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
    pub(crate) precision: Precision,
    pub(crate) onnx_file: Option<PathBuf>,
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
            OrtBackend::load(onnx, dir.config(), sessions, |onnx| {
                self.build_session(&environment, onnx, prepacked.as_ref())
            })
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
            dir.config()
                .check_supported(&dir.path().join("config.json"))?;
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
