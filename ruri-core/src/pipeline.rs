//! The pieces of the one pipeline every backend shares (the pipeline itself is
//! [`TextEmbedder`](crate::TextEmbedder)): the [`Backend`] contract, batch limits and planning,
//! mean pooling and L2 normalization.

use std::ops::Range;

use ndarray::{Array2, Array3, ArrayView2};
use ruri_tokenize::PaddedBatch;

use crate::{Error, Result};

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
/// it (tokenizing, batching, pooling, normalizing, ordering) is the [`TextEmbedder`](crate::TextEmbedder)'s.
///
/// Backends are `'static` (`Any`), so a [`TextEmbedder`](crate::TextEmbedder) can hand its backend back as the
/// concrete type ([`TextEmbedder::backend_as`](crate::TextEmbedder::backend_as)).
pub trait Backend: Send + Sync + std::any::Any {
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

    /// The batch limits this backend runs best with, used when the caller sets none: a CPU
    /// backend wants small batches that stay in cache ([`BatchOptions::default`]), a GPU one
    /// large batches that fill it.
    fn advised_batching(&self) -> BatchOptions {
        BatchOptions::default()
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
    fn advised_batching(&self) -> BatchOptions {
        (**self).advised_batching()
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
    /// stay in cache; faster and smaller than TEI's GPU-minded 16,384 tokens / 256 texts on
    /// the measured workload (figures in the repository's BENCHMARKS.md). A GPU backend
    /// advises larger ones ([`Backend::advised_batching`]).
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

    pub(crate) fn validate(&self) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;
    use proptest::prelude::*;
    use std::cmp::Reverse;

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
