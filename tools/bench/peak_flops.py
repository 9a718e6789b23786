#!/usr/bin/env python3
"""Measure this machine's fp32 matmul (sgemm) peak and the model's FLOPs per token.

    .venv-testdata/bin/python tools/bench/peak_flops.py [--repeats 20] [--threads N] [--out f.json]

Peak: median time of C = A·B over --repeats runs (after warm-up) for a square 2048³
sgemm and for the model's own shapes at a batch of 32 × the workload's mean length
(tokens×256·256×768 Wqkv, tokens×256·256×256 Wo, tokens×256·256×2048 Wi,
tokens×1024·1024×256 MLP Wo), with torch (MKL/oneDNN) and numpy (OpenBLAS), on all usable
cores. GFLOP/s = 2·m·k·n / t. fp32_peak_gflops is the best median over all of these;
every measurement is in "measurements".

FLOPs per token (ModernBERT encoder, embedding lookup excluded), hidden H, intermediate
I, layers N, sequence length L, local window W (keys within |i−j| ≤ W/2, i.e. ≤ W+1 keys):
  matmuls   2·params of Wqkv (3H·H), Wo (H·H), Wi (2I·H, GeGLU), MLP Wo (H·I)
            = 2·N·(4H² + 3HI)
  attention QKᵀ and A·V: 2·H·keys each = 4·H·keys per token per layer,
            keys = L on global layers, min(L, W+1) on local layers
  total(L) = 2·N·(4H² + 3HI) + 4·H·(N_global·L + N_local·min(L, W+1))
Norms, GELU, rope, softmax and residual adds (O(H) or O(L) per token) are listed
separately and not counted. Averaged over a workload, the attention term uses the
token-weighted length Σ L_i² / Σ L_i (a token of a longer text attends to more keys).

Output: one JSON object on stdout (and --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def threads_default() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load_config(model_dir: Path) -> dict:
    c = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    n = c["num_hidden_layers"]
    every = c.get("global_attn_every_n_layers")
    if every is None and "layer_types" in c:  # transformers-5 format
        n_global = sum(1 for t in c["layer_types"] if t == "full_attention")
    else:
        n_global = len(range(0, n, every or 1))
    return {"H": c["hidden_size"], "I": c["intermediate_size"], "N": n,
            "N_global": n_global, "N_local": n - n_global,
            "W": c.get("local_attention", c.get("sliding_window", 128)),
            "vocab": c["vocab_size"]}


def safetensors_matmul_params(model_dir: Path) -> dict | None:
    p = model_dir / "model.safetensors"
    if not p.exists():
        return None
    with p.open("rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    total = mm = emb = 0
    for k, v in h.items():
        if k == "__metadata__":
            continue
        size = 1
        for d in v["shape"]:
            size *= d
        total += size
        if "tok_embeddings" in k:
            emb += size
        elif len(v["shape"]) == 2:
            mm += size
    return {"total_params": total, "embedding_params": emb, "matmul_params": mm}


def flops_per_token(cfg: dict, L: float) -> dict:
    H, I, N, W = cfg["H"], cfg["I"], cfg["N"], cfg["W"]
    matmul = 2 * N * (4 * H * H + 3 * H * I)
    attn = 4 * H * (cfg["N_global"] * L + cfg["N_local"] * min(L, W + 1))
    return {"length": L, "matmul_flops": matmul, "attention_flops": attn,
            "total_flops": matmul + attn, "total_mflops": round((matmul + attn) / 1e6, 4)}


def workload_lengths(workload_dir: Path, model_dir: Path) -> list[int] | None:
    docs = workload_dir / "documents.jsonl"
    if not docs.exists():
        return None
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()
    prompt = json.loads((model_dir / "config_sentence_transformers.json")
                        .read_text(encoding="utf-8"))["prompts"]["document"]
    with docs.open(encoding="utf-8") as f:
        texts = [prompt + json.loads(ln)["text"] for ln in f if ln.strip()]
    return [len(e.ids) for e in tok.encode_batch(texts)]


def bench(fn, flops: float, repeats: int, min_time: float = 0.05) -> dict:
    fn()  # warm-up
    t = time.perf_counter()
    fn()
    one = time.perf_counter() - t
    inner = max(1, int(min_time / max(one, 1e-6)))  # loop small shapes to get measurable times
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t) / inner)
    med = statistics.median(times)
    return {"median_s": med, "gflops": round(flops / med / 1e9, 2),
            "best_gflops": round(flops / min(times) / 1e9, 2), "inner_loops": inner}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=threads_default())
    ap.add_argument("--model-dir", type=Path, default=ROOT / "testdata/generated/ruri-v3-30m-shape")
    ap.add_argument("--workload-dir", type=Path, default=ROOT / "testdata/generated/bench")
    ap.add_argument("--batch", type=int, default=32, help="texts per batch for the model shapes")
    ap.add_argument("--no-numpy", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(args.threads))

    cfg = load_config(args.model_dir)
    H, I = cfg["H"], cfg["I"]
    lens = workload_lengths(args.workload_dir, args.model_dir)
    mean_len = sum(lens) / len(lens) if lens else 23.0
    tok_weighted = sum(x * x for x in lens) / sum(lens) if lens else mean_len
    tokens = int(round(args.batch * mean_len))
    shapes = [("square_2048", 2048, 2048, 2048),
              ("Wqkv tokens×256·256×768", tokens, H, 3 * H),
              ("Wo tokens×256·256×256", tokens, H, H),
              ("Wi tokens×256·256×2048", tokens, H, 2 * I),
              ("mlp_Wo tokens×1024·1024×256", tokens, I, H)]

    meas = []
    import numpy as np
    rng = np.random.default_rng(0)
    if not args.no_torch:
        import torch
        torch.set_num_threads(args.threads)
        for name, m, k, n in shapes:
            a = torch.randn(m, k)
            b = torch.randn(k, n)
            c = torch.empty(m, n)
            r = bench(lambda: torch.matmul(a, b, out=c), 2.0 * m * k * n, args.repeats)
            meas.append({"lib": f"torch {torch.__version__}", "shape": name, "m": m, "k": k, "n": n, **r})
    if not args.no_numpy:
        for name, m, k, n in shapes:
            a = rng.standard_normal((m, k), dtype=np.float32)
            b = rng.standard_normal((k, n), dtype=np.float32)
            c = np.empty((m, n), dtype=np.float32)
            r = bench(lambda: np.matmul(a, b, out=c), 2.0 * m * k * n, args.repeats)
            meas.append({"lib": f"numpy {np.__version__}", "shape": name, "m": m, "k": k, "n": n, **r})
    best = max(meas, key=lambda x: x["gflops"])

    model_shapes = [x for x in meas if x["shape"] != "square_2048"]
    out = {
        "fp32_peak_gflops": best["gflops"],
        "method": (f"median of {args.repeats} timed sgemm runs (after warm-up), best over "
                   f"torch/numpy and shapes; best: {best['lib']} {best['shape']} "
                   f"({best['m']}×{best['k']}·{best['k']}×{best['n']}); threads={args.threads}"),
        "threads": args.threads,
        "cpu": cpu_model(),
        "measurements": meas,
        "model_shape_gflops_best_lib": {
            s: max(x["gflops"] for x in model_shapes if x["shape"] == s)
            for s in dict.fromkeys(x["shape"] for x in model_shapes)},
        "model": {
            "config": cfg,
            "params_from_safetensors": safetensors_matmul_params(args.model_dir),
            "formula": ("flops/token = 2·N·(4H²+3HI) + 4·H·(N_global·L + N_local·min(L, W+1)); "
                        f"H={H}, I={I}, N={cfg['N']}, N_global={cfg['N_global']}, "
                        f"N_local={cfg['N_local']}, W={cfg['W']}"),
            "workload_mean_length": round(mean_len, 3),
            "workload_token_weighted_length": round(tok_weighted, 3),
            "at_mean_length": flops_per_token(cfg, mean_len),
            "at_token_weighted_length": flops_per_token(cfg, tok_weighted),
            "at_length_32": flops_per_token(cfg, 32),
            "not_counted_per_token_per_layer": ("2 LayerNorms ~ 2·5H, GeGLU gelu·mul ~ 10·I, "
                                                "rope ~ 3H, softmax ~ 5·heads·keys, residuals 2H "
                                                f"(≈ {(10 * H + 10 * I + 3 * H + 5 * 4 * mean_len + 2 * H) * cfg['N'] / 1e6:.3f} "
                                                "MFLOP/token over all layers at the mean length)"),
        },
    }
    mm = out["model"]
    fl = mm["at_token_weighted_length"]["total_flops"]
    mm["roofline_tokens_per_s_at_peak"] = round(best["gflops"] * 1e9 / fl, 1)
    mm["issue_21_3_mflop"] = (
        f"2·params of the matmuls = {2 * cfg['N'] * (4 * H * H + 3 * H * I) / 1e6:.3f} MFLOP; "
        f"attention adds 4·H·N·L = {4 * H * cfg['N'] / 1e6:.4f}·L MFLOP (L ≤ {cfg['W'] + 1}); "
        f"21.3 MFLOP ⇔ L ≈ {(21.3e6 - 2 * cfg['N'] * (4 * H * H + 3 * H * I)) / (4 * H * cfg['N']):.1f}")
    text = json.dumps(out, ensure_ascii=False, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


if __name__ == "__main__":
    main()
