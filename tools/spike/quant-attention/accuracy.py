#!/usr/bin/env python3
"""What quantizing attention's two products would cost in accuracy (issue 21, the long text).

ruri-native computes attention in exact f32 (no FMA, fixed order) at every precision; on one
8,192-token text that is ~90 % of native_int8's time, and the target (0.5x fused_int8's time)
needs attention's products in int8 or bf16. This spike measures, in NumPy, how far the vectors
move when they are quantized, before anyone builds it:

  * fp32     attention as transformers computes it (float32 matrix products);
  * f64      the same in float64, rounded at the end: how much the model moves when nothing
             but f32 rounding changes (its sensitivity, the floor for every other row);
  * qk8      scores from int8 q and k: per (token, head) row, symmetric 8-bit, rint (the
             engine's activation scheme), exact integer products, times both scales;
  * qk8s     qk8 after subtracting each head's mean key over the text (SageAttention's
             smoothing: softmax is unchanged by a per-query constant, so it is exact before
             rounding);
  * qk8+pv8  qk8, and the weighted sum from 8-bit probabilities (per query row, 0..127, scale
             max/127) and 8-bit values (per channel over the keys, symmetric);
  * qk8+pvu8 the same with probabilities on 0..255 (scale max/255: unsigned, as AMX/VNNI take
             their left operand);
  * qk8+pvbf bf16 probabilities and values (round to nearest even), products summed in f32;
  * qk13     scores from 13-bit q and k (±4,095 per row, as qk8 otherwise): exact in i32 with
             16-bit multiply-adds; qk16 the same on ±32,767;
  * qk13+pv13 and the weighted sum from probabilities on 0..4,095 per row and values on
             ±4,095 per channel (sums of 32 such products fit i32); +pv16 on 32,767;
  * qk13+pe12 the exps (largest 1) on 0..4,095, values on ±4,095 per channel, divided by the
             rounded exps' total (all integer until that division); +pe15 the exps on 0..32,767;
  * qkbf     scores from bf16 q and k (products exact in f32, summed in f32);
  * pvbf     f32 scores, bf16 probabilities and values; qkbf+pvbf both.
A bf16 product is exact in f32, so a fused multiply-add gives the same bits as a multiply and
an add: bf16 operands would let attention use FMA (2x) and stay bit-identical everywhere.

The linears are float32 in every variant (so only attention differs). Reported: the cosine of
each variant's pooled, normalized vector to fp32's, with and without the model's planted
outlier channel (which holds most of every unit vector and inflates cosines; testdata/README.md).

This is a random-weight model in the real 30m layout (tools/testdata/generate.sh 30m). Its
attention is nearly uniform (the script prints each query's median largest probability: about
0.2 on the global layers), the easy case for every variant. --sharpen multiplies the query
projections (the same in every variant, fp32 included), which makes attention peaked the way a
trained model's often is (x3: largest probability about 0.7; x8: about 0.99) and the scores'
range wide; that is where quantized scores lose. A trained model can differ either way: these
figures decide what is worth building, they are no quality claim.

    .venv-testdata/bin/python tools/spike/quant-attention/accuracy.py \
        [--tokens 8192] [--docs 64] [--sharpen 3] [--variants f64,qk8,qkbf+pvbf]

8,192 tokens take about 12 minutes for six variants (2 cores); 2,048 about 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

F = np.float32
MODEL = Path("testdata/generated/ruri-v3-30m-shape")
DOCS = Path("testdata/generated/bench/documents.jsonl")


def layer_norm(x, w, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return ((x - m) / np.sqrt(v + eps) * w).astype(F)


def gelu(x):
    from scipy.special import erf
    return (0.5 * x * (1 + erf(x / np.sqrt(2)))).astype(F)


def rope(x, theta, pos):
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    ang = pos[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, 1)[:, None, :].astype(F)
    sin = np.concatenate([np.sin(ang)] * 2, 1)[:, None, :].astype(F)
    half = d // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return (x * cos + rot * sin).astype(F)


def quant_rows(x, levels=127, axis=1):
    """Symmetric per-row (axis=1) or per-column (axis=0) rint quantization: (q as f64, scale)."""
    m = np.max(np.abs(x), axis=axis, keepdims=True).astype(np.float64)
    s = np.where(m == 0, 1.0, m / levels)
    return np.clip(np.rint(x / s), -levels, levels), s


def bf16(x):
    b = x.astype(F).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(F)


# Integer scores wider than int8: `qk13` is q and k on ±4,095 per row (13 bits: 64 products
# of two such values and their pairwise sums stay inside i32, as `vpdpwssd`/`vpmaddwd` need),
# `qk16` on ±32,767 (i64 sums; the bound of 16-bit operands).
QK_LEVELS = {"qk13": 4095, "qk16": 32767}


def attention(q, k, v, far, scale, variant):
    """One head: q, k, v (n, d) float32; far: (n, n) bool mask of keys outside the window."""
    if variant == "f64":
        # The noise floor: the same attention with float64 products and softmax, rounded to
        # float32 at the end (only f32 rounding differs from fp32).
        q, k, v = (a.astype(np.float64) for a in (q, k, v))
        s = (q @ k.T) * float(scale)
        if far is not None:
            s = np.where(far, -np.inf, s)
        p = np.exp(s - s.max(1, keepdims=True))
        return (p / p.sum(1, keepdims=True) @ v).astype(F)
    if variant == "fp32" or variant == "pvbf":
        s = q @ k.T
    elif variant.startswith("qkbf"):
        s = (bf16(q).astype(np.float64) @ bf16(k).astype(np.float64).T).astype(F)
    else:
        kk = k - k.mean(0, keepdims=True) if variant.startswith("qk8s") else k
        levels = QK_LEVELS.get(variant.split("+")[0], 127)
        qq, sq = quant_rows(q, levels)
        kq, sk = quant_rows(kk, levels)
        s = ((qq @ kq.T) * sq * sk.T).astype(F)
    s = (s * scale).astype(F)
    if far is not None:
        s = np.where(far, -np.inf, s)
    s = s - s.max(1, keepdims=True)
    p = np.exp(s)
    if variant.endswith("+pe12") or variant.endswith("+pe15"):
        # The exps as they are (the largest is 1) on a fixed integer scale, the values per
        # channel, and the total of the rounded exps: every sum an integer until the end.
        levels = 4095 if variant.endswith("12") else 32767
        eq = np.rint(p.astype(F).astype(np.float64) * levels)
        vq, sv = quant_rows(v, 4095, axis=0)
        return ((eq @ vq) * sv / eq.sum(1, keepdims=True)).astype(F)
    p = (p / p.sum(1, keepdims=True)).astype(F)
    if variant.endswith("+pv8") or variant.endswith("+pvu8"):
        levels = 255 if variant.endswith("u8") else 127
        pq, sp = quant_rows(p, levels)
        vq, sv = quant_rows(v, 127, axis=0)
        return ((pq @ vq) * sp * sv).astype(F)
    if variant.endswith("+pv13") or variant.endswith("+pv16"):
        levels = 4095 if variant.endswith("13") else 32767
        pq, sp = quant_rows(p, levels)
        vq, sv = quant_rows(v, levels, axis=0)
        return ((pq @ vq) * sp * sv).astype(F)
    if variant.endswith("pvbf"):
        return (bf16(p).astype(np.float64) @ bf16(v).astype(np.float64)).astype(F)
    return (p @ v).astype(F)


def embed(ids, w, cfg, variant, spread=None):
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    d, eps = h // heads, cfg["norm_eps"]
    window = cfg["local_attention"] // 2
    n = len(ids)
    pos = np.arange(n)
    far_local = np.abs(pos[:, None] - pos[None, :]) > window
    x = layer_norm(w["embeddings.tok_embeddings.weight"][ids], w["embeddings.norm.weight"], eps)
    for li in range(cfg["num_hidden_layers"]):
        is_global = li % cfg["global_attn_every_n_layers"] == 0
        p = f"layers.{li}."
        normed = x if li == 0 else layer_norm(x, w[p + "attn_norm.weight"], eps)
        qkv = (normed @ w[p + "attn.Wqkv.weight"].T).reshape(n, 3, heads, d)
        theta = cfg["global_rope_theta"] if is_global else cfg["local_rope_theta"]
        q, k, v = rope(qkv[:, 0], theta, pos), rope(qkv[:, 1], theta, pos), qkv[:, 2]
        if spread is not None and is_global:
            # How peaked attention is: each query's largest probability, and its scaled
            # scores' range (max - min), over this global layer's heads.
            for hd in range(heads):
                sc = (q[:, hd] @ k[:, hd].T) / np.sqrt(d)
                pr = np.exp(sc - sc.max(1, keepdims=True))
                spread.append((float(np.median(pr.max(1) / pr.sum(1))),
                               float(np.median(sc.max(1) - sc.min(1)))))
        ctx = np.stack([
            attention(q[:, hd], k[:, hd], v[:, hd], None if is_global else far_local,
                      F(1 / np.sqrt(d)), variant)
            for hd in range(heads)], 1).reshape(n, h)
        x = (x + ctx @ w[p + "attn.Wo.weight"].T).astype(F)
        y = layer_norm(x, w[p + "mlp_norm.weight"], eps) @ w[p + "mlp.Wi.weight"].T
        i = cfg["intermediate_size"]
        x = (x + (gelu(y[:, :i]) * y[:, i:]) @ w[p + "mlp.Wo.weight"].T).astype(F)
    x = layer_norm(x, w["final_norm.weight"], eps)
    m = x.astype(np.float64).mean(0)
    return m / np.linalg.norm(m)


def cos(a, b, drop=None):
    if drop is not None:
        a, b = np.delete(a, drop), np.delete(b, drop)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192, help="length of the long text")
    ap.add_argument("--docs", type=int, default=64, help="workload documents (short texts)")
    ap.add_argument("--sharpen", type=float, default=1.0,
                    help="multiply every query projection by this (the same in all variants): "
                         "peakier attention, nearer a trained model's, with a long tail of small "
                         "probabilities (the case that 8-bit probabilities round to zero)")
    ap.add_argument("--variants", default="qk8,qk8s,qk8+pv8,qk8+pvu8,qk8s+pvu8,qk8+pvbf")
    args = ap.parse_args()
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer
    cfg = json.loads((MODEL / "config.json").read_text())
    w = {k.removeprefix("model."): v.astype(F) for k, v in load_file(str(MODEL / "model.safetensors")).items()}
    for li in range(cfg["num_hidden_layers"]):
        wqkv = w[f"layers.{li}.attn.Wqkv.weight"]
        wqkv[: cfg["hidden_size"]] *= F(args.sharpen)
    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    docs = [json.loads(line)["text"] for line in DOCS.read_text().splitlines()]
    # The planted channel (testdata/README.md): the 30m shape's is 152.
    outlier = 152
    texts = []
    if args.tokens:
        ids, i = [], 0
        while len(ids) < args.tokens:
            ids += tok.encode(docs[i % len(docs)], add_special_tokens=False).ids
            i += 1
        texts.append((f"long text ({args.tokens} tokens)", [1] + ids[: args.tokens - 2] + [2]))
    for t in docs[: args.docs]:
        texts.append(("doc", tok.encode(t).ids))
    variants = args.variants.split(",")
    rows = {v: [] for v in variants}
    spread = []
    for name, ids in texts:
        ref = embed(ids, w, cfg, "fp32", spread)
        for v in variants:
            got = embed(ids, w, cfg, v)
            rows[v].append((name, cos(got, ref), cos(got, ref, outlier)))
    print(f"cosine to fp32 attention (30m shape, random weights, queries x{args.sharpen}; "
          f"outlier channel {outlier})\n")
    sp = np.array(spread)
    print(f"global layers, median over heads and texts: largest probability of a query "
          f"{np.median(sp[:, 0]):.3g}, range of its scaled scores {np.median(sp[:, 1]):.3g}\n")
    print("| variant | long text | long text w/o outlier | docs min | docs min w/o outlier |")
    print("|---|---:|---:|---:|---:|")
    for v in variants:
        long = [r for r in rows[v] if r[0] != "doc"]
        short = [r for r in rows[v] if r[0] == "doc"]
        lt = f"{long[0][1]:.6f} | {long[0][2]:.6f}" if long else "– | –"
        st = f"{min(r[1] for r in short):.6f} | {min(r[2] for r in short):.6f}" if short else "– | –"
        print(f"| {v} | {lt} | {st} |")


if __name__ == "__main__":
    main()
