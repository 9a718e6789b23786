//! The [`Embedder`] trait and the types of its requests and results.

use std::sync::Arc;

use ndarray::ArrayView2;

use crate::{Result, Truncation, Whitespace};

/// What the texts are for; selects the Ruri prompt prepended to each text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Task {
    /// No prompt (semantic similarity).
    #[default]
    None,
    /// `"検索クエリ: "`: search queries.
    Query,
    /// `"検索文書: "`: documents to be searched.
    Document,
    /// `"トピック: "`: classification and clustering.
    Topic,
    /// A prompt by its name in `config_sentence_transformers.json` (sentence-transformers'
    /// `prompt_name`).
    Named(String),
    /// A raw prompt text prepended as is.
    Prompt(String),
}

/// How to embed: task, normalization, truncation and whitespace policy.
///
/// The default is sentence-transformers' behaviour with unit-length output: no prompt,
/// truncate over-long texts, L2-normalize, and the embedder's whitespace policy (by default
/// [`Whitespace::Keep`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbedOptions {
    task: Task,
    normalize: bool,
    truncation: Truncation,
    whitespace: Option<Whitespace>,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        Self {
            task: Task::None,
            normalize: true,
            truncation: Truncation::Truncate,
            whitespace: None,
        }
    }
}

impl EmbedOptions {
    /// Default options for `task`.
    pub fn new(task: Task) -> Self {
        Self {
            task,
            ..Self::default()
        }
    }

    /// Sets the task.
    pub fn task(mut self, task: Task) -> Self {
        self.task = task;
        self
    }

    /// `true` (default): unit-length vectors, ready for cosine as a dot product. `false`: the
    /// raw mean-pooled vectors, as sentence-transformers returns by default.
    pub fn normalize(mut self, normalize: bool) -> Self {
        self.normalize = normalize;
        self
    }

    /// What to do with texts longer than the model's maximum length.
    pub fn truncation(mut self, truncation: Truncation) -> Self {
        self.truncation = truncation;
        self
    }

    /// Keep or strip whitespace at the ends of prompt + text for this call, instead of the
    /// embedder's policy (see [`Whitespace`] for which sentence-transformers versions do
    /// which).
    pub fn whitespace(mut self, whitespace: Whitespace) -> Self {
        self.whitespace = Some(whitespace);
        self
    }

    /// The whitespace policy set for this call, if any (else the embedder's applies).
    pub fn get_whitespace(&self) -> Option<Whitespace> {
        self.whitespace
    }

    /// The task.
    pub fn get_task(&self) -> &Task {
        &self.task
    }

    /// Whether vectors are L2-normalized.
    pub fn get_normalize(&self) -> bool {
        self.normalize
    }

    /// The truncation policy.
    pub fn get_truncation(&self) -> Truncation {
        self.truncation
    }
}

/// Vectors of several texts, in input order, as one contiguous `len × dim` buffer, with each
/// text's token count and whether it was truncated.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    data: Vec<f32>,
    dim: usize,
    tokens: Vec<usize>,
    truncated: Vec<bool>,
}

impl Embeddings {
    /// Assembles a result from its parts (a stand-in [`Embedder`] in tests builds its answers
    /// this way): `data` is `len × dim` row-major, with one token count and one truncation
    /// flag per vector. Inconsistent parts are [`Error::InvalidOption`](crate::Error).
    pub fn from_parts(
        data: Vec<f32>,
        dim: usize,
        tokens: Vec<usize>,
        truncated: Vec<bool>,
    ) -> Result<Self> {
        let invalid = |name, value: usize, reason| crate::Error::InvalidOption {
            name,
            value: value.to_string(),
            reason,
        };
        if dim == 0 {
            return Err(invalid(
                "dim",
                0,
                "vectors must have at least one dimension",
            ));
        }
        if truncated.len() != tokens.len() {
            return Err(invalid(
                "truncated",
                truncated.len(),
                "one truncation flag per vector is needed",
            ));
        }
        if data.len() != tokens.len() * dim {
            return Err(invalid(
                "data",
                data.len(),
                "data must hold tokens.len() × dim values",
            ));
        }
        Ok(Self {
            data,
            dim,
            tokens,
            truncated,
        })
    }

    /// Number of vectors.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Length of each vector.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The vector of text `i`, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<&[f32]> {
        (i < self.len()).then(|| &self.data[i * self.dim..(i + 1) * self.dim])
    }

    /// Vectors in input order.
    pub fn iter(&self) -> std::slice::ChunksExact<'_, f32> {
        // dim > 0: the pipeline refuses zero-width models before building any result.
        self.data.chunks_exact(self.dim)
    }

    /// All vectors, row-major.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// All vectors as an `len × dim` array view.
    pub fn as_array(&self) -> ArrayView2<'_, f32> {
        ArrayView2::from_shape((self.len(), self.dim), &self.data)
            .expect("data.len() == len × dim by construction")
    }

    /// Tokens fed to the model for text `i` (special tokens and prompt included).
    pub fn tokens(&self, i: usize) -> Option<usize> {
        self.tokens.get(i).copied()
    }

    /// Token counts of all texts.
    pub fn token_counts(&self) -> &[usize] {
        &self.tokens
    }

    /// Whether text `i` was truncated.
    pub fn truncated(&self, i: usize) -> Option<bool> {
        self.truncated.get(i).copied()
    }

    /// Truncation flags of all texts.
    pub fn truncated_flags(&self) -> &[bool] {
        &self.truncated
    }

    /// The vectors as one row-major buffer.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }

    /// The vectors, one `Vec` each.
    pub fn to_vecs(&self) -> Vec<Vec<f32>> {
        self.iter().map(<[f32]>::to_vec).collect()
    }
}

/// Turns texts into vectors. Every backend's embedder implements it; code that embeds should
/// depend on this trait, not on a backend.
///
/// Two methods are required; the rest are conveniences over [`Embedder::embed_with`].
///
/// ```
/// use ruri_core::{Embedder, Task, cosine};
///
/// fn best_document(embedder: &dyn Embedder, query: &str, docs: &[&str]) -> ruri_core::Result<usize> {
///     let q = embedder.embed_query(query)?;
///     let d = embedder.embed_documents(docs)?;
///     let scores = d.iter().map(|v| cosine(&q, v)).collect::<ruri_core::Result<Vec<f32>>>()?;
///     Ok(scores
///         .iter()
///         .enumerate()
///         .max_by(|a, b| a.1.total_cmp(b.1))
///         .map_or(0, |(i, _)| i))
/// }
/// ```
pub trait Embedder: Send + Sync {
    /// Length of the vectors.
    fn dim(&self) -> usize;

    /// Embeds `texts` with `options`; vectors come back in input order.
    fn embed_with(&self, texts: &[&str], options: &EmbedOptions) -> Result<Embeddings>;

    /// Embeds `texts` for `task` with the default options (truncate, normalize).
    fn embed(&self, texts: &[&str], task: Task) -> Result<Embeddings> {
        self.embed_with(texts, &EmbedOptions::new(task))
    }

    /// One search query (`"検索クエリ: "`), unit length.
    fn embed_query(&self, query: &str) -> Result<Vec<f32>> {
        Ok(self.embed(&[query], Task::Query)?.into_vec())
    }

    /// Search queries (`"検索クエリ: "`), unit length.
    fn embed_queries(&self, queries: &[&str]) -> Result<Embeddings> {
        self.embed(queries, Task::Query)
    }

    /// Documents to be searched (`"検索文書: "`), unit length.
    fn embed_documents(&self, documents: &[&str]) -> Result<Embeddings> {
        self.embed(documents, Task::Document)
    }
}

/// Every method is forwarded, the provided ones included, so a `&T`, `Box<T>` or `Arc<T>`
/// behaves exactly like `T` even where `T` overrides a provided method.
macro_rules! forward_embedder {
    ($($ty:ty),*) => {$(
        impl<T: Embedder + ?Sized> Embedder for $ty {
            fn dim(&self) -> usize {
                (**self).dim()
            }
            fn embed_with(&self, texts: &[&str], options: &EmbedOptions) -> Result<Embeddings> {
                (**self).embed_with(texts, options)
            }
            fn embed(&self, texts: &[&str], task: Task) -> Result<Embeddings> {
                (**self).embed(texts, task)
            }
            fn embed_query(&self, query: &str) -> Result<Vec<f32>> {
                (**self).embed_query(query)
            }
            fn embed_queries(&self, queries: &[&str]) -> Result<Embeddings> {
                (**self).embed_queries(queries)
            }
            fn embed_documents(&self, documents: &[&str]) -> Result<Embeddings> {
                (**self).embed_documents(documents)
            }
        }
    )*};
}
forward_embedder!(&T, Box<T>, Arc<T>);
