//! One loader for every front end: backend + precision + options → [`TextEmbedder`].
//!
//! The command lines (the examples, `ruri-server`, `ruri-cli`), the Python package and
//! WebAssembly (ruri-wasm, through [`EmbedderConfig::loader`]: a model given as texts and
//! bytes, no folder) all describe the model they want as an [`EmbedderConfig`] and load it
//! here, so a backend, a precision or an option means the same everywhere, and a combination
//! that cannot run is refused by one function, [`EmbedderConfig::validate`], with one typed
//! error.
//!
//! This is the only file of the facade whose code depends on the backend features (lib.rs
//! only re-exports the backend crates). Adding a backend, e.g. `native`:
//!
//! 1. a [`BackendKind`] variant, listed in [`BackendKind::ALL`] and, under its feature, in
//!    [`BackendKind::COMPILED`] (best first);
//! 2. one arm in each `match` on it: `name`, `is_compiled`, `not_compiled`,
//!    [`EmbedderConfig::validate`] (its precisions and options) and `EmbedderConfig::load`
//!    (the compiler lists a forgotten one: these have no wildcard), and its name in
//!    `from_str` (and in `runtime_version`/`loaded_runtime_path` if it loads a shared
//!    library, else their `None` is right);
//! 3. one `load_<backend>` pair: the builder call with the feature, the typed error without;
//! 4. [`BackendKind::best`] (its `best_of` table and test), if it becomes the best backend
//!    compiled in.
//!
//! Then the cargo feature (`native = ["dep:ruri-native"]`) and its re-export in lib.rs. No
//! front end changes: `--backend native`, `RURI_BACKEND=native` and `backend="native"` parse
//! through [`BackendKind`].

use std::path::{Path, PathBuf};
use std::str::FromStr;

#[cfg(feature = "native")]
use ruri_core::ModelTexts;
use ruri_core::{BatchOptions, Error, Result, TextEmbedder, Whitespace};

/// Which engine runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[non_exhaustive]
pub enum BackendKind {
    /// ONNX Runtime: fp32, int8 and fp16; ruri's own graph built from `model.safetensors`
    /// (fp32, int8 quantized at load) or the folder's ONNX files (the only backend that runs
    /// those). Needs the ONNX Runtime library at run time.
    Ort,
    /// candle on the CPU (or CUDA with the `cuda` feature): fp32, bf16 and fp16 from
    /// `model.safetensors`.
    Candle,
    /// ruri's own pure-Rust engine: fp32, and int8 with exact integer kernels (the same
    /// vector on every CPU), from `model.safetensors`. The default backend when compiled in.
    Native,
}

impl BackendKind {
    /// Every backend ruri knows, compiled in or not.
    pub const ALL: &'static [BackendKind] =
        &[BackendKind::Ort, BackendKind::Candle, BackendKind::Native];

    /// The backends this build has (their cargo features are on), best first: the first is
    /// [`BackendKind::best`].
    pub const COMPILED: &'static [BackendKind] = &[
        #[cfg(feature = "native")]
        BackendKind::Native,
        #[cfg(feature = "ort")]
        BackendKind::Ort,
        #[cfg(feature = "candle")]
        BackendKind::Candle,
    ];

    /// The best backend compiled in, the default of [`EmbedderConfig`],
    /// [`from_pretrained`](crate::from_pretrained) and every front end (`--backend`,
    /// `RURI_BACKEND`, Python's `backend=`). This is the one place that choice is made:
    ///
    /// | features | best |
    /// |---|---|
    /// | `native` (with or without the others; the default build) | `Native` |
    /// | `ort`, no `native` | `Ort` |
    /// | `candle` alone | `Candle` |
    /// | none | `Native`, whose [`validate`] then names the feature to turn on |
    ///
    /// The native engine is first because it runs int8 at 1.7–2.9× the throughput of ruri's
    /// fused ONNX Runtime graph (BENCHMARKS.md: the 30m shape, interleaved rounds; 1.75× on a
    /// Zen 4, 2.9× with a Xeon's AMX), starts in a third of the time with a third of the
    /// memory, and needs no shared library at run time; at fp32 it runs at 1.1× that graph's
    /// throughput (Zen 4).
    /// ONNX Runtime is next: it runs `model.safetensors` at fp32 and int8 as well, and is
    /// the one backend for ONNX files (an ONNX-only folder needs `backend ort`, which the
    /// loader names rather than switching to it unasked). candle runs fp32, bf16 and fp16.
    ///
    /// [`validate`]: EmbedderConfig::validate
    pub const fn best() -> BackendKind {
        Self::best_of(
            cfg!(feature = "native"),
            cfg!(feature = "ort"),
            cfg!(feature = "candle"),
        )
    }

    /// [`best`](Self::best) for a build with these backends, so every feature combination is
    /// tested from one build.
    const fn best_of(native: bool, ort: bool, candle: bool) -> BackendKind {
        if native || !(ort || candle) {
            BackendKind::Native
        } else if ort {
            BackendKind::Ort
        } else {
            BackendKind::Candle
        }
    }

    /// The name front ends spell it with (`"ort"`, `"candle"`), which is also its cargo
    /// feature.
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Ort => "ort",
            BackendKind::Candle => "candle",
            BackendKind::Native => "native",
        }
    }

    /// Whether this build has the backend (its cargo feature is on).
    pub const fn is_compiled(self) -> bool {
        match self {
            BackendKind::Ort => cfg!(feature = "ort"),
            BackendKind::Candle => cfg!(feature = "candle"),
            BackendKind::Native => cfg!(feature = "native"),
        }
    }

    /// The version of the shared library the backend loads at run time that ruri is built
    /// and tested against (ONNX Runtime's for ort); `None` for a backend linked in whole
    /// (candle) or not compiled in.
    pub fn runtime_version(self) -> Option<&'static str> {
        match self {
            #[cfg(feature = "ort")]
            BackendKind::Ort => Some(ruri_ort::ONNXRUNTIME_VERSION),
            _ => None,
        }
    }

    /// The shared library this process loaded for the backend, once a model of it was built
    /// (ONNX Runtime's for ort); `None` before, or for a backend without one.
    pub fn loaded_runtime_path(self) -> Option<PathBuf> {
        match self {
            #[cfg(feature = "ort")]
            BackendKind::Ort => ruri_ort::loaded_runtime_path(),
            _ => None,
        }
    }

    /// The error for a backend this build lacks.
    fn not_compiled(self) -> Error {
        Error::InvalidOption {
            name: "backend",
            value: self.name().into(),
            reason: match self {
                BackendKind::Ort => {
                    "this build of ruri has no `ort` feature (build it with --features ort)"
                }
                BackendKind::Candle => {
                    "this build of ruri has no `candle` feature (build it with --features candle)"
                }
                BackendKind::Native => {
                    "this build of ruri has no `native` feature (build it with --features native)"
                }
            },
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = Error;

    /// `"ort"`, `"candle"` or `"native"`, whether compiled in or not (building says which
    /// feature is missing); anything else is [`Error::InvalidOption`].
    fn from_str(name: &str) -> Result<Self> {
        match name {
            "ort" => Ok(BackendKind::Ort),
            "candle" => Ok(BackendKind::Candle),
            "native" => Ok(BackendKind::Native),
            _ => Err(Error::InvalidOption {
                name: "backend",
                value: name.into(),
                reason: "unknown backend; known: ort, candle, native",
            }),
        }
    }
}

/// The precision weights run in, one vocabulary for every backend (each runs some of them:
/// see [`EmbedderConfig::validate`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[non_exhaustive]
pub enum Precision {
    /// 32-bit floats (every backend): equal to sentence-transformers within 1e-5.
    #[default]
    Fp32,
    /// int8 (ort, native): quantized at load from `model.safetensors` (ort's graph, or the
    /// native engine's exact kernels), or ort on the folder's int8 ONNX file.
    Int8,
    /// IEEE half precision (ort: an fp16 ONNX file; candle: the dtype).
    Fp16,
    /// bfloat16 (candle).
    Bf16,
}

impl Precision {
    /// Every precision.
    pub const ALL: &'static [Precision] = &[
        Precision::Fp32,
        Precision::Int8,
        Precision::Fp16,
        Precision::Bf16,
    ];

    /// The name command lines spell it with: `fp32`, `int8`, `fp16`, `bf16`.
    pub const fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Int8 => "int8",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = Error;

    /// The command-line names, and the spellings Python users write (`float32`, `f32`,
    /// `float16`, `f16`, `bfloat16`, as torch and NumPy name dtypes); anything else is
    /// [`Error::InvalidOption`].
    fn from_str(name: &str) -> Result<Self> {
        match name {
            "fp32" | "f32" | "float32" => Ok(Precision::Fp32),
            "int8" => Ok(Precision::Int8),
            "fp16" | "f16" | "float16" => Ok(Precision::Fp16),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            _ => Err(Error::InvalidOption {
                name: "precision",
                value: name.into(),
                reason: "unknown precision; known: fp32, int8, fp16, bf16",
            }),
        }
    }
}

/// How the native engine computes attention's two products (each query against the keys,
/// the probabilities against the values); the other backends take only
/// [`AttentionPrecision::F32`]. Everything else (the linears, the softmax, the norms) is the
/// same either way. Unless [`EmbedderConfig::attention`] names one: f32 at fp32 (parity with
/// sentence-transformers), int13 at native int8 (the same speed on short texts, half f32's
/// attention time on long ones, the same bits on every CPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[non_exhaustive]
pub enum AttentionPrecision {
    /// In f32 (every backend's, and native fp32's default): fp32 keeps its parity with
    /// sentence-transformers (1e-5).
    F32,
    /// bfloat16 inputs with f32 sums (native only): about half the attention time on long
    /// texts on CPUs with AVX-512 BF16, the same bits on every CPU (emulated, more slowly,
    /// elsewhere), and vectors a little further from sentence-transformers'.
    Bf16,
    /// 13-bit integer inputs with exact integer sums (native only; native int8's default):
    /// the fastest attention on long texts on CPUs with AVX-512 VNNI, the same bits on every
    /// CPU (portable loops elsewhere), and vectors closer to f32 attention's than bf16's.
    Int13,
}

impl AttentionPrecision {
    /// Every attention precision.
    pub const ALL: &'static [AttentionPrecision] = &[
        AttentionPrecision::F32,
        AttentionPrecision::Bf16,
        AttentionPrecision::Int13,
    ];

    /// The name command lines spell it with: `f32`, `bf16`, `int13`.
    pub const fn name(self) -> &'static str {
        match self {
            AttentionPrecision::F32 => "f32",
            AttentionPrecision::Bf16 => "bf16",
            AttentionPrecision::Int13 => "int13",
        }
    }
}

impl std::fmt::Display for AttentionPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AttentionPrecision {
    type Err = Error;

    /// The command-line names, and the dtype spellings [`Precision`] takes too (`fp32`,
    /// `float32`, `bfloat16`); anything else is [`Error::InvalidOption`].
    fn from_str(name: &str) -> Result<Self> {
        match name {
            "f32" | "fp32" | "float32" => Ok(AttentionPrecision::F32),
            "bf16" | "bfloat16" => Ok(AttentionPrecision::Bf16),
            "int13" => Ok(AttentionPrecision::Int13),
            _ => Err(Error::InvalidOption {
                name: "attention",
                value: name.into(),
                reason: "unknown attention precision; known: f32, bf16, int13",
            }),
        }
    }
}

/// What ONNX Runtime runs (the ort backend; other backends take only [`Graph::Auto`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Graph {
    /// ruri's own graph when the folder has `model.safetensors` and the precision is fp32 or
    /// int8, else the folder's ONNX file (the default); an
    /// [`onnx_file`](EmbedderConfig::onnx_file) always runs that file.
    #[default]
    Auto,
    /// ruri's own graph, built in process from `model.safetensors` (fp32, int8).
    Fused,
    /// The folder's ONNX file for the precision, or [`EmbedderConfig::onnx_file`].
    OnnxFile,
}

impl Graph {
    /// `auto`, `fused`, `onnx-file`.
    pub const fn name(self) -> &'static str {
        match self {
            Graph::Auto => "auto",
            Graph::Fused => "fused",
            Graph::OnnxFile => "onnx-file",
        }
    }
}

/// Everything that decides how a model is loaded: the backend, the precision and the
/// options, in one vocabulary. Setters never fail; [`validate`](Self::validate) (which every
/// `build_*` calls first) refuses what cannot run.
///
/// ```
/// use ruri::{BackendKind, EmbedderConfig, Precision};
///
/// # let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/tiny");
/// // `folder`: a Ruri v3 folder (here the repository's tiny random-weight test model).
/// # #[cfg(feature = "ort")] {
/// let embedder = EmbedderConfig::new()
///     .backend(BackendKind::Ort)
///     .precision(Precision::Int8)
///     .threads(1)
///     .build_from_dir(folder)?;
/// assert_eq!(embedder.embed_query("瑠璃色はどんな色？")?.len(), embedder.dim());
/// # }
///
/// // One typed error for a combination no backend runs, before anything is read.
/// let refused = EmbedderConfig::new()
///     .backend(BackendKind::Candle)
///     .precision(Precision::Int8)
///     .build_from_dir(folder);
/// assert!(matches!(refused, Err(ruri::Error::InvalidOption { name: "precision", .. })));
/// # Ok::<(), ruri::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct EmbedderConfig {
    backend: BackendKind,
    precision: Precision,
    graph: Graph,
    whitespace: Whitespace,
    onnx_file: Option<PathBuf>,
    runtime_path: Option<PathBuf>,
    threads: Option<usize>,
    sessions: Option<usize>,
    batching: Option<BatchOptions>,
    prequantized: bool,
    /// `None`: the backend's default ([`EmbedderConfig::get_attention`]).
    attention: Option<AttentionPrecision>,
    /// native: the int8 kernel (`None`: `RURI_KERNEL`, else the fastest this CPU runs).
    #[cfg(feature = "native")]
    kernel: Option<ruri_native::Kernel>,
    /// native: how the token-embedding table is held (`None`: the engine's default).
    #[cfg(feature = "native")]
    embedding_table: Option<ruri_native::EmbeddingTable>,
}

impl Default for EmbedderConfig {
    /// The best backend compiled in ([`BackendKind::best`]), fp32, the automatic graph,
    /// [`Whitespace::Keep`], and each backend's own defaults for the rest.
    fn default() -> Self {
        Self {
            backend: BackendKind::best(),
            precision: Precision::Fp32,
            graph: Graph::Auto,
            whitespace: Whitespace::Keep,
            onnx_file: None,
            runtime_path: None,
            threads: None,
            sessions: None,
            batching: None,
            prequantized: false,
            attention: None,
            #[cfg(feature = "native")]
            kernel: None,
            #[cfg(feature = "native")]
            embedding_table: None,
        }
    }
}

impl EmbedderConfig {
    /// The defaults ([`EmbedderConfig::default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// A configuration from the names a configuration file, an environment or Python gives:
    /// `backend` as [`BackendKind::from_str`], `precision` as [`Precision::from_str`],
    /// `whitespace` `"keep"` or `"strip"`. An unknown name is [`Error::InvalidOption`]; the
    /// combination is checked by [`validate`](Self::validate).
    pub fn from_names(backend: &str, precision: &str, whitespace: &str) -> Result<Self> {
        let whitespace = match whitespace {
            "keep" => Whitespace::Keep,
            "strip" => Whitespace::Strip,
            _ => {
                return Err(Error::InvalidOption {
                    name: "whitespace",
                    value: whitespace.into(),
                    reason: "unknown whitespace policy; known: keep, strip",
                });
            }
        };
        Ok(Self::new()
            .backend(backend.parse()?)
            .precision(precision.parse()?)
            .whitespace(whitespace))
    }

    /// The backend (default [`BackendKind::best`]).
    pub fn backend(mut self, backend: BackendKind) -> Self {
        self.backend = backend;
        self
    }

    /// The precision (default fp32).
    pub fn precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// ort: what ONNX Runtime runs (default [`Graph::Auto`]).
    pub fn graph(mut self, graph: Graph) -> Self {
        self.graph = graph;
        self
    }

    /// Whitespace policy for prompt + text (default [`Whitespace::Keep`], as
    /// sentence-transformers ≥ 5.4; [`Whitespace::Strip`] as 2.x–5.3).
    pub fn whitespace(mut self, whitespace: Whitespace) -> Self {
        self.whitespace = whitespace;
        self
    }

    /// ort: run this ONNX file (relative to the model folder, or absolute) instead of the one
    /// the precision finds.
    pub fn onnx_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.onnx_file = Some(path.into());
        self
    }

    /// ort: load ONNX Runtime from this shared library instead of searching for it.
    pub fn runtime_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.runtime_path = Some(path.into());
        self
    }

    /// ort: threads per session inside an operator (`None`, the default: ONNX Runtime's
    /// choice, one per physical core); native: worker threads (`None`: one per core).
    pub fn threads(mut self, threads: impl Into<Option<usize>>) -> Self {
        self.threads = threads.into();
        self
    }

    /// ort: sessions running batches at once (`None`, the default: one).
    pub fn sessions(mut self, sessions: impl Into<Option<usize>>) -> Self {
        self.sessions = sessions.into();
        self
    }

    /// Read ruri's int8 file, `model.ruri-int8.safetensors` (written by `ruri quantize`),
    /// instead of quantizing `model.safetensors` at load (default `false`; backend native at
    /// int8 only, else [`Error::InvalidOption`]): the same vectors, bit for bit, loaded
    /// with no fp32 to read or quantize. The file's own options (its embedding table, outlier
    /// channels) apply; a file made for another `config.json` is
    /// [`Error::WeightsMismatch`]. Never chosen by the loader on its own.
    pub fn prequantized(mut self, enabled: bool) -> Self {
        self.prequantized = enabled;
        self
    }

    /// native: how attention's two products are computed, at fp32 and int8 alike (`None`,
    /// the default: [`AttentionPrecision::F32`] at fp32, which keeps the parity with
    /// sentence-transformers, and [`AttentionPrecision::Int13`] at int8; other backends run
    /// f32 and refuse the rest with [`Error::InvalidOption`]). int13 takes about half f32's
    /// attention time on long texts on CPUs with AVX-512 VNNI and the same on short ones;
    /// [`AttentionPrecision::Bf16`] about half on CPUs with AVX-512 BF16. Both give the same
    /// bits on every CPU (portable loops, more slowly, elsewhere) and vectors slightly
    /// different from f32's.
    ///
    /// ```
    /// use ruri::{AttentionPrecision, BackendKind, EmbedderConfig, Precision};
    ///
    /// let int8 = EmbedderConfig::new().backend(BackendKind::Native).precision(Precision::Int8);
    /// assert_eq!(int8.get_attention(), AttentionPrecision::Int13);
    /// let stated = int8.attention(AttentionPrecision::F32);
    /// assert_eq!(stated.get_attention(), AttentionPrecision::F32);
    /// ```
    pub fn attention(mut self, attention: impl Into<Option<AttentionPrecision>>) -> Self {
        self.attention = attention.into();
        self
    }

    /// native: run int8's products on this kernel (default: the `RURI_KERNEL` variable if
    /// set, else the fastest this CPU runs); [`Kernel::Scalar`](ruri_native::Kernel::Scalar)
    /// also runs int13 attention's products in portable loops, at either precision. Every
    /// kernel gives the same bits. One this CPU cannot run is [`Error::InvalidOption`] at
    /// load (at fp32 too), and so is this option with another backend.
    #[cfg(feature = "native")]
    pub fn kernel(mut self, kernel: impl Into<Option<ruri_native::Kernel>>) -> Self {
        self.kernel = kernel.into();
        self
    }

    /// native: how the token-embedding table is held (default
    /// [`EmbeddingTable::F32`](ruri_native::EmbeddingTable::F32): the checkpoint's rows,
    /// read a row per token from a folder's file, held whole when the weights come as bytes
    /// through [`loader`](Self::loader); [`Int8`](ruri_native::EmbeddingTable::Int8):
    /// quantized per row at load and held, a quarter of the f32 table's memory (26 MB for
    /// Ruri v3 instead of 105), slightly different vectors). With ruri's int8 file,
    /// the file's own table applies unless this names it; another backend refuses it with
    /// [`Error::InvalidOption`].
    #[cfg(feature = "native")]
    pub fn embedding_table(
        mut self,
        table: impl Into<Option<ruri_native::EmbeddingTable>>,
    ) -> Self {
        self.embedding_table = table.into();
        self
    }

    /// Batch limits of the pipeline (`None`, the default: the backend's advice).
    pub fn batching(mut self, batching: impl Into<Option<BatchOptions>>) -> Self {
        self.batching = batching.into();
        self
    }

    /// The backend.
    pub fn get_backend(&self) -> BackendKind {
        self.backend
    }

    /// The precision.
    pub fn get_precision(&self) -> Precision {
        self.precision
    }

    /// The whitespace policy.
    pub fn get_whitespace(&self) -> Whitespace {
        self.whitespace
    }

    /// How attention's products are computed: the one [`attention`](Self::attention) names,
    /// else the backend's default at the precision (native int8: int13; everything else:
    /// f32).
    pub fn get_attention(&self) -> AttentionPrecision {
        self.attention
            .unwrap_or(match (self.backend, self.precision) {
                (BackendKind::Native, Precision::Int8) => AttentionPrecision::Int13,
                _ => AttentionPrecision::F32,
            })
    }

    /// Refuses what cannot run, without reading anything: a precision, graph or option the
    /// backend lacks, or a backend this build was compiled without. The error is
    /// [`Error::InvalidOption`] naming the option (`precision`, `graph`, `onnx_file`,
    /// `threads`, `attention`, …, or `backend` with the cargo feature to turn on). Options
    /// are checked before the backend's feature, so a configuration gets the same answer from
    /// every build that could run it.
    ///
    /// | backend | precisions | graph | ort-only options |
    /// |---|---|---|---|
    /// | ort | fp32, int8, fp16 (fused graph: fp32, int8) | auto, fused, onnx-file | yes |
    /// | candle | fp32, bf16, fp16 | auto | refused |
    /// | native | fp32, int8 | auto | refused but `threads` (its worker threads) |
    ///
    /// Native's own options: `prequantized` (at int8), an [`attention`](Self::attention)
    /// other than f32 (at fp32 and int8), and (with the `native` feature) `kernel` and
    /// `embedding_table`, refused for the other backends.
    pub fn validate(&self) -> Result<()> {
        let refuse = |name, value: String, reason| {
            Err(Error::InvalidOption {
                name,
                value,
                reason,
            })
        };
        if self.prequantized && self.backend != BackendKind::Native {
            refuse(
                "prequantized",
                "true".into(),
                "ruri's int8 file is read by backend native",
            )?;
        }
        #[cfg(feature = "native")]
        if self.backend != BackendKind::Native {
            if let Some(kernel) = self.kernel {
                refuse(
                    "kernel",
                    kernel.to_string(),
                    "the int8 kernel is an option of backend native",
                )?;
            }
            if let Some(table) = self.embedding_table {
                refuse(
                    "embedding_table",
                    table.to_string(),
                    "the embedding table is an option of backend native",
                )?;
            }
        }
        if let Some(attention) = self.attention
            && attention != AttentionPrecision::F32
            && self.backend != BackendKind::Native
        {
            refuse(
                "attention",
                attention.to_string(),
                "bf16 and int13 attention are computed by backend native only",
            )?;
        }
        match self.backend {
            BackendKind::Ort => match (self.precision, self.graph) {
                (Precision::Bf16, _) => refuse(
                    "precision",
                    self.precision.to_string(),
                    "ONNX Runtime runs fp32, int8 and fp16; bf16 needs backend candle",
                )?,
                (_, Graph::Fused) if self.onnx_file.is_some() => refuse(
                    "graph",
                    Graph::Fused.name().into(),
                    "an ONNX file was given too; choose one graph",
                )?,
                (Precision::Fp16, Graph::Fused) => refuse(
                    "precision",
                    self.precision.to_string(),
                    "the fused graph runs fp32 and int8 (fp16 needs an ONNX file)",
                )?,
                _ => {}
            },
            BackendKind::Candle => {
                if self.precision == Precision::Int8 {
                    refuse(
                        "precision",
                        self.precision.to_string(),
                        "candle runs fp32, bf16 and fp16; int8 needs backend ort or native",
                    )?;
                }
                self.refuse_ort_options(false)?;
            }
            BackendKind::Native => {
                if self.prequantized && self.precision != Precision::Int8 {
                    refuse(
                        "prequantized",
                        "true".into(),
                        "ruri's int8 file holds int8 weights: precision int8",
                    )?;
                }
                if matches!(self.precision, Precision::Fp16 | Precision::Bf16) {
                    refuse(
                        "precision",
                        self.precision.to_string(),
                        "the native engine runs fp32 and int8; fp16 and bf16 need backend \
                         candle (or ort for fp16)",
                    )?;
                }
                self.refuse_ort_options(true)?;
            }
        }
        if !self.backend.is_compiled() {
            return Err(self.backend.not_compiled());
        }
        Ok(())
    }

    /// The options only ONNX Runtime has, refused for another backend (`threads` too unless
    /// that backend has worker threads of its own).
    fn refuse_ort_options(&self, backend_has_threads: bool) -> Result<()> {
        let refuse = |name, value: String, reason| {
            Err(Error::InvalidOption {
                name,
                value,
                reason,
            })
        };
        if let Some(file) = &self.onnx_file {
            refuse(
                "onnx_file",
                file.display().to_string(),
                "needs backend ort (the other backends read model.safetensors)",
            )?;
        }
        if self.graph != Graph::Auto {
            refuse(
                "graph",
                self.graph.name().into(),
                "an ort option (the other backends read model.safetensors)",
            )?;
        }
        let threads = self.threads.filter(|_| !backend_has_threads);
        for (name, value) in [("threads", threads), ("sessions", self.sessions)] {
            if let Some(value) = value {
                refuse(
                    name,
                    value.to_string(),
                    "threads and sessions are ONNX Runtime options (candle follows \
                     RAYON_NUM_THREADS; the native engine takes threads, not sessions)",
                )?;
            }
        }
        if let Some(path) = &self.runtime_path {
            refuse(
                "runtime_path",
                path.display().to_string(),
                "an ONNX Runtime option",
            )?;
        }
        Ok(())
    }

    /// Validates, then loads a model folder.
    pub fn build_from_dir(&self, dir: impl AsRef<Path>) -> Result<TextEmbedder> {
        self.load(Target::Dir(dir.as_ref()))
    }

    /// Validates, then downloads what this configuration runs from a Hub repository into the
    /// standard cache (or finds it there) and loads it: `repo` is an id (`"org/name"`, at
    /// `main`, with [`Hub::from_env`](crate::hub::Hub::from_env)) or a
    /// [`HubRepo`](crate::hub::HubRepo) with a revision and a client.
    #[cfg(feature = "hub")]
    pub fn build_from_hub(&self, repo: impl Into<crate::hub::HubRepo>) -> Result<TextEmbedder> {
        self.load(Target::Hub(repo.into()))
    }

    /// A folder or a Hub repository ([`ModelSource::parse`](crate::hub::ModelSource::parse)
    /// makes one from a command line, where an existing folder wins over an id).
    #[cfg(feature = "hub")]
    pub fn build(&self, source: impl Into<crate::hub::ModelSource>) -> Result<TextEmbedder> {
        match source.into() {
            crate::hub::ModelSource::Dir(dir) => self.build_from_dir(dir),
            crate::hub::ModelSource::Hub(repo) => self.build_from_hub(repo),
        }
    }

    /// What a command line's `--model` and `--revision` name: with the `hub` feature, a
    /// folder or a Hub model id ([`ModelSource::parse`](crate::hub::ModelSource::parse): an
    /// existing folder wins); without it, a folder, and a revision is
    /// [`Error::InvalidOption`].
    pub fn build_from_arg(
        &self,
        model: impl AsRef<Path>,
        revision: Option<&str>,
    ) -> Result<TextEmbedder> {
        #[cfg(feature = "hub")]
        return self.build(crate::hub::ModelSource::parse(model, revision)?);
        #[cfg(not(feature = "hub"))]
        match revision {
            Some(revision) => Err(Error::InvalidOption {
                name: "revision",
                value: revision.to_owned(),
                reason: "this build of ruri has no `hub` feature: the model is a folder only",
            }),
            None => self.build_from_dir(model),
        }
    }

    /// Validates, then starts loading a model that is not in a folder: `model` holds the
    /// texts of its `config.json` and `tokenizer.json` (checked as a folder's), and the
    /// bytes of its `model.safetensors`, or of ruri's int8 file (told apart by the header),
    /// are fed to [`WeightsLoader::push`] in order, in chunks of any size. Each tensor is
    /// prepared as soon as its bytes are in, so the file is never held whole (but an f32
    /// token-embedding table is: [`embedding_table`](Self::embedding_table)): what a
    /// WebAssembly host does with a `fetch` body (ruri-wasm loads through here). Backend
    /// native only (another is [`Error::InvalidOption`] naming `backend`), and
    /// [`prequantized`](Self::prequantized) is refused: bytes need no file name.
    ///
    /// ```
    /// # let folder = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/tiny"));
    /// use ruri::{EmbedderConfig, ModelTexts, Precision};
    ///
    /// let config = std::fs::read_to_string(folder.join("config.json"))?;
    /// let tokenizer = std::fs::read_to_string(folder.join("tokenizer.json"))?;
    /// let model = ModelTexts::new(&config, &tokenizer, None)?;
    /// let mut loader = EmbedderConfig::new().precision(Precision::Int8).loader(model)?;
    /// for chunk in std::fs::read(folder.join("model.safetensors"))?.chunks(1 << 16) {
    ///     loader.push(chunk)?;
    /// }
    /// let embedder = loader.finish()?;
    /// assert_eq!(embedder.embed_query("瑠璃色はどんな色？")?.len(), embedder.dim());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "native")]
    pub fn loader(&self, model: ModelTexts) -> Result<WeightsLoader> {
        self.validate()?;
        if self.backend != BackendKind::Native {
            return Err(Error::InvalidOption {
                name: "backend",
                value: self.backend.name().into(),
                reason: "a model given as texts and bytes is loaded by backend native only",
            });
        }
        if self.prequantized {
            return Err(Error::InvalidOption {
                name: "prequantized",
                value: "true".into(),
                reason: "bytes are told apart by their header: ruri's int8 file is read \
                         without this option",
            });
        }
        let loader =
            ruri_native::NativeBackend::loader(&self.native_builder(), model.config_json())?;
        Ok(WeightsLoader {
            loader,
            model,
            batching: self.batching,
            whitespace: self.whitespace,
        })
    }

    fn load(&self, target: Target<'_>) -> Result<TextEmbedder> {
        self.validate()?;
        match self.backend {
            BackendKind::Ort => self.load_ort(target),
            BackendKind::Candle => {
                refuse_onnx_only(BackendKind::Candle, &target)?;
                self.load_candle(target)
                    .map_err(|e| name_ort_for_onnx_only(BackendKind::Candle, e))
            }
            BackendKind::Native => {
                if !self.prequantized {
                    refuse_onnx_only(BackendKind::Native, &target)?;
                }
                self.load_native(target)
                    .map_err(|e| name_ort_for_onnx_only(BackendKind::Native, e))
            }
        }
    }

    #[cfg(feature = "native")]
    fn load_native(&self, target: Target<'_>) -> Result<TextEmbedder> {
        let builder = self.native_builder();
        match target {
            Target::Dir(dir) => builder.build_from_dir(dir),
            #[cfg(feature = "hub")]
            Target::Hub(repo) => builder.build_from_hub(repo),
        }
    }

    /// The native engine's builder for this configuration (validated).
    #[cfg(feature = "native")]
    fn native_builder(&self) -> ruri_native::NativeBuilder {
        let mut builder = ruri_native::builder()
            .precision(match self.precision {
                Precision::Fp32 => ruri_native::Precision::Fp32,
                Precision::Int8 => ruri_native::Precision::Int8,
                Precision::Fp16 | Precision::Bf16 => {
                    unreachable!("validate refuses fp16 and bf16 on native")
                }
            })
            .whitespace(self.whitespace)
            .prequantized(self.prequantized);
        // Unnamed, the engine's own default runs (`AttentionPrecision::default_for`), which
        // `get_attention` states for callers; tests/attention.rs checks that they agree.
        if let Some(attention) = self.attention {
            builder = builder.attention(match attention {
                AttentionPrecision::F32 => ruri_native::AttentionPrecision::F32,
                AttentionPrecision::Bf16 => ruri_native::AttentionPrecision::Bf16,
                AttentionPrecision::Int13 => ruri_native::AttentionPrecision::Int13,
            });
        }
        if let Some(threads) = self.threads {
            builder = builder.threads(threads);
        }
        if let Some(batching) = self.batching {
            builder = builder.batching(batching);
        }
        if let Some(kernel) = self.kernel {
            builder = builder.kernel(kernel);
        }
        if let Some(table) = self.embedding_table {
            builder = builder.embedding_table(table);
        }
        builder
    }

    #[cfg(not(feature = "native"))]
    fn load_native(&self, _: Target<'_>) -> Result<TextEmbedder> {
        Err(BackendKind::Native.not_compiled())
    }

    #[cfg(feature = "ort")]
    fn load_ort(&self, target: Target<'_>) -> Result<TextEmbedder> {
        let mut builder = ruri_ort::builder()
            .precision(match self.precision {
                Precision::Fp32 => ruri_ort::Precision::Fp32,
                Precision::Int8 => ruri_ort::Precision::Int8,
                Precision::Fp16 => ruri_ort::Precision::Fp16,
                Precision::Bf16 => unreachable!("validate refuses bf16 on ort"),
            })
            .graph(match self.graph {
                Graph::Auto => ruri_ort::Graph::Auto,
                Graph::Fused => ruri_ort::Graph::Fused,
                Graph::OnnxFile => ruri_ort::Graph::OnnxFile,
            })
            .whitespace(self.whitespace);
        if let Some(file) = &self.onnx_file {
            builder = builder.onnx_file(file);
        }
        if let Some(path) = &self.runtime_path {
            builder = builder.runtime_path(path);
        }
        if let Some(threads) = self.threads {
            builder = builder.intra_threads(threads);
        }
        if let Some(sessions) = self.sessions {
            builder = builder.sessions(sessions);
        }
        if let Some(batching) = self.batching {
            builder = builder.batching(batching);
        }
        match target {
            Target::Dir(dir) => builder.build_from_dir(dir),
            #[cfg(feature = "hub")]
            Target::Hub(repo) => builder.build_from_hub(repo),
        }
    }

    #[cfg(not(feature = "ort"))]
    fn load_ort(&self, _: Target<'_>) -> Result<TextEmbedder> {
        Err(BackendKind::Ort.not_compiled())
    }

    #[cfg(feature = "candle")]
    fn load_candle(&self, target: Target<'_>) -> Result<TextEmbedder> {
        let mut builder = ruri_candle::builder()
            .dtype(match self.precision {
                Precision::Fp32 => ruri_candle::DType::F32,
                Precision::Fp16 => ruri_candle::DType::F16,
                Precision::Bf16 => ruri_candle::DType::BF16,
                Precision::Int8 => unreachable!("validate refuses int8 on candle"),
            })
            .whitespace(self.whitespace);
        if let Some(batching) = self.batching {
            builder = builder.batching(batching);
        }
        match target {
            Target::Dir(dir) => builder.build_from_dir(dir),
            #[cfg(feature = "hub")]
            Target::Hub(repo) => builder.build_from_hub(repo),
        }
    }

    #[cfg(not(feature = "candle"))]
    fn load_candle(&self, _: Target<'_>) -> Result<TextEmbedder> {
        Err(BackendKind::Candle.not_compiled())
    }
}

/// A model being loaded from bytes ([`EmbedderConfig::loader`]): feed it the weights file
/// in order, then [`finish`](Self::finish).
#[cfg(feature = "native")]
#[derive(Debug)]
pub struct WeightsLoader {
    loader: ruri_native::Loader,
    model: ModelTexts,
    batching: Option<BatchOptions>,
    whitespace: Whitespace,
}

#[cfg(feature = "native")]
impl WeightsLoader {
    /// The next bytes of the weights file. A header that is not safetensors, a tensor the
    /// model does not have or one of the wrong shape is [`Error::InvalidConfig`] naming
    /// `model.safetensors`, as soon as its bytes show it.
    pub fn push(&mut self, chunk: &[u8]) -> Result<()> {
        self.loader.push(chunk)
    }

    /// The embedder, once the whole file was pushed: a file cut short is
    /// [`Error::InvalidConfig`]; ruri's int8 file made with other options or for another
    /// `config.json`, [`Error::WeightsMismatch`].
    pub fn finish(self) -> Result<TextEmbedder> {
        let backend = self.loader.finish()?;
        Ok(
            TextEmbedder::from_texts(self.model, self.batching, backend)?
                .with_whitespace(self.whitespace),
        )
    }
}

/// The weights file the native engine and candle read (ort's fused graph too).
const SAFETENSORS: &str = "model.safetensors";

/// What an ONNX-only model lacks for `backend`, naming the fix: the default backend reads
/// `model.safetensors`, and an ONNX port (sirasagi62/ruri-v3-30m-ONNX, an `optimum` export)
/// has only ONNX files, which only ort runs. The loader does not switch backends by itself:
/// the backend a front end reports (`GET /info`, Python's `.backend`) is the one that runs,
/// and ONNX Runtime is loaded only when asked for.
fn onnx_only_wanted(backend: BackendKind) -> String {
    format!(
        "{SAFETENSORS}, which backend {backend} reads (this model has ONNX files only: \
         run them with backend ort, `--backend ort` or `backend=\"ort\"`)"
    )
}

/// A model folder with ONNX files and no `model.safetensors`, on a backend that reads
/// `model.safetensors`: [`Error::NoModelFile`] naming backend ort and listing the ONNX files,
/// instead of the backend's bare [`Error::MissingFile`]. A folder with neither keeps the
/// backend's own error.
fn refuse_onnx_only(backend: BackendKind, target: &Target<'_>) -> Result<()> {
    // A Hub repository's listing is checked after the backend's own refusal
    // (name_ort_for_onnx_only).
    let Some(dir) = target.dir() else {
        return Ok(());
    };
    if !dir.is_dir() || dir.join(SAFETENSORS).is_file() {
        return Ok(());
    }
    let found = onnx_files(dir);
    if found.is_empty() {
        return Ok(());
    }
    Err(Error::NoModelFile {
        dir: dir.to_path_buf(),
        wanted: onnx_only_wanted(backend),
        looked_for: vec![SAFETENSORS.to_owned()],
        found,
    })
}

/// The same for a Hub repository, on the backend's own error: a repository without
/// `model.safetensors` whose listing has ONNX files gets the fix named in `wanted`.
fn name_ort_for_onnx_only(backend: BackendKind, error: Error) -> Error {
    match error {
        Error::RemoteFileNotFound {
            repo,
            revision,
            wanted,
            files,
        } if wanted == SAFETENSORS && files.iter().any(|f| f.ends_with(".onnx")) => {
            Error::RemoteFileNotFound {
                repo,
                revision,
                wanted: onnx_only_wanted(backend),
                files,
            }
        }
        other => other,
    }
}

/// Every `*.onnx` at the root of `dir` and in `dir/onnx/`, relative to `dir`, sorted (where
/// ruri-ort looks for them).
fn onnx_files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for sub in ["", "onnx"] {
        let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".onnx") && entry.path().is_file() {
                found.push(if sub.is_empty() {
                    name
                } else {
                    format!("{sub}/{name}")
                });
            }
        }
    }
    found.sort();
    found
}

/// Where [`EmbedderConfig::load`] reads the model from.
#[cfg_attr(
    not(any(feature = "ort", feature = "candle", feature = "native")),
    allow(
        dead_code,
        reason = "only a backend's load function reads a Hub target"
    )
)]
enum Target<'a> {
    Dir(&'a Path),
    #[cfg(feature = "hub")]
    Hub(crate::hub::HubRepo),
}

impl Target<'_> {
    /// The folder, for a folder target.
    fn dir(&self) -> Option<&Path> {
        match self {
            Target::Dir(dir) => Some(dir),
            #[cfg(feature = "hub")]
            Target::Hub(_) => None,
        }
    }
}

/// Loads a model with the best backend compiled in ([`BackendKind::best`]: the native engine
/// in the default build, so no ONNX Runtime library is needed) and its defaults (fp32):
/// `model` is a folder or, with the `hub` feature, a Hugging Face Hub model id such as
/// `"cl-nagoya/ruri-v3-30m"` (an existing folder wins). The one-call entry, as fastembed's
/// `TextEmbedding::try_new`: `EmbedderConfig::default().build_from_arg(model, None)`.
///
/// The native engine reads `model.safetensors`; a model with ONNX files only (an ONNX port)
/// is [`Error::NoModelFile`] (a folder) or [`Error::RemoteFileNotFound`] (a Hub id) naming
/// backend ort, which runs it: `EmbedderConfig::new().backend(BackendKind::Ort)`.
///
/// A free function rather than `TextEmbedder::from_pretrained`: [`TextEmbedder`] lives in
/// `ruri-core`, which knows no backend (the backends depend on it, not the reverse), and only
/// this facade knows which backends were compiled in.
///
/// ```
/// # let model = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/tiny");
/// // `model`: "cl-nagoya/ruri-v3-30m", or a folder (here the repository's tiny test model).
/// # #[cfg(any(feature = "ort", feature = "candle", feature = "native"))] {
/// let embedder = ruri::from_pretrained(model)?;
/// let query = embedder.embed_query("瑠璃色はどんな色？")?;
/// assert_eq!(query.len(), embedder.dim());
/// # #[cfg(feature = "native")]
/// # assert!(embedder.backend_as::<ruri::native::NativeBackend>().is_some(), "native by default");
/// # }
/// # Ok::<(), ruri::Error>(())
/// ```
pub fn from_pretrained(model: impl AsRef<Path>) -> Result<TextEmbedder> {
    EmbedderConfig::default().build_from_arg(model, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_python_spellings_parse() {
        for &precision in Precision::ALL {
            assert_eq!(
                precision.to_string().parse::<Precision>().unwrap(),
                precision
            );
        }
        for &backend in BackendKind::ALL {
            assert_eq!(backend.to_string().parse::<BackendKind>().unwrap(), backend);
        }
        for (name, precision) in [
            ("float32", Precision::Fp32),
            ("f32", Precision::Fp32),
            ("float16", Precision::Fp16),
            ("f16", Precision::Fp16),
            ("bfloat16", Precision::Bf16),
        ] {
            assert_eq!(name.parse::<Precision>().unwrap(), precision, "{name}");
        }
        assert!(matches!(
            "int4".parse::<Precision>(),
            Err(Error::InvalidOption {
                name: "precision",
                ..
            })
        ));
        assert!(matches!(
            "torch".parse::<BackendKind>(),
            Err(Error::InvalidOption {
                name: "backend",
                ..
            })
        ));
    }

    /// Every ort precision × graph × ONNX file, and candle's graphs: the refusals the
    /// backends document (ruri-ort's `Graph`: the fused graph runs fp32 and int8 and takes no
    /// ONNX file; candle reads model.safetensors only), written out rather than derived.
    #[test]
    fn graph_combinations_are_refused_in_one_place() {
        // Backend, precision, graph, whether an ONNX file is given, the refusal (option, value).
        type Case = (
            BackendKind,
            Precision,
            Graph,
            bool,
            Option<(&'static str, &'static str)>,
        );
        let cases: &[Case] = &[
            (BackendKind::Ort, Precision::Fp32, Graph::Auto, false, None),
            (BackendKind::Ort, Precision::Fp32, Graph::Fused, false, None),
            (
                BackendKind::Ort,
                Precision::Fp32,
                Graph::OnnxFile,
                false,
                None,
            ),
            (BackendKind::Ort, Precision::Fp32, Graph::Auto, true, None),
            (
                BackendKind::Ort,
                Precision::Fp32,
                Graph::Fused,
                true,
                Some(("graph", "fused")),
            ),
            (
                BackendKind::Ort,
                Precision::Fp32,
                Graph::OnnxFile,
                true,
                None,
            ),
            (BackendKind::Ort, Precision::Int8, Graph::Fused, false, None),
            (
                BackendKind::Ort,
                Precision::Int8,
                Graph::Fused,
                true,
                Some(("graph", "fused")),
            ),
            (BackendKind::Ort, Precision::Fp16, Graph::Auto, false, None),
            (
                BackendKind::Ort,
                Precision::Fp16,
                Graph::Fused,
                false,
                Some(("precision", "fp16")),
            ),
            (
                BackendKind::Ort,
                Precision::Fp16,
                Graph::Fused,
                true,
                Some(("graph", "fused")),
            ),
            (
                BackendKind::Ort,
                Precision::Fp16,
                Graph::OnnxFile,
                true,
                None,
            ),
            (
                BackendKind::Ort,
                Precision::Bf16,
                Graph::Auto,
                false,
                Some(("precision", "bf16")),
            ),
            (
                BackendKind::Ort,
                Precision::Bf16,
                Graph::Fused,
                true,
                Some(("precision", "bf16")),
            ),
            (
                BackendKind::Candle,
                Precision::Fp32,
                Graph::Auto,
                false,
                None,
            ),
            (
                BackendKind::Candle,
                Precision::Bf16,
                Graph::Auto,
                false,
                None,
            ),
            (
                BackendKind::Candle,
                Precision::Fp16,
                Graph::Auto,
                false,
                None,
            ),
            (
                BackendKind::Candle,
                Precision::Fp32,
                Graph::Fused,
                false,
                Some(("graph", "fused")),
            ),
            (
                BackendKind::Candle,
                Precision::Fp32,
                Graph::OnnxFile,
                false,
                Some(("graph", "onnx-file")),
            ),
            (
                BackendKind::Candle,
                Precision::Int8,
                Graph::Fused,
                false,
                Some(("precision", "int8")),
            ),
            (
                BackendKind::Candle,
                Precision::Fp32,
                Graph::Auto,
                true,
                Some(("onnx_file", "m.onnx")),
            ),
            (
                BackendKind::Native,
                Precision::Fp32,
                Graph::Auto,
                false,
                None,
            ),
            (
                BackendKind::Native,
                Precision::Int8,
                Graph::Auto,
                false,
                None,
            ),
            (
                BackendKind::Native,
                Precision::Fp16,
                Graph::Auto,
                false,
                Some(("precision", "fp16")),
            ),
            (
                BackendKind::Native,
                Precision::Bf16,
                Graph::Auto,
                false,
                Some(("precision", "bf16")),
            ),
            (
                BackendKind::Native,
                Precision::Int8,
                Graph::Fused,
                false,
                Some(("graph", "fused")),
            ),
            (
                BackendKind::Native,
                Precision::Int8,
                Graph::Auto,
                true,
                Some(("onnx_file", "m.onnx")),
            ),
        ];
        for &(backend, precision, graph, onnx_file, refusal) in cases {
            let mut config = EmbedderConfig::new()
                .backend(backend)
                .precision(precision)
                .graph(graph);
            if onnx_file {
                config = config.onnx_file("m.onnx");
            }
            let got = match config.validate() {
                Ok(()) => None,
                Err(Error::InvalidOption { name, value, .. }) => Some((name, value)),
                Err(other) => panic!("{config:?}: not an InvalidOption: {other}"),
            };
            let wanted = refusal.map(|(name, value)| (name, value.to_owned()));
            // A build without the backend refuses every case, naming the feature.
            let wanted = if backend.is_compiled() || wanted.is_some() {
                wanted
            } else {
                Some(("backend", backend.name().to_owned()))
            };
            assert_eq!(
                got.as_ref().map(|(n, v)| (*n, v.as_str())),
                wanted.as_ref().map(|(n, v)| (*n, v.as_str())),
                "{config:?}"
            );
        }
    }

    /// ruri's int8 file is the native engine's, at int8: any other combination is refused
    /// before anything is read.
    #[test]
    fn prequantized_needs_native_at_int8() {
        let wanted = EmbedderConfig::new().prequantized(true);
        for config in [
            wanted
                .clone()
                .backend(BackendKind::Ort)
                .precision(Precision::Int8),
            wanted.clone().backend(BackendKind::Candle),
            wanted
                .clone()
                .backend(BackendKind::Native)
                .precision(Precision::Fp32),
        ] {
            assert!(
                matches!(
                    config.validate(),
                    Err(Error::InvalidOption {
                        name: "prequantized",
                        ..
                    })
                ),
                "{config:?}"
            );
        }
        let native = wanted
            .backend(BackendKind::Native)
            .precision(Precision::Int8);
        assert_eq!(native.validate().is_ok(), BackendKind::Native.is_compiled());
    }

    #[test]
    fn attention_names_parse_and_round_trip() {
        for &attention in AttentionPrecision::ALL {
            assert_eq!(
                attention.to_string().parse::<AttentionPrecision>().unwrap(),
                attention
            );
        }
        assert_eq!(AttentionPrecision::F32.to_string(), "f32");
        assert_eq!(AttentionPrecision::Bf16.to_string(), "bf16");
        for (name, attention) in [
            ("f32", AttentionPrecision::F32),
            ("fp32", AttentionPrecision::F32),
            ("float32", AttentionPrecision::F32),
            ("bf16", AttentionPrecision::Bf16),
            ("bfloat16", AttentionPrecision::Bf16),
        ] {
            assert_eq!(
                name.parse::<AttentionPrecision>().unwrap(),
                attention,
                "{name}"
            );
        }
        for unknown in ["int8", "fp16", "BF16", ""] {
            match unknown.parse::<AttentionPrecision>() {
                Err(Error::InvalidOption {
                    name: "attention",
                    value,
                    reason,
                }) => {
                    assert_eq!(value, unknown);
                    assert!(reason.contains("f32, bf16"), "{reason}");
                }
                other => panic!("{unknown:?}: {other:?}"),
            }
        }
    }

    /// f32 attention is every backend's and fp32's default, int13 native int8's; bf16 is
    /// the native engine's, at fp32 and int8, and refused before anything is read elsewhere.
    #[test]
    fn bf16_attention_needs_native() {
        for (backend, precision, wanted) in [
            (
                BackendKind::Native,
                Precision::Fp32,
                AttentionPrecision::F32,
            ),
            (
                BackendKind::Native,
                Precision::Int8,
                AttentionPrecision::Int13,
            ),
            (BackendKind::Ort, Precision::Int8, AttentionPrecision::F32),
            (BackendKind::Ort, Precision::Fp32, AttentionPrecision::F32),
            (
                BackendKind::Candle,
                Precision::Bf16,
                AttentionPrecision::F32,
            ),
        ] {
            let config = EmbedderConfig::new().backend(backend).precision(precision);
            assert_eq!(config.get_attention(), wanted, "{backend} {precision}");
            // The default is never refused: the backend runs it.
            assert!(
                !matches!(
                    config.validate(),
                    Err(Error::InvalidOption {
                        name: "attention",
                        ..
                    })
                ),
                "{backend} {precision}"
            );
        }
        let bf16 = EmbedderConfig::new().attention(AttentionPrecision::Bf16);
        assert_eq!(bf16.get_attention(), AttentionPrecision::Bf16);
        assert_ne!(bf16, EmbedderConfig::new());
        for config in [
            bf16.clone().backend(BackendKind::Ort),
            bf16.clone()
                .backend(BackendKind::Ort)
                .precision(Precision::Int8),
            bf16.clone().backend(BackendKind::Candle),
            bf16.clone()
                .backend(BackendKind::Candle)
                .precision(Precision::Bf16),
        ] {
            match config.validate() {
                Err(Error::InvalidOption {
                    name: "attention",
                    value,
                    reason,
                }) => {
                    assert_eq!(value, "bf16", "{config:?}");
                    assert!(reason.contains("backend native"), "{reason}");
                }
                other => panic!("{config:?}: {other:?}"),
            }
        }
        // f32 attention, stated or not, changes no other backend's answer.
        for backend in [BackendKind::Ort, BackendKind::Candle] {
            let stated = EmbedderConfig::new()
                .backend(backend)
                .attention(AttentionPrecision::F32);
            assert_eq!(
                stated.get_attention(),
                EmbedderConfig::new().backend(backend).get_attention()
            );
            assert_eq!(
                stated.validate().is_ok(),
                backend.is_compiled(),
                "{backend}"
            );
        }
        for precision in [Precision::Fp32, Precision::Int8] {
            let native = bf16
                .clone()
                .backend(BackendKind::Native)
                .precision(precision);
            assert_eq!(
                native.validate().is_ok(),
                BackendKind::Native.is_compiled(),
                "{precision}"
            );
        }
        // The precisions native refuses are refused as precisions, bf16 attention or not.
        let fp16 = bf16.backend(BackendKind::Native).precision(Precision::Fp16);
        assert!(matches!(
            fp16.validate(),
            Err(Error::InvalidOption {
                name: "precision",
                ..
            })
        ));
    }

    #[test]
    fn ort_options_are_refused_for_candle() {
        let candle = EmbedderConfig::new().backend(BackendKind::Candle);
        for (config, option) in [
            (candle.clone().threads(2), "threads"),
            (candle.clone().sessions(2), "sessions"),
            (
                candle.clone().runtime_path("/lib/libonnxruntime.so"),
                "runtime_path",
            ),
        ] {
            assert!(
                matches!(config.validate(), Err(Error::InvalidOption { name, .. }) if name == option),
                "{config:?}"
            );
        }
        // The native engine has worker threads, but no sessions or ONNX Runtime library.
        let native = EmbedderConfig::new().backend(BackendKind::Native);
        assert_eq!(
            native.clone().threads(2).validate().is_ok(),
            BackendKind::Native.is_compiled()
        );
        for (config, option) in [
            (native.clone().sessions(2), "sessions"),
            (
                native.runtime_path("/lib/libonnxruntime.so"),
                "runtime_path",
            ),
        ] {
            assert!(
                matches!(config.validate(), Err(Error::InvalidOption { name, .. }) if name == option),
                "{config:?}"
            );
        }
        // And accepted for ort (when built in).
        let ort = EmbedderConfig::new()
            .backend(BackendKind::Ort)
            .threads(2)
            .sessions(2)
            .runtime_path("/lib/libonnxruntime.so");
        assert_eq!(ort.validate().is_ok(), BackendKind::Ort.is_compiled());
    }

    /// The table of [`BackendKind::best`]'s docs, written out: native whenever it is built
    /// in, else ort, else candle; with none, native (whose refusal names its feature).
    #[test]
    fn the_best_backend_for_every_feature_combination() {
        use BackendKind::{Candle, Native, Ort};
        // (native, ort, candle) → best.
        let table = [
            ((true, true, true), Native),
            ((true, true, false), Native),
            ((true, false, true), Native),
            ((true, false, false), Native),
            ((false, true, true), Ort),
            ((false, true, false), Ort),
            ((false, false, true), Candle),
            ((false, false, false), Native),
        ];
        for ((native, ort, candle), best) in table {
            assert_eq!(
                BackendKind::best_of(native, ort, candle),
                best,
                "native {native}, ort {ort}, candle {candle}"
            );
        }
    }

    /// The default build's default backend is the native engine, at fp32 (issue 21: it beat
    /// ort at both precisions). Fails if the default moves to another backend.
    #[cfg(feature = "native")]
    #[test]
    fn the_default_backend_is_native() {
        assert_eq!(BackendKind::best(), BackendKind::Native);
        assert_eq!(BackendKind::COMPILED.first(), Some(&BackendKind::Native));
        let config = EmbedderConfig::default();
        assert_eq!(config.get_backend(), BackendKind::Native);
        assert_eq!(config.get_precision(), Precision::Fp32);
        assert_eq!(EmbedderConfig::new(), config);
        assert!(config.validate().is_ok());
    }

    #[test]
    fn the_best_backend_is_compiled_in_when_any_is() {
        let best = BackendKind::best();
        assert_eq!(best.is_compiled(), !BackendKind::COMPILED.is_empty());
        if let Some(first) = BackendKind::COMPILED.first() {
            assert_eq!(best, *first);
        }
    }
}
