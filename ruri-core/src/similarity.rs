//! Scoring helpers for vectors from an [`Embedder`](crate::Embedder).
//!
//! Vectors of different lengths (two models' vectors, or a vector and something else) have
//! no score: each helper returns [`Error::DimensionMismatch`] rather than comparing the
//! common prefix.

use crate::{Embeddings, Error, Result};

fn same_length(a: &[f32], b: &[f32]) -> Result<()> {
    if a.len() == b.len() {
        Ok(())
    } else {
        Err(Error::DimensionMismatch {
            left: a.len(),
            right: b.len(),
        })
    }
}

fn dot_unchecked(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Dot product. Equals the cosine for the unit-length vectors embedders return by default.
/// Vectors of different lengths are [`Error::DimensionMismatch`].
///
/// ```
/// assert_eq!(ruri_core::dot(&[1.0, 2.0], &[3.0, 4.0])?, 11.0);
/// assert!(matches!(
///     ruri_core::dot(&[1.0, 2.0], &[3.0]),
///     Err(ruri_core::Error::DimensionMismatch { left: 2, right: 1 })
/// ));
/// # Ok::<(), ruri_core::Error>(())
/// ```
pub fn dot(a: &[f32], b: &[f32]) -> Result<f32> {
    same_length(a, b)?;
    Ok(dot_unchecked(a, b))
}

/// Cosine similarity; 0 when either vector is zero. Vectors of different lengths are
/// [`Error::DimensionMismatch`].
pub fn cosine(a: &[f32], b: &[f32]) -> Result<f32> {
    same_length(a, b)?;
    let norms = dot_unchecked(a, a).sqrt() * dot_unchecked(b, b).sqrt();
    Ok(if norms == 0.0 {
        0.0
    } else {
        dot_unchecked(a, b) / norms
    })
}

/// The `k` rows of `corpus` most cosine-similar to `query`, best first, as `(index, score)`.
/// Ties keep corpus order; NaN scores rank last. A query whose length is not the corpus's
/// dimension is [`Error::DimensionMismatch`] (an empty corpus included: its dimension is
/// still its model's).
pub fn top_k(query: &[f32], corpus: &Embeddings, k: usize) -> Result<Vec<(usize, f32)>> {
    if query.len() != corpus.dim() {
        return Err(Error::DimensionMismatch {
            left: query.len(),
            right: corpus.dim(),
        });
    }
    let mut scored: Vec<(usize, f32)> = corpus
        .iter()
        .map(|v| cosine(query, v))
        .enumerate()
        .map(|(i, score)| score.map(|s| (i, s)))
        .collect::<Result<_>>()?;
    let by_score_desc = |a: &(usize, f32), b: &(usize, f32)| {
        let key = |s: f32| if s.is_nan() { f32::NEG_INFINITY } else { s };
        key(b.1).total_cmp(&key(a.1)).then(a.0.cmp(&b.0))
    };
    if k < scored.len() {
        scored.select_nth_unstable_by(k, by_score_desc);
        scored.truncate(k);
    }
    scored.sort_by(by_score_desc);
    Ok(scored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_basics() {
        let cosine = |a: &[f32], b: &[f32]| cosine(a, b).unwrap();
        assert!((cosine(&[1.0, 0.0], &[1.0, 0.0]) - 1.0).abs() < 1e-7);
        assert!(cosine(&[1.0, 0.0], &[0.0, 2.0]).abs() < 1e-7);
        assert!((cosine(&[1.0, 1.0], &[-2.0, -2.0]) + 1.0).abs() < 1e-6);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
        assert_eq!(dot(&[1.0, -2.0, 0.5], &[4.0, 1.0, 2.0]).unwrap(), 3.0);
    }

    /// Zipping would have scored the common prefix: [1, 0] · [1, 0, 5] = 1, a "perfect"
    /// cosine for vectors that are not even of one model.
    #[test]
    fn vectors_of_different_lengths_are_refused() {
        let mismatch = |r: Result<f32>| match r {
            Err(Error::DimensionMismatch { left, right }) => (left, right),
            other => panic!("expected DimensionMismatch, got {other:?}"),
        };
        assert_eq!(mismatch(dot(&[1.0, 0.0], &[1.0, 0.0, 5.0])), (2, 3));
        assert_eq!(mismatch(cosine(&[1.0, 0.0, 5.0], &[1.0, 0.0])), (3, 2));
        assert_eq!(mismatch(dot(&[], &[1.0])), (0, 1));
        let corpus =
            Embeddings::from_parts(vec![1.0, 0.0, 0.0, 1.0], 2, vec![2; 2], vec![false; 2])
                .unwrap();
        match top_k(&[1.0, 0.0, 0.0], &corpus, 1) {
            Err(Error::DimensionMismatch { left: 3, right: 2 }) => {}
            other => panic!("expected DimensionMismatch, got {other:?}"),
        }
        let empty = Embeddings::from_parts(vec![], 2, vec![], vec![]).unwrap();
        assert!(matches!(
            top_k(&[1.0], &empty, 1),
            Err(Error::DimensionMismatch { left: 1, right: 2 })
        ));
        assert!(top_k(&[1.0, 0.0], &empty, 1).unwrap().is_empty());
    }

    #[test]
    fn top_k_orders_and_truncates() {
        let corpus = Embeddings::from_parts(
            vec![1.0, 0.0, 0.0, 1.0, 0.7, 0.7, -1.0, 0.0],
            2,
            vec![2; 4],
            vec![false; 4],
        )
        .unwrap();
        let hits = top_k(&[1.0, 0.0], &corpus, 2).unwrap();
        assert_eq!(hits.iter().map(|h| h.0).collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(top_k(&[1.0, 0.0], &corpus, 10).unwrap().len(), 4);
        assert!(top_k(&[1.0, 0.0], &corpus, 0).unwrap().is_empty());
    }
}
