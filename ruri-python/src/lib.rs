//! `ruri._ruri`: the extension module under the `ruri` Python package.
//!
//! Python users hold `ruri.Embedder` (python/ruri/__init__.py), which checks
//! sentence-transformers' arguments and calls the one class here, `Engine`: a
//! [`ruri::TextEmbedder`] (ONNX Runtime or candle) with the GIL released while it loads,
//! tokenizes and runs. Vectors come back as a NumPy array that owns the `Vec<f32>` the
//! pipeline filled: no copy. Errors become the `ruri.RuriError` subclasses of
//! python/ruri/_errors.py, with ruri's messages.

use std::path::PathBuf;

use numpy::{PyArray2, PyReadonlyArray2};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString};
use ruri::{
    AttentionPrecision, BackendKind, EmbedOptions, EmbedderConfig, Error, Task, TextEmbedder,
    Whitespace,
};

/// When an error happened: a backend error while loading is a broken model, while embedding
/// an inference failure.
#[derive(Clone, Copy)]
enum Phase {
    Load,
    Embed,
}

/// The Python exception class (in `ruri._errors`) for a ruri error.
fn error_class(error: &Error, phase: Phase) -> &'static str {
    match error {
        Error::MissingFile { .. }
        | Error::NoModelFile { .. }
        | Error::Io { .. }
        | Error::InvalidJson { .. }
        | Error::InvalidConfig { .. }
        | Error::Unsupported { .. }
        | Error::WeightsMismatch { .. }
        | Error::InvalidTokenizer { .. } => "ModelLoadError",
        Error::RuntimeUnavailable { .. } => "RuntimeUnavailableError",
        Error::Tokenizer(_) | Error::InputTooLong { .. } | Error::InvalidOption { .. } => {
            "InputError"
        }
        Error::Backend { .. } | Error::ModelOutput { .. } => match phase {
            Phase::Load => "ModelLoadError",
            Phase::Embed => "InferenceError",
        },
        // `ruri::Error` is non-exhaustive: a variant added later (e.g. the Hub's) is a load
        // error while loading, and a RuriError otherwise.
        _ => match phase {
            Phase::Load => "ModelLoadError",
            Phase::Embed => "RuriError",
        },
    }
}

/// ruri's message, then each wrapped cause on a line of its own (`caused by: …`): ruri's one
/// formatter, [`ruri::error_chain`], in its multi-line form.
fn message(error: &(dyn std::error::Error + 'static)) -> String {
    format!("{:#}", ruri::error_chain(error))
}

/// The module `ruri._errors`, imported once.
fn errors_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    MODULE
        .get_or_try_init(py, || Ok(py.import("ruri._errors")?.unbind()))
        .map(|m| m.bind(py))
}

/// An instance of the `ruri._errors` class `class` with `text` as its message.
fn py_error(py: Python<'_>, class: &str, text: String) -> PyErr {
    let made = errors_module(py)
        .and_then(|m| m.getattr(class))
        .and_then(|c| c.call1((text.clone(),)));
    match made {
        Ok(instance) => PyErr::from_value(instance),
        // Only if the Python half of the package is missing or broken.
        Err(e) => PyRuntimeError::new_err(format!("{text} (and ruri._errors failed: {e})")),
    }
}

fn to_py(py: Python<'_>, error: Error, phase: Phase) -> PyErr {
    py_error(py, error_class(&error, phase), message(&error))
}

/// Where a Hub model is looked up: sentence-transformers' `revision`, `cache_folder`, `token`
/// and `local_files_only`; unset ones follow the Hugging Face environment variables.
#[derive(Default)]
struct HubOptions {
    revision: Option<String>,
    cache_folder: Option<PathBuf>,
    token: Option<String>,
    local_files_only: bool,
}

impl HubOptions {
    fn any(&self) -> bool {
        self.revision.is_some()
            || self.cache_folder.is_some()
            || self.token.is_some()
            || self.local_files_only
    }
}

/// A folder, or (with the `hub` feature) a Hub model id: an existing folder wins, as in
/// ruri's command lines ([`ruri::hub::ModelSource::parse`]).
enum Source {
    Dir(PathBuf),
    #[cfg(feature = "hub")]
    Hub(ruri::hub::HubRepo),
}

fn source(model: &str, hub: &HubOptions) -> ruri::Result<Source> {
    #[cfg(feature = "hub")]
    {
        use ruri::hub::{Hub, ModelSource};
        match ModelSource::parse(model, hub.revision.as_deref())? {
            ModelSource::Dir(dir) => {
                if hub.any() {
                    return Err(Error::InvalidOption {
                        name: "revision/cache_folder/token/local_files_only",
                        value: model.to_owned(),
                        reason: "the model is a local folder; these options are for Hub ids",
                    });
                }
                Ok(Source::Dir(dir))
            }
            ModelSource::Hub(repo) => {
                let mut client = Hub::from_env();
                if let Some(dir) = &hub.cache_folder {
                    client = client.cache_dir(dir);
                }
                if let Some(token) = &hub.token {
                    client = client.token(token);
                }
                if hub.local_files_only {
                    client = client.offline(true);
                }
                Ok(Source::Hub(repo.hub(client)))
            }
            // `ModelSource` may grow; an unknown kind is refused rather than guessed at.
            #[allow(unreachable_patterns)]
            _ => Err(Error::MissingFile { path: model.into() }),
        }
    }
    #[cfg(not(feature = "hub"))]
    {
        if hub.any() {
            return Err(Error::InvalidOption {
                name: "revision",
                value: model.to_owned(),
                reason: "this build of ruri has no Hub support (the `hub` feature)",
            });
        }
        Ok(Source::Dir(model.into()))
    }
}

/// The loader's configuration for the constructor's arguments: `backend`, `precision` and
/// `whitespace` by name ([`EmbedderConfig::from_names`], the parser every front end shares),
/// then the ort options. Whether they go together is [`EmbedderConfig::validate`]'s answer,
/// given when the model is built.
fn engine_config(
    backend: &str,
    precision: &str,
    whitespace: &str,
    runtime_path: Option<PathBuf>,
    intra_threads: Option<usize>,
    sessions: Option<usize>,
    max_batch_tokens: Option<usize>,
) -> ruri::Result<EmbedderConfig> {
    let mut config = EmbedderConfig::from_names(backend, precision, whitespace)?
        .threads(intra_threads)
        .sessions(sessions)
        .batching(max_batch_tokens.map(|t| ruri::BatchOptions::default().max_batch_tokens(t)));
    if let Some(path) = runtime_path {
        config = config.runtime_path(path);
    }
    Ok(config)
}

fn build(model: &str, config: &EmbedderConfig, hub: &HubOptions) -> ruri::Result<TextEmbedder> {
    match source(model, hub)? {
        Source::Dir(dir) => config.build_from_dir(dir),
        #[cfg(feature = "hub")]
        Source::Hub(repo) => config.build_from_hub(repo),
    }
}

/// A loaded model: ruri's `TextEmbedder` behind `ruri.Embedder`.
///
/// Frozen (immutable after construction) and `Sync`: several Python threads may call
/// `embed` at once; each call releases the GIL while it tokenizes and runs.
#[pyclass(frozen, module = "ruri._ruri")]
struct Engine {
    embedder: TextEmbedder,
    model: String,
    backend: &'static str,
    precision: String,
    whitespace: &'static str,
    attention: AttentionPrecision,
}

#[pymethods]
impl Engine {
    /// Loads `model` (a folder, or a Hub model id with the `hub` feature) on `backend`
    /// ("native", "ort" or "candle") at `precision`, attention's products in `attention`
    /// ("f32", or "bf16" or "int13" on native; the names `AttentionPrecision::from_str`
    /// takes; `None`: the loader's default, int13 at native int8, else f32).
    #[new]
    #[pyo3(signature = (model, backend, precision, whitespace, runtime_path=None, intra_threads=None, sessions=None, max_batch_tokens=None, revision=None, cache_folder=None, token=None, local_files_only=false, prequantized=false, attention=None))]
    #[allow(
        clippy::too_many_arguments,
        reason = "a Python signature of keyword arguments"
    )]
    fn new(
        py: Python<'_>,
        model: String,
        backend: &str,
        precision: &str,
        whitespace: &str,
        runtime_path: Option<PathBuf>,
        intra_threads: Option<usize>,
        sessions: Option<usize>,
        max_batch_tokens: Option<usize>,
        revision: Option<String>,
        cache_folder: Option<PathBuf>,
        token: Option<String>,
        local_files_only: bool,
        prequantized: bool,
        attention: Option<&str>,
    ) -> PyResult<Self> {
        let attention: Option<AttentionPrecision> = attention
            .map(str::parse)
            .transpose()
            .map_err(|e| to_py(py, e, Phase::Load))?;
        let config = engine_config(
            backend,
            precision,
            whitespace,
            runtime_path,
            intra_threads,
            sessions,
            max_batch_tokens,
        )
        .map_err(|e| to_py(py, e, Phase::Load))?
        .prequantized(prequantized)
        .attention(attention);
        let hub = HubOptions {
            revision,
            cache_folder,
            token,
            local_files_only,
        };
        // Loading takes from tens of milliseconds to seconds: other threads run meanwhile.
        let embedder = py
            .detach(|| build(&model, &config, &hub))
            .map_err(|e| to_py(py, e, Phase::Load))?;
        Ok(Self {
            embedder,
            model,
            backend: config.get_backend().name(),
            precision: precision.to_owned(),
            whitespace: match config.get_whitespace() {
                Whitespace::Strip => "strip",
                _ => "keep",
            },
            attention: config.get_attention(),
        })
    }

    /// Embeds `sentences` (a list of str) with the prompt `prompt` (a text) or `prompt_name`
    /// (a name in the model's prompts), else the model's default prompt, else none: a
    /// float32 array of shape (len(sentences), dim), or dim truncated to `truncate_dim`
    /// (before normalization, as sentence-transformers does).
    #[pyo3(signature = (sentences, prompt=None, prompt_name=None, normalize=false, batch_size=32, truncate_dim=None))]
    #[allow(
        clippy::too_many_arguments,
        reason = "a Python signature of keyword arguments"
    )]
    fn embed<'py>(
        &self,
        py: Python<'py>,
        sentences: &Bound<'py, PyList>,
        prompt: Option<String>,
        prompt_name: Option<String>,
        normalize: bool,
        batch_size: usize,
        truncate_dim: Option<usize>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let texts = texts_of(py, sentences)?;
        let task = match (prompt, prompt_name) {
            (Some(text), _) => Task::Prompt(text),
            (None, Some(name)) => Task::Named(name),
            // sentence-transformers applies the model's default prompt when none is named.
            (None, None) => self
                .embedder
                .prompts()
                .default_name()
                .map_or(Task::None, |name| Task::Named(name.to_owned())),
        };
        let dim = self.embedder.dim();
        let keep = truncate_dim.map_or(dim, |d| d.clamp(1, dim));
        // Truncated vectors are normalized after truncation, so the pipeline returns raw ones.
        let normalize_in_pipeline = normalize && keep == dim;
        let options = EmbedOptions::new(task).normalize(normalize_in_pipeline);
        let batching = self.embedder.batching().max_batch_size(batch_size);
        let run = || -> ruri::Result<Vec<f32>> {
            let encodings = self.embedder.tokenize(&texts, &options)?;
            let embeddings = self.embedder.embed_encodings_with_batching(
                &encodings,
                normalize_in_pipeline,
                &batching,
            )?;
            let mut data = embeddings.into_vec();
            if keep < dim {
                // Rows compacted in place: the first `keep` values of each.
                for row in 0..texts.len() {
                    data.copy_within(row * dim..row * dim + keep, row * keep);
                }
                data.truncate(texts.len() * keep);
                if normalize {
                    data.chunks_exact_mut(keep).for_each(ruri::l2_normalize);
                }
            }
            Ok(data)
        };
        let data = py.detach(run).map_err(|e| to_py(py, e, Phase::Embed))?;
        let array = ndarray::Array2::from_shape_vec((texts.len(), keep), data)
            .expect("the pipeline returns len × dim values, compacted to len × keep");
        // The array's buffer is the Vec the pipeline filled: NumPy takes it over, no copy.
        Ok(PyArray2::from_owned_array(py, array))
    }

    /// Token counts (prompt and special tokens included, after truncation), as `embed`
    /// would feed the model.
    #[pyo3(signature = (sentences, prompt=None))]
    fn token_counts(
        &self,
        py: Python<'_>,
        sentences: &Bound<'_, PyList>,
        prompt: Option<String>,
    ) -> PyResult<Vec<usize>> {
        let texts = texts_of(py, sentences)?;
        let options = EmbedOptions::new(prompt.map_or(Task::None, Task::Prompt));
        let encodings = py
            .detach(|| self.embedder.tokenize(&texts, &options))
            .map_err(|e| to_py(py, e, Phase::Embed))?;
        Ok(encodings.iter().map(ruri::Encoding::len).collect())
    }

    /// Width of the vectors.
    #[getter]
    fn dim(&self) -> usize {
        self.embedder.dim()
    }

    /// The longest input in tokens, prompt and special tokens included.
    #[getter]
    fn max_length(&self) -> usize {
        self.embedder.max_length()
    }

    /// The named prompts (name → text).
    #[getter]
    fn prompts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (name, text) in self.embedder.prompts().iter() {
            dict.set_item(name, text)?;
        }
        Ok(dict)
    }

    /// `default_prompt_name` of config_sentence_transformers.json, if any.
    #[getter]
    fn default_prompt_name(&self) -> Option<&str> {
        self.embedder.prompts().default_name()
    }

    /// The model as given: a folder or a Hub id.
    #[getter]
    fn model(&self) -> &str {
        &self.model
    }

    /// "ort" or "candle".
    #[getter]
    fn backend(&self) -> &'static str {
        self.backend
    }

    /// The precision asked for.
    #[getter]
    fn precision(&self) -> &str {
        &self.precision
    }

    /// "keep" or "strip".
    #[getter]
    fn whitespace(&self) -> &'static str {
        self.whitespace
    }

    /// How attention's products are computed: "f32", "bf16" or "int13" (the name, however it was
    /// spelled).
    #[getter]
    fn attention(&self) -> &'static str {
        self.attention.name()
    }

    /// The ONNX Runtime library this process loaded, if any.
    #[staticmethod]
    fn loaded_runtime_path() -> Option<PathBuf> {
        BackendKind::Ort.loaded_runtime_path()
    }
}

/// The texts of a list, each of which must be a `str` that is valid Unicode (no lone
/// surrogates): anything else is `ruri.InputTypeError` / `ruri.InputError` naming the item.
fn texts_of(py: Python<'_>, sentences: &Bound<'_, PyList>) -> PyResult<Vec<String>> {
    sentences
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let Ok(text) = item.cast::<PyString>() else {
                let kind = item
                    .get_type()
                    .name()
                    .map_or_else(|_| "?".to_owned(), |n| n.to_string());
                return Err(py_error(
                    py,
                    "InputTypeError",
                    format!("sentences[{i}] is of type {kind}, not str"),
                ));
            };
            // `to_cow`: on the abi3-py39 API, UTF-8 comes through a bytes object (one copy,
            // as a String needs anyway).
            match text.to_cow() {
                Ok(text) => Ok(text.into_owned()),
                Err(e) => Err(py_error(
                    py,
                    "InputError",
                    format!("sentences[{i}] is not valid Unicode text: {e}"),
                )),
            }
        })
        .collect()
}

/// The rows of a 2-D float32 array, row-major, and its width.
fn rows_of(array: &PyReadonlyArray2<'_, f32>) -> (Vec<f32>, usize) {
    let view = array.as_array();
    (view.iter().copied().collect(), view.ncols())
}

/// sentence-transformers' `quantize_embeddings` on ruri's [`ruri::Embeddings::quantize`]:
/// `vectors` (float32, n × dim) to int8 or uint8 arrays (n × dim, or n × ⌈dim / 8⌉ for the
/// binary precisions); `ranges` (2 × dim: minimums, maximums) or `calibration` (m × dim) for
/// int8 and uint8, else ranges from `vectors` themselves.
#[pyfunction]
#[pyo3(signature = (vectors, precision, ranges=None, calibration=None))]
fn quantize<'py>(
    py: Python<'py>,
    vectors: PyReadonlyArray2<'py, f32>,
    precision: &str,
    ranges: Option<PyReadonlyArray2<'py, f32>>,
    calibration: Option<PyReadonlyArray2<'py, f32>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (data, dim) = rows_of(&vectors);
    let ranges = ranges.map(|r| rows_of(&r));
    let calibration = calibration.map(|c| rows_of(&c));
    let run = || -> ruri::Result<ruri::QuantizedEmbeddings> {
        let precision: ruri::Quantization = precision.parse()?;
        let n = data.len().checked_div(dim).unwrap_or(0);
        let embeddings = ruri::Embeddings::from_parts(data, dim, vec![0; n], vec![false; n])?;
        let ranges = match (ranges, calibration) {
            (Some((r, width)), _) if r.len() == 2 * width => Some(ruri::QuantizationRanges::new(
                r[..width].to_vec(),
                r[width..].to_vec(),
            )?),
            (Some((r, width)), _) => {
                return Err(Error::InvalidOption {
                    name: "ranges",
                    value: format!(
                        "{} rows of {width}",
                        r.len().checked_div(width).unwrap_or(0)
                    ),
                    reason: "expected an array of shape (2, dim): the minimums, then the maximums",
                });
            }
            (None, Some((c, width))) => Some(ruri::QuantizationRanges::from_vectors(&c, width)?),
            (None, None) => None,
        };
        embeddings.quantize(precision, ranges.as_ref())
    };
    let q = py.detach(run).map_err(|e| to_py(py, e, Phase::Embed))?;
    let shape = (q.len(), q.row_bytes());
    if q.precision().is_signed() {
        let values = q.to_i8().expect("a signed precision");
        let array = ndarray::Array2::from_shape_vec(shape, values).expect("len × row_bytes values");
        Ok(PyArray2::from_owned_array(py, array).into_any())
    } else {
        let array =
            ndarray::Array2::from_shape_vec(shape, q.into_bytes()).expect("len × row_bytes values");
        Ok(PyArray2::from_owned_array(py, array).into_any())
    }
}

/// The extension module.
#[pymodule]
fn _ruri(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_function(wrap_pyfunction!(quantize, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    let backends: Vec<&str> = BackendKind::COMPILED.iter().map(|b| b.name()).collect();
    m.add("BACKENDS", backends)?;
    // `ruri.Embedder(backend=None)`: the loader's one choice (native whenever it is built in).
    m.add("DEFAULT_BACKEND", BackendKind::best().name())?;
    // "" without the ort backend.
    m.add(
        "ONNXRUNTIME_VERSION",
        BackendKind::Ort.runtime_version().unwrap_or_default(),
    )?;
    m.add("HUB", cfg!(feature = "hub"))?;
    Ok(())
}
