//! Scoring helpers for vectors from an [`Embedder`](crate::Embedder).

use crate::Embeddings;

/// Dot product. Equals the cosine for the unit-length vectors embedders return by default.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Cosine similarity; 0 when either vector is zero.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let norms = dot(a, a).sqrt() * dot(b, b).sqrt();
    if norms == 0.0 { 0.0 } else { dot(a, b) / norms }
}

/// The `k` rows of `corpus` most cosine-similar to `query`, best first, as `(index, score)`.
/// Ties keep corpus order; NaN scores rank last.
pub fn top_k(query: &[f32], corpus: &Embeddings, k: usize) -> Vec<(usize, f32)> {
    let mut scored: Vec<(usize, f32)> = corpus
        .iter()
        .map(|v| cosine(query, v))
        .enumerate()
        .collect();
    let by_score_desc = |a: &(usize, f32), b: &(usize, f32)| {
        let key = |s: f32| if s.is_nan() { f32::NEG_INFINITY } else { s };
        key(b.1).total_cmp(&key(a.1)).then(a.0.cmp(&b.0))
    };
    if k < scored.len() {
        scored.select_nth_unstable_by(k, by_score_desc);
        scored.truncate(k);
    }
    scored.sort_by(by_score_desc);
    scored
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_basics() {
        assert!((cosine(&[1.0, 0.0], &[1.0, 0.0]) - 1.0).abs() < 1e-7);
        assert!(cosine(&[1.0, 0.0], &[0.0, 2.0]).abs() < 1e-7);
        assert!((cosine(&[1.0, 1.0], &[-2.0, -2.0]) + 1.0).abs() < 1e-6);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
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
        let hits = top_k(&[1.0, 0.0], &corpus, 2);
        assert_eq!(hits.iter().map(|h| h.0).collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(top_k(&[1.0, 0.0], &corpus, 10).len(), 4);
        assert!(top_k(&[1.0, 0.0], &corpus, 0).is_empty());
    }
}
