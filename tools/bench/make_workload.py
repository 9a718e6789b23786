#!/usr/bin/env python3
"""Write the fixed, seeded benchmark workload into testdata/generated/bench/.

    .venv-testdata/bin/python tools/bench/make_workload.py            # defaults below
    python tools/bench/make_workload.py --corpus ... --tokenizer ... --out-dir ...

Outputs (the directory is git-ignored; the corpus is GPL/mixed, never commit its text):
  documents.jsonl  2,048 Japanese documents, one {"text": ...} per line
  queries.jsonl    200 short queries (5-15 characters), one {"text": ...} per line
  workload.json    seed, counts, token statistics, sha256 of both files

Documents: paragraphs are split into sentences after 。！？; a candidate is one sentence
or a run of 2-3 consecutive sentences of the same paragraph. Candidates that are mostly
Japanese (>= 60 % kana/kanji/CJK punctuation among non-space characters) and 8..64 tokens
long (with the document prompt and <s>/</s>) are kept, de-duplicated, and 2,048 are drawn
without replacement with probability proportional to exp(lambda * tokens), lambda found by
bisection so that the expected mean is the target (23 tokens); the target is corrected a
few times for the without-replacement draw until the realised mean is within 0.1. Token counts are taken with
the 102,400-piece tokenizer of the model, on prompt + text, including <s> and </s>.

Queries: 200 sentences from paragraphs that contributed no document; from each a window
of 5-15 characters is cut starting at a token boundary, trimmed of spaces/punctuation.

Everything is determined by --seed, the corpus and the tokenizer: running it twice gives
byte-identical files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
DOC_PROMPT = "検索文書: "
QUERY_PROMPT = "検索クエリ: "

_JA = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\u3000-\u303f\uff01-\uff60]")
_SENT_END = re.compile(r"(?<=[。！？])")
_TRIM = " \t\u3000、。，．・：:；;！？!?「」『』（）()[]【】\"'-—…"


def ja_ratio(s: str) -> float:
    chars = [c for c in s if not c.isspace()]
    if not chars:
        return 0.0
    return sum(1 for c in chars if _JA.match(c)) / len(chars)


def split_sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in _SENT_END.split(paragraph) if s.strip()]


def stats(counts: list[int]) -> dict:
    a = np.asarray(counts, dtype=np.float64)
    return {
        "n": int(a.size),
        "total": int(a.sum()),
        "mean": round(float(a.mean()), 3),
        "min": int(a.min()),
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "max": int(a.max()),
    }


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tilted_probs(lengths: np.ndarray, target: float) -> np.ndarray:
    """p ∝ exp(lam * len) with sum(p * len) == target (bisection on lam)."""
    x = lengths.astype(np.float64)
    x0 = x - x.mean()

    def mean_for(lam: float) -> float:
        w = np.exp(lam * x0 - np.max(lam * x0))
        return float((w * x).sum() / w.sum())

    lo, hi = -2.0, 2.0
    if not (mean_for(lo) <= target <= mean_for(hi)):
        raise SystemExit(f"target mean {target} out of reach ({mean_for(lo):.1f}..{mean_for(hi):.1f})")
    for _ in range(100):
        mid = (lo + hi) / 2
        if mean_for(mid) < target:
            lo = mid
        else:
            hi = mid
    lam = (lo + hi) / 2
    w = np.exp(lam * x0 - np.max(lam * x0))
    return w / w.sum()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=ROOT / "testdata/generated/corpus/corpus.txt")
    ap.add_argument("--tokenizer", type=Path,
                    default=ROOT / "testdata/generated/ruri-v3-30m-shape/tokenizer.json")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "testdata/generated/bench")
    ap.add_argument("--seed", type=int, default=20241130)
    ap.add_argument("--documents", type=int, default=2048)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--target-mean", type=float, default=23.0)
    ap.add_argument("--min-tokens", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()

    tok = Tokenizer.from_file(str(args.tokenizer))
    tok.no_padding()
    tok.no_truncation()
    paragraphs = [ln.strip() for ln in args.corpus.read_text(encoding="utf-8").splitlines()]
    paragraphs = [p for p in paragraphs if p]

    # Candidate documents: (paragraph index, text). Order is corpus order (deterministic).
    cands: list[tuple[int, str]] = []
    seen: set[str] = set()
    para_sents: list[list[str]] = []
    for pi, para in enumerate(paragraphs):
        sents = split_sentences(para)
        para_sents.append(sents)
        for i in range(len(sents)):
            for k in (1, 2, 3):
                if i + k > len(sents):
                    break
                text = "".join(sents[i:i + k])
                if len(text) < 8 or "\t" in text or text in seen:
                    continue
                if ja_ratio(text) < 0.6:
                    continue
                seen.add(text)
                cands.append((pi, text))

    enc = tok.encode_batch([DOC_PROMPT + t for _, t in cands], add_special_tokens=True)
    lengths = np.array([len(e.ids) for e in enc])
    keep = (lengths >= args.min_tokens) & (lengths <= args.max_tokens)
    idx = np.flatnonzero(keep)
    # Drawing without replacement pulls the realised mean below the expected one; correct
    # the target a few times, each draw from a fresh generator with the same seed.
    aim = args.target_mean
    for _ in range(8):
        rng = np.random.default_rng(args.seed)
        chosen = rng.choice(idx, size=args.documents, replace=False,
                            p=tilted_probs(lengths[idx], aim))
        realised = float(lengths[chosen].mean())
        if abs(realised - args.target_mean) < 0.1:
            break
        aim += args.target_mean - realised
    # Shuffle order is the draw order (random w.r.t. length: "fixed batches in input order"
    # then sees realistic padding).
    docs = [cands[i][1] for i in chosen]
    doc_lens = [int(lengths[i]) for i in chosen]
    used_paras = {cands[i][0] for i in chosen}
    doc_set = set(docs)

    # Queries: from sentences of paragraphs that gave no document.
    q_pool = [s for pi, sents in enumerate(para_sents) if pi not in used_paras
              for s in sents if len(s) >= 12 and ja_ratio(s) >= 0.8 and s not in doc_set]
    order = rng.permutation(len(q_pool))
    queries: list[str] = []
    q_seen: set[str] = set()
    for j in order:
        s = q_pool[j]
        e = tok.encode(s, add_special_tokens=False)
        starts = sorted({o[0] for o in e.offsets if o[0] < len(s) - 5})
        if not starts:
            continue
        st = int(starts[int(rng.integers(len(starts)))])
        n = int(rng.integers(5, 16))  # 5..15 characters
        q = s[st:st + n].strip(_TRIM)
        if not (5 <= len(q) <= 15) or ja_ratio(q) < 0.8 or q in q_seen:
            continue
        q_seen.add(q)
        queries.append(q)
        if len(queries) == args.queries:
            break
    if len(queries) < args.queries:
        raise SystemExit(f"only {len(queries)} queries found")
    q_lens = [len(e.ids) for e in tok.encode_batch([QUERY_PROMPT + q for q in queries])]

    args.out_dir.mkdir(parents=True, exist_ok=True)
    dpath, qpath = args.out_dir / "documents.jsonl", args.out_dir / "queries.jsonl"
    for path, texts in ((dpath, docs), (qpath, queries)):
        with path.open("w", encoding="utf-8", newline="\n") as f:
            for t in texts:
                f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")

    # Padding cost of naive fixed batches of 32 in input order vs length-sorted (for reference).
    def padded(lens: list[int], bs: int = 32) -> int:
        return sum(max(lens[i:i + bs]) * len(lens[i:i + bs]) for i in range(0, len(lens), bs))

    meta = {
        "seed": args.seed,
        "corpus": str(args.corpus.relative_to(ROOT)) if args.corpus.is_relative_to(ROOT) else str(args.corpus),
        "corpus_sha256": sha256(args.corpus),
        "tokenizer": str(args.tokenizer.relative_to(ROOT)) if args.tokenizer.is_relative_to(ROOT) else str(args.tokenizer),
        "tokenizer_sha256": sha256(args.tokenizer),
        "document_prompt": DOC_PROMPT,
        "query_prompt": QUERY_PROMPT,
        "token_count_includes": "prompt + text, with <s> and </s>",
        "documents": {
            "file": "documents.jsonl", "count": len(docs), "sha256": sha256(dpath),
            "chars": stats([len(t) for t in docs]),
            "tokens": stats(doc_lens),
            "candidates": int(idx.size),
            "target_mean_tokens": args.target_mean,
            "token_range": [args.min_tokens, args.max_tokens],
            "padded_tokens_fixed32_input_order": padded(doc_lens),
            "padded_tokens_sorted32": padded(sorted(doc_lens)),
        },
        "queries": {
            "file": "queries.jsonl", "count": len(queries), "sha256": sha256(qpath),
            "chars": stats([len(q) for q in queries]),
            "tokens": stats(q_lens),
        },
        "generator": "tools/bench/make_workload.py",
    }
    (args.out_dir / "workload.json").write_text(
        json.dumps(meta, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({"documents_tokens": meta["documents"]["tokens"],
                      "queries_tokens": meta["queries"]["tokens"],
                      "out_dir": str(args.out_dir)}, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
