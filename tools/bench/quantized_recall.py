"""Search recall of sentence-transformers' quantized embeddings against exact float32 search,
on vectors that `ruri embed` wrote (tools/bench/quantized_recall.sh makes them).

For each query: the exact top 10 by cosine over float32 document vectors; then the top 10 of
 * binary (ubinary, Hamming distance) alone;
 * binary + rescoring: the Hamming top 10 × m candidates, re-ranked by the float32 query's dot
   product with the candidates' ±1 bits (sentence-transformers' `semantic_search_faiss`
   rescoring, with binary documents);
 * binary candidates re-ranked by the exact float32 documents (kept on disk, read only for
   the candidates);
 * int8 (ranges from the documents) + rescoring: the int8 dot-product top 10 × m, re-ranked
   by the float32 query's dot product with the candidates' dequantized int8 values;
recall@10 = |found ∩ exact| / 10, averaged over queries. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def top(scores: np.ndarray, k: int) -> np.ndarray:
    idx = np.argpartition(-scores, kth=min(k, scores.shape[1]) - 1, axis=1)[:, :k]
    order = np.take_along_axis(scores, idx, axis=1).argsort(axis=1)[:, ::-1]
    return np.take_along_axis(idx, order, axis=1)


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(e)) / exact.shape[1] for f, e in zip(found, exact)]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--k", type=int, default=10)
    args = ap.parse_args()
    d = args.dir
    docs = np.load(d / "docs.npy")
    queries = np.load(d / "queries.npy")
    bits = np.load(d / "docs-ubinary.npy")
    qbits = np.load(d / "queries-ubinary.npy")
    docs_i8 = np.load(d / "docs-int8.npy").astype(np.float32)
    k = args.k
    exact = top(queries @ docs.T, k)

    dim = docs.shape[1]
    unpacked = np.unpackbits(bits, axis=1)[:, :dim].astype(np.float32) * 2 - 1
    q_unpacked = np.unpackbits(qbits, axis=1)[:, :dim].astype(np.float32) * 2 - 1
    # Hamming similarity as a dot product of ±1 vectors (dim − 2 × Hamming distance).
    hamming_scores = q_unpacked @ unpacked.T
    lo, hi = docs.min(axis=0), docs.max(axis=0)
    steps = (hi - lo) / 255
    dequantized = (docs_i8 + 128) * steps + lo
    q_i8 = np.clip(np.floor((queries - lo) / steps), 0, 255) - 128

    rows = [("float32 (exact)", 1.0, docs.nbytes)]
    rows.append(("binary, Hamming only", recall(top(hamming_scores, k), exact), bits.nbytes))
    for m in (2, 4, 10):
        cand = top(hamming_scores, k * m)
        scores = np.einsum("qd,qcd->qc", queries, unpacked[cand])
        found = np.take_along_axis(cand, top(scores, k), axis=1)
        rows.append((f"binary + rescoring (×{m} candidates)", recall(found, exact), bits.nbytes))
    for m in (4, 10):
        cand = top(hamming_scores, k * m)
        scores = np.einsum("qd,qcd->qc", queries, docs[cand])
        found = np.take_along_axis(cand, top(scores, k), axis=1)
        rows.append((f"binary candidates (×{m}), float32 documents re-rank", recall(found, exact), bits.nbytes))
    int8_scores = q_i8 @ docs_i8.T
    rows.append(("int8, int8 dot product only", recall(top(int8_scores, k), exact), docs_i8.size))
    for m in (2, 4):
        cand = top(int8_scores, k * m)
        scores = np.einsum("qd,qcd->qc", queries, dequantized[cand])
        found = np.take_along_axis(cand, top(scores, k), axis=1)
        rows.append((f"int8 + rescoring (×{m} candidates)", recall(found, exact), docs_i8.size))

    print(f"{queries.shape[0]} queries, {docs.shape[0]} documents, {dim} dimensions, recall@{k}")
    print()
    print("| index | recall@%d | index bytes |" % k)
    print("|---|---:|---:|")
    for name, r, nbytes in rows:
        print(f"| {name} | {r:.3f} | {nbytes:,} |")


if __name__ == "__main__":
    main()
