//! [`TextEmbedder`]: the one type users hold, whatever the backend.

use std::cmp::Reverse;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ruri_tokenize::{Encoding, PaddedBatch, Tokenizer, Whitespace};

use crate::config::ModelConfig;
use crate::model_dir::{ModelDir, ModelTexts, Prompts};
use crate::pipeline::{
    Backend, BackendOutput, BatchOptions, l2_normalize, mean_pool, plan_batches,
};
use crate::{EmbedOptions, Embedder, Embeddings, Error, Result, Task};

/// Texts per thread below which [`TextEmbedder::tokenize`] stays on the caller's thread: a
/// thread's start costs tens of µs, a short text's tokens about 20 µs.
const TEXTS_PER_TOKENIZING_THREAD: usize = 64;

/// Texts in, vectors out, in input order: the tokenizer, the prompts, the batch limits and
/// the whitespace policy around one [`Backend`] (one dynamic call per batch).
///
/// Every backend's builder returns one (`ruri::ort::builder()`, `ruri::candle::builder()`),
/// and its methods need no trait import. It also implements [`Embedder`], for code that wants
/// to be generic over embedders or to mock one.
///
/// The pipeline: tokenize prompt + text (under the [`Whitespace`] and
/// [`Truncation`](crate::Truncation) policies) → sort by length → pack batches under the
/// [`BatchOptions`] budgets → the backend → mean pooling under the mask → L2 normalization
/// (unless asked not to) → input order.
///
/// ```
/// # use ruri_core::{Backend, BackendOutput, PaddedBatch};
/// # struct Toy; // a stand-in for ruri-ort's or ruri-candle's backend
/// # impl Backend for Toy {
/// #     fn dim(&self) -> usize { 64 }
/// #     fn forward(&self, b: &PaddedBatch) -> ruri_core::Result<BackendOutput> {
/// #         let v = ndarray::Array3::from_shape_fn((b.batch_size(), b.seq_len(), 64), |(i, j, k)| {
/// #             (b.input_ids()[i * b.seq_len() + j] as f32 * (k + 1) as f32).sin()
/// #         });
/// #         Ok(BackendOutput::TokenEmbeddings(v))
/// #     }
/// # }
/// # fn main() -> ruri_core::Result<()> {
/// use ruri_core::{ModelDir, TextEmbedder};
///
/// # let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tiny");
/// let dir = ModelDir::open(folder)?;
/// // A backend crate's builder does this (`ruri::ort::builder().build_from_dir(folder)`).
/// let embedder = TextEmbedder::load(&dir, None, || Ok(Toy))?;
/// let docs: Vec<String> = vec!["瑠璃は青い宝石です。".into(), "今日は晴れです。".into()];
/// let vectors = embedder.embed_documents(&docs)?;
/// let query = embedder.embed_query("青い石")?;
/// assert_eq!(vectors.len(), 2);
/// assert_eq!(query.len(), embedder.dim());
/// # Ok(()) }
/// ```
pub struct TextEmbedder {
    tokenizer: Tokenizer,
    prompts: Prompts,
    backend: Box<dyn Backend>,
    batching: BatchOptions,
    whitespace: Whitespace,
}

impl std::fmt::Debug for TextEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextEmbedder")
            .field("dim", &self.backend.dim())
            .field("max_length", &self.tokenizer.max_length())
            .field("batching", &self.batching)
            .field("whitespace", &self.whitespace)
            .finish_non_exhaustive()
    }
}

impl TextEmbedder {
    /// Assembles an embedder from its parts: for a backend of your own, or a stand-in in
    /// tests. `batching: None` takes the backend's [`Backend::advised_batching`].
    pub fn new(
        tokenizer: Tokenizer,
        prompts: Prompts,
        backend: impl Backend,
        batching: Option<BatchOptions>,
    ) -> Result<Self> {
        let batching = batching.unwrap_or_else(|| backend.advised_batching());
        batching.validate()?;
        if backend.dim() == 0 {
            return Err(Error::ModelOutput {
                reason: "the backend reports zero-width vectors".into(),
            });
        }
        Ok(Self {
            tokenizer,
            prompts,
            backend: Box::new(backend),
            batching,
            whitespace: Whitespace::default(),
        })
    }

    /// Loads the tokenizer of `dir` on a second thread while `build_backend` runs on this
    /// one, then assembles the embedder with the folder's prompts: a cold start costs the
    /// longer of the two instead of their sum. `batching: None` takes the backend's advice.
    pub fn load<B: Backend>(
        dir: &ModelDir,
        batching: Option<BatchOptions>,
        build_backend: impl FnOnce() -> Result<B>,
    ) -> Result<Self> {
        let (tokenizer, backend) = std::thread::scope(|scope| {
            let tokenizer = scope.spawn(|| dir.tokenizer());
            let backend = build_backend();
            let tokenizer = tokenizer
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (tokenizer, backend)
        });
        let (backend, tokenizer) = (backend?, tokenizer?);
        check_dim(&backend, dir.config(), dir.path().join("config.json"))?;
        Self::new(tokenizer, dir.prompts().clone(), backend, batching)
    }

    /// An embedder of a model given as texts ([`ModelTexts`]: no folder) and its backend,
    /// with Ruri v3's prompts. A backend whose vectors are not `config.json`'s
    /// `hidden_size` wide is [`Error::InvalidConfig`], as in [`load`](Self::load).
    /// `batching: None` takes the backend's advice.
    pub fn from_texts(
        model: ModelTexts,
        batching: Option<BatchOptions>,
        backend: impl Backend,
    ) -> Result<Self> {
        let (tokenizer, config) = model.into_parts();
        check_dim(&backend, &config, "config.json".into())?;
        Self::new(tokenizer, Prompts::default(), backend, batching)
    }

    /// This embedder with another default whitespace policy (calls may still override it
    /// with [`EmbedOptions::whitespace`]).
    #[must_use]
    pub fn with_whitespace(mut self, whitespace: Whitespace) -> Self {
        self.whitespace = whitespace;
        self
    }

    /// Width of the vectors.
    pub fn dim(&self) -> usize {
        self.backend.dim()
    }

    /// The longest input in tokens (prompt and special tokens included); longer ones are
    /// truncated or refused, as the call's [`Truncation`](crate::Truncation) says.
    pub fn max_length(&self) -> usize {
        self.tokenizer.max_length()
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The named prompts.
    pub fn prompts(&self) -> &Prompts {
        &self.prompts
    }

    /// The batch limits.
    pub fn batching(&self) -> BatchOptions {
        self.batching
    }

    /// The default whitespace policy.
    pub fn whitespace(&self) -> Whitespace {
        self.whitespace
    }

    /// The backend.
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// The backend as its concrete type, e.g. `ruri_ort::OrtBackend` to ask which ONNX file
    /// runs; `None` if it is another one.
    pub fn backend_as<B: Backend>(&self) -> Option<&B> {
        let backend: &dyn std::any::Any = &*self.backend;
        backend.downcast_ref()
    }

    /// One search query (`"検索クエリ: "`), unit length.
    pub fn embed_query(&self, query: &str) -> Result<Vec<f32>> {
        Ok(self.embed(&[query], Task::Query)?.into_vec())
    }

    /// Search queries (`"検索クエリ: "`), unit length.
    pub fn embed_queries(&self, queries: &[impl AsRef<str>]) -> Result<Embeddings> {
        self.embed(queries, Task::Query)
    }

    /// Documents to be searched (`"検索文書: "`), unit length.
    pub fn embed_documents(&self, documents: &[impl AsRef<str>]) -> Result<Embeddings> {
        self.embed(documents, Task::Document)
    }

    /// Texts for `task` with the default options (truncate, normalize, the embedder's
    /// whitespace policy).
    pub fn embed(&self, texts: &[impl AsRef<str>], task: Task) -> Result<Embeddings> {
        self.embed_with(texts, &EmbedOptions::new(task))
    }

    /// Texts with `options`; vectors come back in input order.
    pub fn embed_with(
        &self,
        texts: &[impl AsRef<str>],
        options: &EmbedOptions,
    ) -> Result<Embeddings> {
        let encodings = self.tokenize(texts, options)?;
        self.embed_encodings(&encodings, options.get_normalize())
    }

    /// Tokenizes texts as [`TextEmbedder::embed_with`] would (prompt, whitespace and
    /// truncation policies), without running the model: to count tokens, or to embed later
    /// with [`TextEmbedder::embed_encodings`].
    ///
    /// A large call is tokenized on as many threads as the backend runs batches at once
    /// ([`Backend::parallelism`]), with at least 64 texts a thread; the encodings, and the
    /// error when texts fail (the first failing text's, in input order), are those of one
    /// thread.
    pub fn tokenize(
        &self,
        texts: &[impl AsRef<str>],
        options: &EmbedOptions,
    ) -> Result<Vec<Encoding>> {
        let prompt = self.prompts.resolve(options.get_task())?;
        let truncation = options.get_truncation();
        let whitespace = options.get_whitespace().unwrap_or(self.whitespace);
        let encode = |i: usize, text: &str| {
            self.tokenizer
                .encode_with(i, prompt, text, truncation, whitespace)
                .map_err(Error::from)
        };
        let threads = self
            .backend
            .parallelism()
            .min(texts.len() / TEXTS_PER_TOKENIZING_THREAD)
            .max(1);
        if threads == 1 {
            return texts
                .iter()
                .enumerate()
                .map(|(i, text)| encode(i, text.as_ref()))
                .collect();
        }
        // As many threads as the backend runs batches at once (its cores are idle until the
        // batches start), each on a contiguous share of the texts. The shares are joined in
        // order, so the error reported is the first text's in input order, as above.
        let texts: Vec<&str> = texts.iter().map(AsRef::as_ref).collect();
        let share = texts.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let handles: Vec<_> = texts
                .chunks(share)
                .enumerate()
                .map(|(c, part)| {
                    scope.spawn(move || {
                        part.iter()
                            .enumerate()
                            .map(|(j, text)| encode(c * share + j, text))
                            .collect::<Result<Vec<Encoding>>>()
                    })
                })
                .collect();
            let mut encodings = Vec::with_capacity(texts.len());
            for handle in handles {
                let part = handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
                encodings.extend(part);
            }
            Ok(encodings)
        })
    }

    /// The old name of [`TextEmbedder::tokenize`]. It returns tokens, while `encode` in
    /// sentence-transformers (and in ruri's Python package) returns vectors.
    #[deprecated(
        since = "0.1.0",
        note = "renamed `tokenize`: it returns tokens, not vectors"
    )]
    pub fn encode(
        &self,
        texts: &[impl AsRef<str>],
        options: &EmbedOptions,
    ) -> Result<Vec<Encoding>> {
        self.tokenize(texts, options)
    }

    /// Runs already-tokenized texts: sort, batch, infer, pool, normalize, restore order.
    pub fn embed_encodings(&self, encodings: &[Encoding], normalize: bool) -> Result<Embeddings> {
        self.run_encodings(encodings, normalize, &self.batching)
    }

    /// [`TextEmbedder::embed_encodings`] under other batch limits for this call only (e.g.
    /// a caller's per-call batch size, as sentence-transformers' `encode(batch_size=…)`).
    /// Invalid limits are [`Error::InvalidOption`].
    pub fn embed_encodings_with_batching(
        &self,
        encodings: &[Encoding],
        normalize: bool,
        batching: &BatchOptions,
    ) -> Result<Embeddings> {
        batching.validate()?;
        self.run_encodings(encodings, normalize, batching)
    }

    fn run_encodings(
        &self,
        encodings: &[Encoding],
        normalize: bool,
        batching: &BatchOptions,
    ) -> Result<Embeddings> {
        if !normalize && self.backend.output_is_normalized() {
            return Err(Error::InvalidOption {
                name: "normalize",
                value: "false".into(),
                reason: "the model's only output is already L2-normalized (normalization is \
                         baked into the ONNX file), so raw mean-pooled vectors cannot be had; \
                         use an ONNX file with a token_embeddings output for raw vectors",
            });
        }
        let dim = self.backend.dim();
        let n = encodings.len();
        let mut order: Vec<usize> = (0..n).collect();
        // Longest first (stable; sentence-transformers sorts too, by characters): similar
        // lengths share a batch, so little padding; the largest batch comes first, so memory
        // peaks early.
        order.sort_by_key(|&i| Reverse(encodings[i].len()));
        let sorted_lengths: Vec<usize> = order.iter().map(|&i| encodings[i].len()).collect();

        let plan = plan_batches(&sorted_lengths, batching);
        let members = |k: usize| &order[plan[k].clone()];
        let mut data = vec![0.0f32; n * dim];
        let mut scatter = |k: usize, rows: &[f32]| {
            for (row, &i) in rows.chunks_exact(dim).zip(members(k)) {
                data[i * dim..(i + 1) * dim].copy_from_slice(row);
            }
        };
        let workers = self.backend.parallelism().clamp(1, plan.len().max(1));
        if workers == 1 {
            let mut batch = PaddedBatch::default();
            for k in 0..plan.len() {
                let rows = self.run_batch(members(k), encodings, &mut batch)?;
                scatter(k, &rows);
            }
        } else {
            // Workers take the next batch until none is left or one fails; the error of the
            // earliest failing batch is reported (the rest of the call is abandoned).
            let next = AtomicUsize::new(0);
            let failed = AtomicBool::new(false);
            let results: Vec<Vec<(usize, Result<Vec<f32>>)>> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..workers)
                    .map(|_| {
                        scope.spawn(|| {
                            let mut batch = PaddedBatch::default();
                            let mut done = Vec::new();
                            while !failed.load(Ordering::Relaxed) {
                                let k = next.fetch_add(1, Ordering::Relaxed);
                                if k >= plan.len() {
                                    break;
                                }
                                let rows = self.run_batch(members(k), encodings, &mut batch);
                                if rows.is_err() {
                                    failed.store(true, Ordering::Relaxed);
                                }
                                done.push((k, rows));
                            }
                            done
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .collect()
            });
            let mut results: Vec<(usize, Result<Vec<f32>>)> =
                results.into_iter().flatten().collect();
            results.sort_by_key(|(k, _)| *k);
            for (k, rows) in results {
                scatter(k, &rows?);
            }
        }
        if normalize {
            data.chunks_exact_mut(dim).for_each(l2_normalize);
        }
        let tokens = encodings.iter().map(Encoding::len).collect();
        let truncated = encodings.iter().map(Encoding::truncated).collect();
        Embeddings::from_parts(data, dim, tokens, truncated)
    }

    /// Pads the texts `members` (indices into `encodings`) into `batch`, runs the backend and
    /// returns one pooled, unnormalized row per member, in `members` order.
    fn run_batch(
        &self,
        members: &[usize],
        encodings: &[Encoding],
        batch: &mut PaddedBatch,
    ) -> Result<Vec<f32>> {
        let dim = self.backend.dim();
        batch.refill(
            members.iter().map(|&i| encodings[i].ids()),
            self.tokenizer.pad_id(),
        );
        match self.backend.forward(batch)? {
            BackendOutput::Pooled(pooled) => {
                check_shape(pooled.shape(), &[members.len(), dim])?;
                if !pooled.is_standard_layout() {
                    return Ok(pooled.iter().copied().collect());
                }
                // Row-major already (what backends return): keep its buffer, no copy.
                let (mut rows, offset) = pooled.into_raw_vec_and_offset();
                let start = offset.unwrap_or(0);
                rows.truncate(start + members.len() * dim);
                rows.drain(..start);
                Ok(rows)
            }
            BackendOutput::TokenEmbeddings(tokens) => {
                check_shape(tokens.shape(), &[members.len(), batch.seq_len(), dim])?;
                let mut rows = vec![0.0f32; members.len() * dim];
                // `max(1)`: a tokenizer without special tokens can give an all-empty batch,
                // whose rows then stay zero vectors.
                let masks = batch.attention_mask().chunks_exact(batch.seq_len().max(1));
                for ((seq, mask), out) in tokens
                    .outer_iter()
                    .zip(masks)
                    .zip(rows.chunks_exact_mut(dim))
                {
                    mean_pool(seq, mask, out);
                }
                Ok(rows)
            }
        }
    }
}

fn check_shape(actual: &[usize], expected: &[usize]) -> Result<()> {
    if actual != expected {
        return Err(Error::ModelOutput {
            reason: format!("expected shape {expected:?}, got {actual:?}"),
        });
    }
    Ok(())
}

impl Embedder for TextEmbedder {
    fn dim(&self) -> usize {
        TextEmbedder::dim(self)
    }

    fn embed_with(&self, texts: &[&str], options: &EmbedOptions) -> Result<Embeddings> {
        TextEmbedder::embed_with(self, texts, options)
    }
}

/// [`Error::InvalidConfig`] (at `config_path`) unless `backend`'s vectors are `config`'s
/// `hidden_size` wide.
fn check_dim(backend: &impl Backend, config: &ModelConfig, config_path: PathBuf) -> Result<()> {
    if backend.dim() == config.hidden_size {
        return Ok(());
    }
    Err(Error::InvalidConfig {
        path: config_path,
        reason: format!(
            "hidden_size {} but the model's vectors have {} dimensions",
            config.hidden_size,
            backend.dim()
        ),
    })
}
