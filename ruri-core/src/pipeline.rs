//! The one pipeline every backend shares: tokenize → sort by length → pack batches under a
//! token budget → backend → mean pooling → L2 normalization → input order.

use std::cmp::Reverse;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ndarray::{Array2, Array3, ArrayView2};
use ruri_tokenize::{Encoding, PaddedBatch, Tokenizer, Whitespace};

use crate::model_dir::{ModelDir, Prompts};
use crate::{EmbedOptions, Embedder, Embeddings, Error, Result};

/// What a backend returns for a padded batch.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendOutput {
    /// `batch × dim`: already mean-pooled under the attention mask (e.g. an ONNX model's
    /// `sentence_embedding` output), not normalized.
    Pooled(Array2<f32>),
    /// `batch × seq_len × dim`: the last hidden states; the pipeline mean-pools them.
    TokenEmbeddings(Array3<f32>),
}

/// An inference engine: turns a padded batch of token ids into vectors. Everything around
/// it (tokenizing, batching, pooling, normalizing, ordering) is the [`Pipeline`]'s.
pub trait Backend: Send + Sync {
    /// Width of the vectors (the model's hidden size).
    fn dim(&self) -> usize;

    /// Runs the model on one padded batch.
    fn forward(&self, batch: &PaddedBatch) -> Result<BackendOutput>;

    /// How many [`Backend::forward`] calls can usefully run at once (e.g. one per session of
    /// a pool). The pipeline runs the batches of one call on that many threads; the default,
    /// 1, runs them one after another on the caller's thread.
    fn parallelism(&self) -> usize {
        1
    }

    /// Whether [`BackendOutput::Pooled`] rows come already L2-normalized (an ONNX export
    /// with the normalization baked into its only output), so that raw vectors cannot be
    /// had: the pipeline then refuses `normalize(false)` instead of returning unit vectors
    /// as if they were raw. Default: `false`.
    fn output_is_normalized(&self) -> bool {
        false
    }
}

impl<T: Backend + ?Sized> Backend for Box<T> {
    fn dim(&self) -> usize {
        (**self).dim()
    }
    fn forward(&self, batch: &PaddedBatch) -> Result<BackendOutput> {
        (**self).forward(batch)
    }
    fn parallelism(&self) -> usize {
        (**self).parallelism()
    }
    fn output_is_normalized(&self) -> bool {
        (**self).output_is_normalized()
    }
}

/// Limits on the batches sent to a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchOptions {
    max_batch_tokens: usize,
    max_batch_size: usize,
    max_batch_attention: usize,
}

impl Default for BatchOptions {
    /// 8,192 padded tokens and at most 32 texts per batch: tuned on CPU, where small batches
    /// stay in cache. On 2 cores with the ruri-v3-30m shape (ort int8, 2,048 short
    /// documents) they ran 1.4× faster than TEI's GPU-minded 16,384 tokens / 256 texts and
    /// peaked at 354 MB instead of 808 MB (BENCHMARKS.md). On a GPU, raise both.
    ///
    /// Attention cells (`texts × longest²`) are capped at 2,097,152 (8,192 × 256): the
    /// cap only binds on texts over 256 tokens, where attention score tensors (which grow with
    /// the square of the length and which ONNX Runtime's dense attention materializes) set
    /// the memory peak; 512-token texts then go 8 to a batch instead of 16.
    fn default() -> Self {
        Self {
            max_batch_tokens: 8_192,
            max_batch_size: 32,
            max_batch_attention: 8_192 * 256,
        }
    }
}

impl BatchOptions {
    /// Budget of padded tokens (`texts × longest`) per batch. A single text longer than the
    /// budget still runs, alone. Must be positive.
    pub fn max_batch_tokens(mut self, tokens: usize) -> Self {
        self.max_batch_tokens = tokens;
        self
    }

    /// Most texts per batch. Must be positive.
    pub fn max_batch_size(mut self, texts: usize) -> Self {
        self.max_batch_size = texts;
        self
    }

    /// Budget of attention cells (`texts × longest²`, per head and layer) per batch: bounds
    /// the memory of attention scores, which grows with the square of the length. A single
    /// text over the budget still runs, alone. Must be positive.
    pub fn max_batch_attention(mut self, cells: usize) -> Self {
        self.max_batch_attention = cells;
        self
    }

    /// The attention-cell budget.
    pub fn get_max_batch_attention(&self) -> usize {
        self.max_batch_attention
    }

    /// The token budget.
    pub fn get_max_batch_tokens(&self) -> usize {
        self.max_batch_tokens
    }

    /// The text cap.
    pub fn get_max_batch_size(&self) -> usize {
        self.max_batch_size
    }

    fn validate(&self) -> Result<()> {
        if self.max_batch_tokens == 0 {
            return Err(Error::InvalidOption {
                name: "max_batch_tokens",
                value: "0".into(),
                reason: "must be positive",
            });
        }
        if self.max_batch_size == 0 {
            return Err(Error::InvalidOption {
                name: "max_batch_size",
                value: "0".into(),
                reason: "must be positive",
            });
        }
        if self.max_batch_attention == 0 {
            return Err(Error::InvalidOption {
                name: "max_batch_attention",
                value: "0".into(),
                reason: "must be positive",
            });
        }
        Ok(())
    }
}

/// Splits texts already sorted by descending length into consecutive batches such that each
/// holds at most `max_batch_size` texts, `count × longest ≤ max_batch_tokens` and
/// `count × longest² ≤ max_batch_attention` (a text alone over a budget gets a batch of its
/// own).
pub fn plan_batches(sorted_lengths: &[usize], options: &BatchOptions) -> Vec<Range<usize>> {
    let mut batches = Vec::new();
    let mut start = 0;
    while start < sorted_lengths.len() {
        // Descending order: the first text of a batch is its longest.
        let longest = sorted_lengths[start].max(1);
        let by_attention = options.max_batch_attention / longest.saturating_mul(longest);
        let fit = (options.max_batch_tokens / longest)
            .min(by_attention)
            .clamp(1, options.max_batch_size);
        let end = (start + fit).min(sorted_lengths.len());
        batches.push(start..end);
        start = end;
    }
    batches
}

/// Mean of `tokens` rows where `mask` is non-zero, into `out`; as sentence-transformers'
/// `Pooling` (sum of masked rows divided by the count, clamped at 1e-9).
pub fn mean_pool(tokens: ArrayView2<'_, f32>, mask: &[i64], out: &mut [f32]) {
    out.fill(0.0);
    let mut count = 0usize;
    for (row, &m) in tokens.rows().into_iter().zip(mask) {
        if m != 0 {
            count += 1;
            for (o, &x) in out.iter_mut().zip(row) {
                *o += x;
            }
        }
    }
    let denominator = (count as f32).max(1e-9);
    for o in out.iter_mut() {
        *o /= denominator;
    }
}

/// Scales `v` to unit L2 norm; a zero vector stays zero (torch's
/// `F.normalize(eps=1e-12)`, which sentence-transformers' `normalize_embeddings` uses).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    for x in v.iter_mut() {
        *x /= norm;
    }
}

/// The shared pipeline around a [`Backend`]: it is the [`Embedder`] every backend crate
/// wraps.
#[derive(Debug)]
pub struct Pipeline<B> {
    tokenizer: Tokenizer,
    prompts: Prompts,
    backend: B,
    batching: BatchOptions,
    whitespace: Whitespace,
}

impl<B: Backend> Pipeline<B> {
    /// Assembles a pipeline from its parts.
    pub fn new(
        tokenizer: Tokenizer,
        prompts: Prompts,
        backend: B,
        batching: BatchOptions,
    ) -> Result<Self> {
        batching.validate()?;
        if backend.dim() == 0 {
            return Err(Error::ModelOutput {
                reason: "the backend reports zero-width vectors".into(),
            });
        }
        Ok(Self {
            tokenizer,
            prompts,
            backend,
            batching,
            whitespace: Whitespace::default(),
        })
    }

    /// This pipeline with another default whitespace policy (calls may still override it
    /// with [`EmbedOptions::whitespace`]).
    pub fn with_whitespace(mut self, whitespace: Whitespace) -> Self {
        self.whitespace = whitespace;
        self
    }

    /// The default whitespace policy.
    pub fn whitespace(&self) -> Whitespace {
        self.whitespace
    }

    /// A pipeline with the tokenizer and prompts of `dir`.
    pub fn from_model_dir(dir: &ModelDir, backend: B, batching: BatchOptions) -> Result<Self> {
        Self::load(dir, batching, move || Ok(backend))
    }

    /// Loads the tokenizer of `dir` on a second thread while `build_backend` runs on this
    /// one, then assembles the pipeline: a cold start costs the longer of the two instead of
    /// their sum (Ruri's 102,400-piece tokenizer ≈ 40 ms, an int8 ONNX Runtime session of
    /// the 30m shape ≈ 250 ms).
    pub fn load(
        dir: &ModelDir,
        batching: BatchOptions,
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
        if backend.dim() != dir.config().hidden_size {
            return Err(Error::InvalidConfig {
                path: dir.path().join("config.json"),
                reason: format!(
                    "hidden_size {} but the model's vectors have {} dimensions",
                    dir.config().hidden_size,
                    backend.dim()
                ),
            });
        }
        Self::new(tokenizer, dir.prompts().clone(), backend, batching)
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The named prompts.
    pub fn prompts(&self) -> &Prompts {
        &self.prompts
    }

    /// The batching limits.
    pub fn batching(&self) -> BatchOptions {
        self.batching
    }

    /// Runs already-tokenized texts: sort, batch, infer, pool, normalize, restore order.
    pub fn embed_encodings(&self, encodings: &[Encoding], normalize: bool) -> Result<Embeddings> {
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

        let plan = plan_batches(&sorted_lengths, &self.batching);
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
        Ok(Embeddings::new(data, dim, tokens, truncated))
    }
}

impl<B: Backend> Pipeline<B> {
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

impl<B: Backend> Embedder for Pipeline<B> {
    fn dim(&self) -> usize {
        self.backend.dim()
    }

    fn embed_with(&self, texts: &[&str], options: &EmbedOptions) -> Result<Embeddings> {
        let prompt = self.prompts.resolve(options.get_task())?;
        let truncation = options.get_truncation();
        let whitespace = options.get_whitespace().unwrap_or(self.whitespace);
        let encodings = texts
            .iter()
            .enumerate()
            .map(|(i, text)| {
                self.tokenizer
                    .encode_with(i, prompt, text, truncation, whitespace)
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.embed_encodings(&encodings, options.get_normalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;
    use proptest::prelude::*;

    #[test]
    fn plan_respects_budget_and_cap() {
        let opts = BatchOptions::default()
            .max_batch_tokens(10)
            .max_batch_size(3);
        // 5×2=10 fits; then 4,4 → 2 fit (3×4=12 > 10); then 1,1,1,1 → cap 3; then 1.
        let plan = plan_batches(&[5, 5, 4, 4, 1, 1, 1, 1], &opts);
        assert_eq!(plan, vec![0..2, 2..4, 4..7, 7..8]);
    }

    #[test]
    fn attention_budget_binds_only_on_long_texts() {
        let opts = BatchOptions::default();
        // 64 tokens: 8,192 / 64 = 128 by tokens, 512 by attention → the 32-text cap.
        assert_eq!(plan_batches(&[64; 40], &opts), vec![0..32, 32..40]);
        // 512 tokens: 16 by tokens, 2,097,152 / 512² = 8 by attention.
        assert_eq!(plan_batches(&[512; 20], &opts), vec![0..8, 8..16, 16..20]);
        // 2,048 tokens: alone.
        assert_eq!(plan_batches(&[2048; 2], &opts), vec![0..1, 1..2]);
        // The old behaviour on request.
        let loose = opts.max_batch_attention(usize::MAX);
        assert_eq!(plan_batches(&[512; 20], &loose), vec![0..16, 16..20]);
    }

    #[test]
    fn oversize_text_runs_alone() {
        let opts = BatchOptions::default().max_batch_tokens(8);
        assert_eq!(plan_batches(&[100, 3, 3], &opts), vec![0..1, 1..3]);
        assert!(plan_batches(&[], &opts).is_empty());
    }

    #[test]
    fn mean_pool_ignores_padding() {
        let tokens = array![[1.0f32, 2.0], [3.0, 4.0], [100.0, 100.0]];
        let mut out = [0.0; 2];
        mean_pool(tokens.view(), &[1, 1, 0], &mut out);
        assert_eq!(out, [2.0, 3.0]);
    }

    #[test]
    fn normalize_unit_and_zero() {
        let mut v = [3.0f32, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut z = [0.0f32; 3];
        l2_normalize(&mut z);
        assert_eq!(z, [0.0; 3]);
    }

    proptest! {
        #[test]
        fn plan_covers_every_text_once_within_limits(
            mut lengths in proptest::collection::vec(1usize..600, 0..300),
            budget in 1usize..5000,
            cap in 1usize..64,
            cells in 1usize..400_000,
        ) {
            lengths.sort_by_key(|&l| Reverse(l));
            let opts = BatchOptions::default()
                .max_batch_tokens(budget)
                .max_batch_size(cap)
                .max_batch_attention(cells);
            let plan = plan_batches(&lengths, &opts);
            let mut next = 0;
            for r in &plan {
                prop_assert_eq!(r.start, next);
                prop_assert!(r.end > r.start);
                prop_assert!(r.len() <= cap);
                let padded = r.len() * lengths[r.start];
                prop_assert!(padded <= budget || r.len() == 1);
                let attention = padded * lengths[r.start];
                prop_assert!(attention <= cells || r.len() == 1);
                next = r.end;
            }
            prop_assert_eq!(next, lengths.len());
        }
    }
}
