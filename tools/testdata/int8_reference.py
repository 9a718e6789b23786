#!/usr/bin/env python3
"""An independent NumPy implementation of ruri-native's int8 scheme (ruri-native/src/linear.rs),
written from its description, not from the Rust code's output, to check the engine against.

The scheme:
  * weights: per output channel, symmetric 8-bit: s_w = max|w| / 127, q_w = rint(w * (127 / max|w|));
  * activations: per token row, the same formula;
  * y = (f32(sum q_x * q_w) * s_x) * s_w, the sum exact (int64 here);
  * "outlier" input channels of the norm-fed layers (Wqkv, Wi): a column whose squared norm
    is below 0.25^2 of the median squared column norm (at most 8, the smallest), left out of the
    int8 product (zeroed in x and w) and added in float32: y += x_c * w_c, channel by channel.
  * "writer" input channels of the other layers (attention's Wo, the MLP's Wo): a column of
    which one output channel holds at least half the squared norm (zero columns excluded; none
    when every column is one). When there are some, the writer columns and the others are two
    int8 products, each quantized on its own (activations per row over its own columns,
    weights per output channel over its own columns), added to the residual in that order:
    x = x + y_others, then x = x + y_writers.
  * GELU's erf: x * P(x^2) / Q(x^2) in float32 with x clamped to [-3.92, 3.92] and the result to
    [-1, 1], P and Q of degree 5 (the engine's coefficients, ruri-native/src/math.rs `erf`;
    |error| <= 3.7e-7 in float32), Horner's steps in float32, as the engine computes it. It is part of the scheme because int8 amplifies any difference before a quantizer: a
    1e-7 change of one activation can move a row's rounding by one step. `--exact-erf` uses
    math.erf instead, to measure what the approximation itself changes.
  * the float steps in the engine's order, for the same reason: LayerNorm's mean and variance
    and the softmax total (over the query's own keys) in 8 interleaved partial sums added
    left to right; q.k summed channel after channel; attention-weighted values key after key;
    e^x by the engine's formula (x = n ln 2 + r, Taylor to r^7, times 2^n).
Everything else is ModernBERT in float32 as transformers computes it.

`--attention bf16` computes attention as the engine's `AttentionPrecision::Bf16` is defined
(everything else unchanged). bf16(x) rounds a float32 to its top 16 bits, to nearest even
(zeros and subnormals become a zero of their sign, NaN stays NaN, infinities stay); flush(x)
turns a subnormal float32 into a zero of its sign; dp(acc, (a1, b1), (a0, b0)) is AVX-512
BF16's pair step (VDPBF16PS): t = flush(f32(acc + a1 b1)), then flush(f32(t + a0 b0)), each
product exact and each sum rounded once to float32, the odd element of the pair first. Per
head, with Q, K, V = bf16(q), bf16(k), bf16(v) (q and k after RoPE):
  * score s[i][j]: dp over the channel pairs (2c+1, 2c) in ascending c, from +0;
  * softmax over the query's own keys J_i, normalized at the end (as flash attention does), in
    powers of two: c = f32(scale * f32(log2 e)), m = f32(max_{j in J_i} s[i][j] * c),
    e_j = exp2_nonpositive(f32(f32(s[i][j] * c) - m)) (y raised to -125.5 if below, n = rint(y),
    2^(y - n) by the engine's degree-4 polynomial, times 2^n: see `exp2_nonpositive`), total =
    16 partial sums of the float32 e_j (key j in partial j mod 16, its index in the text; each
    partial in ascending j, from +0) added 0..15 from +0, weights P[i][j] = bf16(e_j), 0 for
    the keys outside J_i;
  * out[i][c]: dp over the key pairs (2p+1, 2p) in ascending p, from +0, P and V taken as 0
    at index n when n is odd; then f32(out[i][c] * f32(1 / total_i)).

`--attention int13` computes attention as the engine's `AttentionPrecision::Int13` is defined
(everything else unchanged), with L = 4095. A row x of q or of k (one position of one head; q
and k after RoPE) has m = max|x|, t = f32(L / m) and scale f32(m / L); a value becomes
rint(f32(x * t)) (ties to even), clipped to [-L, L]. A row of zeros has scale 0, one holding
NaN or infinity scale NaN. v is quantized the same way per channel (column) over the text's
positions, with the scale f32(f32(m / L) / L). Per head:
  * s[i][j] = f32(f32(f32(sum_c qi[c] kj[c]) * scale_k[j]) * scale_q[i]), the sum exact;
  * the softmax as bf16 attention's (c, m, e_j, the 16 partial sums and 1 / total), with the
    weights W[i][j] = rint(f32(e_j * L)) (ties to even; integers 0..L), 0 outside J_i;
  * out[i][c] = f32(f32(f32(sum_j W[i][j] vq[j][c]) * scale_v[c]) * f32(1 / total_i)), the sum
    exact.

    .venv-testdata/bin/python tools/testdata/int8_reference.py \\
        --model testdata/tiny --tokens testdata/reference/tiny.json \\
        --out testdata/reference/tiny_native_int8.json
    .venv-testdata/bin/python tools/testdata/int8_reference.py \\
        --shape 30m --tokens testdata/reference/shapes/30m.json \\
        --out testdata/reference/shapes/30m_native_int8.json
    .venv-testdata/bin/python tools/testdata/int8_reference.py --attention bf16 \\
        --model testdata/tiny --tokens testdata/reference/tiny.json \\
        --out testdata/reference/tiny_native_int8_bf16.json
    .venv-testdata/bin/python tools/testdata/int8_reference.py --attention bf16 \\
        --shape 30m --tokens testdata/reference/shapes/30m.json \\
        --out testdata/reference/shapes/30m_native_int8_bf16.json
    .venv-testdata/bin/python tools/testdata/int8_reference.py --attention int13 \\
        --model testdata/tiny --tokens testdata/reference/tiny.json \\
        --out testdata/reference/tiny_native_int8_int13.json
    .venv-testdata/bin/python tools/testdata/int8_reference.py --attention int13 \\
        --shape 30m --tokens testdata/reference/shapes/30m.json \\
        --out testdata/reference/shapes/30m_native_int8_int13.json

--shape rebuilds the weights of testdata/shapes/<size>/ from their recipe (tools/testdata/shapes.py).
Token ids come from the reference file (what sentence-transformers fed the model).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np

F = np.float32
OUTLIER_NORM_RATIO = 0.25
MAX_OUTLIERS = 8
WRITER_SHARE = 0.5


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of x (float32) to int8 values and their float32 scales."""
    x = x.astype(F)
    m = np.max(np.abs(x), axis=1)
    safe = np.where(m == 0, F(1), m).astype(F)
    inv = (F(127) / safe).astype(F)
    q = np.clip(np.rint((x * inv[:, None]).astype(F)), -127, 127).astype(np.int64)
    q[m == 0] = 0
    scale = np.where(m == 0, F(0), (m / F(127)).astype(F)).astype(F)
    return q, scale


def detect_outliers(w: np.ndarray) -> list[int]:
    norms = np.sum(w.astype(np.float64) ** 2, axis=0)
    median = np.sort(norms)[w.shape[1] // 2]
    limit = median * float(F(OUTLIER_NORM_RATIO) * F(OUTLIER_NORM_RATIO))
    found = [c for c in range(w.shape[1]) if norms[c] < limit]
    found.sort(key=lambda c: norms[c])
    return sorted(found[:MAX_OUTLIERS])


class Int8Linear:
    def __init__(self, w: np.ndarray, outliers: bool):
        w = w.astype(F).copy()
        self.outliers = detect_outliers(w) if outliers else []
        self.outlier_w = w[:, self.outliers].copy()
        w[:, self.outliers] = 0
        self.q, self.scale = quantize_rows(w)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        xm = x.astype(F).copy()
        xm[:, self.outliers] = 0
        qa, sa = quantize_rows(xm)
        acc = qa @ self.q.T
        y = (acc.astype(F) * sa[:, None]).astype(F) * self.scale[None, :]
        y = y.astype(F)
        for i, c in enumerate(self.outliers):
            y = (y + x[:, c:c + 1].astype(F) * self.outlier_w[None, :, i]).astype(F)
        return y


def detect_writers(w: np.ndarray) -> list[int]:
    e = w.astype(np.float64) ** 2
    total, top = e.sum(axis=0), e.max(axis=0)
    found = [c for c in range(w.shape[1]) if total[c] > 0 and top[c] / total[c] >= WRITER_SHARE]
    return [] if len(found) == w.shape[1] else found


class SplitInt8Linear:
    """The other layers: one int8 product, or two over the writer columns and the rest."""

    def __init__(self, w: np.ndarray):
        self.writers = detect_writers(w)
        others = [c for c in range(w.shape[1]) if c not in set(self.writers)]
        self.groups = [(others, Int8Linear(w[:, others], outliers=False))]
        if self.writers:
            self.groups.append((self.writers, Int8Linear(w[:, self.writers], outliers=False)))

    def add_to(self, x: np.ndarray, inp: np.ndarray) -> np.ndarray:
        """x + y, one group after the other."""
        for columns, linear in self.groups:
            x = (x + linear(inp[:, columns])).astype(F)
        return x


LANES = 8


def lane_sum(x: np.ndarray) -> np.ndarray:
    """Sum over the last axis in LANES interleaved partial sums, then the lanes in order."""
    x = x.astype(F)
    n = x.shape[-1]
    acc = np.zeros(x.shape[:-1] + (LANES,), dtype=F)
    full = n // LANES * LANES
    for c in range(0, full, LANES):
        acc = (acc + x[..., c:c + LANES]).astype(F)
    tail = n - full
    if tail:
        acc[..., :tail] = (acc[..., :tail] + x[..., full:]).astype(F)
    total = np.zeros(x.shape[:-1], dtype=F)
    for lane in range(LANES):
        total = (total + acc[..., lane]).astype(F)
    return total


def exp_engine(x: np.ndarray) -> np.ndarray:
    """e^x as the engine computes it (ruri-native/src/math.rs documents the formula)."""
    x = np.clip(x.astype(F), F(-87.3), F(88.7))
    n = np.rint((x * F(math.log2(math.e))).astype(F)).astype(F)
    r = ((x - n * F(0.69314575)).astype(F) - n * F(1.4286068e-6)).astype(F)
    p = F(1.0 / 5040.0)
    for c in (1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0):
        p = (F(c) + r * p).astype(F)
    ni = n.astype(np.int32)
    half = np.where(ni < 0, -((-ni) // 2), ni // 2).astype(np.int32)
    two_a = ((half + 127).astype(np.uint32) << 23).view(F)
    two_b = ((ni - half + 127).astype(np.uint32) << 23).view(F)
    return ((p * two_a).astype(F) * two_b).astype(F)


# 2^f on [-1/2, 1/2] as 1 + f (B1 + f (B2 + f (B3 + f B4))): the engine's fit (ruri-native
# kernels/bf16.rs `exp2_nonpositive`), float32 values from their bits.
EXP2_COEFFICIENTS = np.array([0x3F317096, 0x3E7601BC, 0x3D64FE24, 0x3C1D0164],
                             dtype=np.uint32).view(F)


def exp2_nonpositive(y: np.ndarray) -> np.ndarray:
    """2^y for y <= 0 as bf16 attention's softmax defines it, in float32 steps: y raised to -125.5
    if below (NaN stays), n = rint(y) (ties to even), f = y - n, 2^f by Horner's steps of the
    engine's degree-4 polynomial, times 2^n from the exponent bits (n >= -126)."""
    y = y.astype(F)
    y = np.where(y < F(-125.5), F(-125.5), y).astype(F)
    n = np.rint(y).astype(F)
    f = (y - n).astype(F)
    b1, b2, b3, b4 = EXP2_COEFFICIENTS
    p = (b3 + f * b4).astype(F)
    p = (b2 + f * p).astype(F)
    p = (b1 + f * p).astype(F)
    p = (F(1) + f * p).astype(F)
    two_n = ((n.astype(np.int32) + 127).astype(np.uint32) << 23).view(F)
    return (p * two_n).astype(F)


def bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=F).view(np.uint32)


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 to bfloat16, to nearest even, kept as float32 (the low 16 bits zero); zeros and
    subnormals to a zero of their sign, NaN stays NaN (quiet), infinities stay."""
    b = bits(x).astype(np.uint64)
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    quiet = (b | 0x00400000) & 0xFFFF0000
    r = np.where(np.isnan(np.asarray(x, dtype=F)), quiet, rounded)
    r = np.where(b & 0x7F800000 == 0, b & 0x80000000, r)
    return r.astype(np.uint32).view(F)


def flush(x: np.ndarray) -> np.ndarray:
    """A subnormal float32 to a zero of its sign; anything else unchanged."""
    b = bits(x)
    return np.where(b & 0x7F800000 == 0, b & 0x80000000, b).astype(np.uint32).view(F)


def add_once(acc: np.ndarray, p: np.ndarray) -> np.ndarray:
    """f32(acc + p), the exact sum of float32 acc and float64 p rounded once: the float64 sum
    rounded to odd (TwoSum's error sets the last bit), which then rounds to float32 as the
    exact sum would (53 >= 24 + 2 bits)."""
    a = acc.astype(np.float64)
    s = a + p
    back = s - a
    err = (a - (s - back)) + (p - back)
    sticky = (err != 0) & ((s.view(np.uint64) & 1) == 0)
    s = np.where(sticky, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(F)


def dp(acc: np.ndarray, a1: np.ndarray, b1: np.ndarray, a0: np.ndarray, b0: np.ndarray) -> np.ndarray:
    """VDPBF16PS's step on bf16 values: the odd pair's exact product first, then the even one's,
    each sum rounded once to float32 and its subnormals flushed."""
    t = flush(add_once(acc, a1.astype(np.float64) * b1.astype(np.float64)))
    return flush(add_once(t, a0.astype(np.float64) * b0.astype(np.float64)))


PARTIALS = 16


def partial_sum_by_key(e: np.ndarray) -> np.ndarray:
    """Sum over the last axis (the keys, absolute index j) in PARTIALS partial sums, key j in
    partial j mod PARTIALS, each from +0 in ascending j, then the partials in order from +0.
    Keys outside a query's own set must be +0 (adding +0 to a sum of exps changes nothing)."""
    e = e.astype(F)
    n = e.shape[-1]
    rounds = -(-n // PARTIALS)
    padded = np.zeros(e.shape[:-1] + (rounds * PARTIALS,), dtype=F)
    padded[..., :n] = e
    acc = np.zeros(e.shape[:-1] + (PARTIALS,), dtype=F)
    for r in range(rounds):
        acc = (acc + padded[..., r * PARTIALS:(r + 1) * PARTIALS]).astype(F)
    total = np.zeros(e.shape[:-1], dtype=F)
    for part in range(PARTIALS):
        total = (total + acc[..., part]).astype(F)
    return total


def attend_bf16(q: np.ndarray, k: np.ndarray, v: np.ndarray, far: np.ndarray | None,
                scale: np.float32) -> np.ndarray:
    """One head, bf16 attention (see the docstring): q, k, v (n, d) float32; far[i, j] marks the
    keys outside query i's window (None: every key is its own)."""
    n, d = q.shape
    qb, kb, vb = bf16(q), bf16(k), bf16(v)
    s = np.zeros((n, n), dtype=F)
    for c2 in range(d // 2):
        hi, lo = 2 * c2 + 1, 2 * c2
        s = dp(s, qb[:, None, hi], kb[None, :, hi], qb[:, None, lo], kb[None, :, lo])
    own = np.ones((n, n), dtype=bool) if far is None else ~far
    c = (scale * F(math.log2(math.e))).astype(F)
    m = (np.where(own, s, F(-np.inf)).max(axis=1) * c).astype(F)
    t = (s * c).astype(F)
    e = np.where(own, exp2_nonpositive((t - m[:, None]).astype(F)), F(0)).astype(F)
    inv = (F(1) / partial_sum_by_key(e)).astype(F)
    p = np.where(own, bf16(e), F(0)).astype(F)
    pairs = -(-n // 2)
    p2 = np.zeros((n, 2 * pairs), dtype=F)
    p2[:, :n] = p
    v2 = np.zeros((2 * pairs, d), dtype=F)
    v2[:n] = vb
    out = np.zeros((n, d), dtype=F)
    for jp in range(pairs):
        hi, lo = 2 * jp + 1, 2 * jp
        out = dp(out, p2[:, hi, None], v2[None, hi], p2[:, lo, None], v2[None, lo])
    return (out * inv[:, None]).astype(F)


INT13_LEVELS = 4095


def quantize_int13(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """int13 attention's quantization (see the docstring) of the rows (axis=1) or the columns
    (axis=0) of x: the integers (int64) and the scales (float32, broadcastable against x)."""
    x = x.astype(F)
    levels = F(INT13_LEVELS)
    a = np.abs(x)
    m = np.where(np.isnan(a).any(axis=axis, keepdims=True), F(np.nan),
                 a.max(axis=axis, keepdims=True)).astype(F)
    ok = (m > 0) & np.isfinite(m)
    safe = np.where(ok, m, F(1)).astype(F)
    t = np.where(ok, (levels / safe).astype(F), F(0)).astype(F)
    scale = np.where(ok, (safe / levels).astype(F), np.where(m == 0, F(0), F(np.nan))).astype(F)
    with np.errstate(invalid="ignore"):
        y = np.clip(np.rint((x * t).astype(F)), -levels, levels)
    return np.nan_to_num(y, nan=0.0).astype(np.int64), scale


def attend_int13(q: np.ndarray, k: np.ndarray, v: np.ndarray, far: np.ndarray | None,
                 scale: np.float32) -> np.ndarray:
    """One head, int13 attention (see the docstring): q, k, v (n, d) float32; far[i, j] marks
    the keys outside query i's window (None: every key is its own)."""
    n, d = q.shape
    qq, sq = quantize_int13(q, 1)
    kq, sk = quantize_int13(k, 1)
    vq, sv = quantize_int13(v, 0)
    sv = (sv / F(INT13_LEVELS)).astype(F)
    dots = (qq @ kq.T).astype(F)
    s = ((dots * sk.reshape(1, n)).astype(F) * sq.reshape(n, 1)).astype(F)
    own = np.ones((n, n), dtype=bool) if far is None else ~far
    c = (scale * F(math.log2(math.e))).astype(F)
    m = (np.where(own, s, F(-np.inf)).max(axis=1) * c).astype(F)
    t = (s * c).astype(F)
    e = np.where(own, exp2_nonpositive((t - m[:, None]).astype(F)), F(0)).astype(F)
    inv = (F(1) / partial_sum_by_key(e)).astype(F)
    weights = np.where(own, np.rint((e * F(INT13_LEVELS)).astype(F)), 0).astype(np.int64)
    sums = (weights @ vq).astype(F)
    return ((sums * sv).astype(F) * inv[:, None]).astype(F)


def layer_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(F)
    mean = (lane_sum(x) / F(x.shape[1])).astype(F)
    d = (x - mean[:, None]).astype(F)
    var = (lane_sum((d * d).astype(F)) / F(x.shape[1])).astype(F)
    inv = (F(1) / np.sqrt((var + F(eps)).astype(F))).astype(F)
    return ((d * inv[:, None]).astype(F) * w[None, :].astype(F)).astype(F)


_exact_erf = np.vectorize(math.erf, otypes=[np.float64])
EXACT_ERF = False
ATTENTION = "f32"


_ERF_P = [F(2 / math.sqrt(math.pi)), F(0.19275647), F(0.05305929), F(0.0038679412),
          F(0.0002874605), F(2.034667e-06)]
_ERF_Q = [F(1), F(0.50415766), F(0.11508131), F(0.015171545), F(0.0011880016),
          F(3.806893e-05)]


def erf_rational(x: np.ndarray) -> np.ndarray:
    """x * P(x^2) / Q(x^2) in float32, Horner from the highest coefficient (see the docstring)."""
    x = np.clip(x.astype(F), F(-3.92), F(3.92)).astype(F)
    s = (x * x).astype(F)
    p = np.full_like(s, _ERF_P[-1])
    for c in _ERF_P[-2::-1]:
        p = (p * s + c).astype(F)
    q = np.full_like(s, _ERF_Q[-1])
    for c in _ERF_Q[-2::-1]:
        q = (q * s + c).astype(F)
    return np.clip(((x * p).astype(F) / q).astype(F), F(-1), F(1)).astype(F)


def gelu(x: np.ndarray) -> np.ndarray:
    u = (x * F(1 / math.sqrt(2.0))).astype(F)
    e = _exact_erf(u.astype(np.float64)).astype(F) if EXACT_ERF else erf_rational(u)
    return (x * F(0.5) * (F(1) + e)).astype(F)


def rope(x: np.ndarray, theta: float, positions: np.ndarray) -> np.ndarray:
    """x: (tokens, heads, d); rotate_half convention on the whole head."""
    d = x.shape[-1]
    inv_freq = np.array([1.0 / theta ** ((2 * i) / d) for i in range(d // 2)]).astype(F)
    angles = (positions.astype(F)[:, None] * inv_freq[None, :]).astype(F)
    cos = np.cos(angles.astype(np.float64)).astype(F)
    sin = np.sin(angles.astype(np.float64)).astype(F)
    cos = np.concatenate([cos, cos], axis=1)[:, None, :]
    sin = np.concatenate([sin, sin], axis=1)[:, None, :]
    half = d // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos + rotated * sin).astype(F)


def embed(ids: list[int], w: dict, cfg: dict, layers: list[dict]) -> np.ndarray:
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    d = h // heads
    eps = cfg.get("norm_eps", cfg.get("layer_norm_eps", 1e-5))
    every = cfg.get("global_attn_every_n_layers", 3)
    window = cfg.get("local_attention", 128) // 2
    theta_g = cfg.get("global_rope_theta", 160000.0)
    theta_l = cfg.get("local_rope_theta", 10000.0)
    n = len(ids)
    pos = np.arange(n)
    x = layer_norm(w["embeddings.tok_embeddings.weight"][ids], w["embeddings.norm.weight"], eps)
    for li, L in enumerate(layers):
        is_global = li % every == 0
        normed = x if li == 0 else layer_norm(x, w[f"layers.{li}.attn_norm.weight"], eps)
        qkv = L["wqkv"](normed).reshape(n, 3, heads, d)
        theta = theta_g if is_global else theta_l
        q = rope(qkv[:, 0], theta, pos)
        k = rope(qkv[:, 1], theta, pos)
        v = qkv[:, 2].astype(F)
        ctx = np.zeros((n, heads, d), dtype=F)
        scale = (F(1) / np.sqrt(F(d))).astype(F)
        far = np.abs(pos[:, None] - pos[None, :]) > window
        for head in range(heads):
            if ATTENTION == "bf16":
                ctx[:, head] = attend_bf16(q[:, head], k[:, head], v[:, head],
                                           None if is_global else far, scale)
                continue
            if ATTENTION == "int13":
                ctx[:, head] = attend_int13(q[:, head], k[:, head], v[:, head],
                                            None if is_global else far, scale)
                continue
            # q.k summed over the head's channels one after another.
            s = np.zeros((n, n), dtype=F)
            for c in range(d):
                s = (s + q[:, None, head, c] * k[None, :, head, c]).astype(F)
            s = (s * scale).astype(F)
            p = np.zeros((n, n), dtype=F)
            for i in range(n):
                own = np.flatnonzero(~far[i]) if not is_global else np.arange(n)
                e = exp_engine((s[i, own] - s[i, own].max()).astype(F))
                p[i, own] = (e / lane_sum(e)).astype(F)
            out = np.zeros((n, d), dtype=F)
            for j in range(n):
                out = (out + p[:, j, None] * v[None, j, head]).astype(F)
            ctx[:, head] = out
        x = L["wo"].add_to(x, ctx.reshape(n, h))
        y = L["wi"](layer_norm(x, w[f"layers.{li}.mlp_norm.weight"], eps))
        i = cfg["intermediate_size"]
        act = (gelu(y[:, :i]) * y[:, i:]).astype(F)
        x = L["mlp_wo"].add_to(x, act)
    x = layer_norm(x, w["final_norm.weight"], eps)
    pooled = np.zeros(h, dtype=F)
    for row in x:
        pooled = (pooled + row).astype(F)
    return (pooled / F(max(n, 1e-9))).astype(F)


def load_weights(args) -> tuple[dict, dict]:
    if args.model:
        from safetensors.numpy import load_file
        cfg = json.loads((Path(args.model) / "config.json").read_text())
        w = load_file(str(Path(args.model) / "model.safetensors"))
        w = {k.removeprefix("model."): v.astype(F) for k, v in w.items()}
        return cfg, w
    sys.path.insert(0, str(Path(__file__).parent))
    import shapes  # noqa: E402  (the recipe's PRNG)
    recipe = Path("testdata/shapes") / args.shape
    cfg = json.loads((recipe / "config.json").read_text())
    w = {s["name"]: shapes.make_tensor(s["init"], s["shape"], s["stream"]).astype(F)
         for s in shapes.tensor_specs(cfg)}
    return cfg, w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a folder with config.json and model.safetensors")
    src.add_argument("--shape", help="a recipe of testdata/shapes/ (30m, 70m, 130m, 310m)")
    ap.add_argument("--tokens", required=True, help="a reference JSON whose items have token_ids")
    ap.add_argument("--out", required=True)
    ap.add_argument("--exact-erf", action="store_true", help="math.erf in GELU (see above)")
    ap.add_argument("--attention", choices=("f32", "bf16", "int13"), default="f32",
                    help="attention's products in float32 (default), bf16 or int13 (see above)")
    args = ap.parse_args()
    global EXACT_ERF, ATTENTION
    EXACT_ERF = args.exact_erf
    ATTENTION = args.attention

    cfg, w = load_weights(args)
    layers = []
    for li in range(cfg["num_hidden_layers"]):
        p = f"layers.{li}."
        layers.append(dict(
            wqkv=Int8Linear(w[p + "attn.Wqkv.weight"], outliers=True),
            wo=SplitInt8Linear(w[p + "attn.Wo.weight"]),
            wi=Int8Linear(w[p + "mlp.Wi.weight"], outliers=True),
            mlp_wo=SplitInt8Linear(w[p + "mlp.Wo.weight"]),
        ))
    items = json.loads(Path(args.tokens).read_text())["items"]
    out_items = []
    for item in items:
        mean = embed(item["token_ids"], w, cfg, layers)
        norm = (mean.astype(np.float64) / max(np.linalg.norm(mean.astype(np.float64)), 1e-12)).astype(F)
        out_items.append(dict(id=item["id"], token_ids=item["token_ids"],
                              mean=[float(v) for v in mean], normalized=[float(v) for v in norm]))
        print(f"  {item['id']}: {len(item['token_ids'])} tokens", file=sys.stderr)
    generator = dict(command="tools/testdata/int8_reference.py " + " ".join(sys.argv[1:]),
                     erf="math.erf" if EXACT_ERF else "x P(x^2) / Q(x^2), degree 5/5, float32 (ruri-native math.rs)",
                     versions=dict(numpy=version("numpy"), python=sys.version.split()[0]))
    if ATTENTION == "bf16":  # (files without the key: f32 attention)
        generator["attention"] = ("bf16: q, k, v and the probabilities rounded to bfloat16, "
                                  "products summed in pairs as VDPBF16PS (see the docstring)")
    if ATTENTION == "int13":
        generator["attention"] = ("int13: q and k per row, v per channel, the weights on "
                                  "0..4095, all integers, their products summed exactly "
                                  "(see the docstring)")
    outliers = {f"layers.{i}.{k}": L[k].outliers for i, L in enumerate(layers) for k in ("wqkv", "wi")}
    writers = {f"layers.{i}.{k}": L[k].writers for i, L in enumerate(layers) for k in ("wo", "mlp_wo")}
    Path(args.out).write_text(json.dumps(dict(generator=generator, outliers=outliers, writers=writers,
                                              items=out_items), ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
