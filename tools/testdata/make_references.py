#!/usr/bin/env python3
"""Reference embeddings for testdata/inputs.json from sentence-transformers (torch, fp32)
and onnxruntime (fp32 and int8 ONNX files; with --onnx-variants also the float16 variant),
plus the agreement figures between them, each also without the outlier channel.

The format is described in testdata/README.md. Every vector is float32; each value is
written as the exact decimal of the float32 (via float(np.float32)), so it round-trips.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from sentence_transformers import SentenceTransformer
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_model import outlier_channel  # noqa: E402  (one definition of the channel)

PROMPTS = {"query": "検索クエリ: ", "document": "検索文書: ", "topic": "トピック: ", "": ""}
PAD_ID = 3


def int8_isa() -> dict:
    """The x86 instruction sets ONNX Runtime's int8 kernels are chosen by, from /proc/cpuinfo."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return {
        "avx512_vnni": "avx512_vnni" in flags,
        "avx512": {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags,
        "avx_vnni": "avx_vnni" in flags,
        "avx2": "avx2" in flags,
    }


def f32_list(v) -> list[float]:
    return [float(x) for x in np.asarray(v, dtype=np.float32)]


def normalize64(v: np.ndarray) -> np.ndarray:
    """L2 normalize in float64, then cast: a precise target for any f32 implementation."""
    v = np.asarray(v, dtype=np.float64)
    return (v / np.linalg.norm(v, axis=-1, keepdims=True)).astype(np.float32)


OUTLIER = None  # the outlier channel of the model being referenced (set in main)


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    """Agreement of two sets of vectors, also with the outlier channel removed: it holds ~0.8
    of each unit vector and is nearly the same in every vector, so it inflates the cosine."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)

    def cosine(x, y):
        return np.sum(x * y, -1) / (np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1))

    a_rest, b_rest = np.delete(a, OUTLIER, axis=-1), np.delete(b, OUTLIER, axis=-1)
    return {"max_abs_diff": float(np.max(np.abs(a - b))),
            "min_cosine": float(np.min(cosine(a, b))),
            "max_abs_diff_without_outlier": float(np.max(np.abs(a_rest - b_rest))),
            "min_cosine_without_outlier": float(np.min(cosine(a_rest, b_rest)))}


def session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    # One thread: reductions then run in a fixed order, so reruns give the same bits.
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def run_ort(sess: ort.InferenceSession, batch: list[list[int]]) -> np.ndarray:
    s = max(len(ids) for ids in batch)
    ids = np.full((len(batch), s), PAD_ID, dtype=np.int64)
    mask = np.zeros((len(batch), s), dtype=np.int64)
    for i, row in enumerate(batch):
        ids[i, :len(row)] = row
        mask[i, :len(row)] = 1
    out = dict(zip([o.name for o in sess.get_outputs()],
                   sess.run(None, {"input_ids": ids, "attention_mask": mask})))
    return out["sentence_embedding"]


def torch_padded(model: SentenceTransformer, batch: list[list[int]]) -> np.ndarray:
    """The same padded batch through the sentence-transformers modules (torch)."""
    s = max(len(ids) for ids in batch)
    ids = torch.full((len(batch), s), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(batch), s), dtype=torch.long)
    for i, row in enumerate(batch):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
    with torch.no_grad():
        out = model({"input_ids": ids, "attention_mask": mask})
    return out["sentence_embedding"].numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--model-dir-label", required=True, help="model_dir as written in the JSON")
    ap.add_argument("--inputs", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--command", required=True, help="generator command recorded in the JSON")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--onnx-variants", type=Path,
                    help="folder with tiny_fp16.onnx and tiny_normalized_opset14.onnx")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = SentenceTransformer(str(args.model_dir), device="cpu")
    model.eval()
    assert model.prompts == PROMPTS, model.prompts
    max_len = model.max_seq_length
    dim = model.get_embedding_dimension()
    global OUTLIER
    OUTLIER = outlier_channel(dim)
    print(f"loaded {args.model_dir}: max_seq_length={max_len} dim={dim} modules="
          f"{[type(m).__name__ for m in model]} outlier_channel={OUTLIER}")
    raw_tok = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    fp32 = session(args.model_dir / "onnx" / "model.onnx")
    int8 = session(args.model_dir / "onnx" / "model_quantized.onnx")
    fp16, fp16_error, normalized14 = None, None, None
    if args.onnx_variants:
        # The float16 file may not run on ORT's CPU provider; record what happens.
        try:
            fp16 = session(args.onnx_variants / "tiny_fp16.onnx")
            run_ort(fp16, [[1, 2]])
        except Exception as e:  # noqa: BLE001
            fp16, fp16_error = None, f"{type(e).__name__}: {e}"
            print(f"  tiny_fp16.onnx does not run on CPUExecutionProvider: {fp16_error}")
        normalized14 = session(args.onnx_variants / "tiny_normalized_opset14.onnx")

    fed: list[torch.Tensor] = []
    model[0].register_forward_pre_hook(
        lambda _module, args, kwargs: fed.append(
            (args[0] if args else kwargs["features"])["input_ids"].clone()),
        with_kwargs=True)

    inputs = json.loads(args.inputs.read_text(encoding="utf-8"))
    items, st_all, st_norm_all, o32_all, o8_all, token_batches = [], [], [], [], [], []
    o16_all, n14_all = [], []
    for inp in inputs:
        prompt = PROMPTS[inp["prompt_name"]]
        full = prompt + inp["text"]
        untruncated = raw_tok.encode(full).ids
        truncated = len(untruncated) > max_len
        kwargs = dict(prompt=prompt, batch_size=1, convert_to_numpy=True)
        fed.clear()
        st = model.encode([inp["text"]], normalize_embeddings=False, **kwargs)[0]
        # The ids sentence-transformers itself fed the model (its prompt handling,
        # tokenizer call and truncation), captured at the Transformer module.
        assert len(fed) == 1 and fed[0].shape[0] == 1, inp["id"]
        ids = fed[0][0].tolist()
        assert ids == model.preprocess([full])["input_ids"][0].tolist(), inp["id"]
        st_n = model.encode([inp["text"]], normalize_embeddings=True, **kwargs)[0]
        if truncated:
            assert ids == untruncated[:max_len - 1] + [2], inp["id"]
        else:
            assert ids == untruncated, inp["id"]
        o32 = run_ort(fp32, [ids])[0]
        o8 = run_ort(int8, [ids])[0]
        items.append({
            "id": inp["id"], "prompt_name": inp["prompt_name"], "prompt": prompt,
            "text": inp["text"],
            "token_ids": ids, "untruncated_token_ids": untruncated, "truncated": truncated,
            "st_fp32": {"mean": f32_list(st), "normalized": f32_list(st_n)},
            "ort_fp32": {"mean": f32_list(o32), "normalized": f32_list(normalize64(o32))},
            "ort_int8": {"mean": f32_list(o8), "normalized": f32_list(normalize64(o8))},
        })
        if fp16 is not None:
            # float16 outputs; every float16 is exactly a float32.
            o16 = run_ort(fp16, [ids])[0].astype(np.float32)
            assert np.all(np.isfinite(o16)), inp["id"]
            items[-1]["ort_fp16"] = {"mean": f32_list(o16),
                                     "normalized": f32_list(normalize64(o16))}
            o16_all.append(o16)
        if normalized14 is not None:
            n14_all.append(run_ort(normalized14, [ids])[0])
        st_all.append(st)
        st_norm_all.append(st_n)
        o32_all.append(o32)
        o8_all.append(o8)
        token_batches.append(ids)
        print(f"  {inp['id']}: {len(ids)} tokens"
              f"{f' (truncated from {len(untruncated)})' if truncated else ''}")

    st_all, st_norm_all = np.stack(st_all), np.stack(st_norm_all)
    o32_all, o8_all = np.stack(o32_all), np.stack(o8_all)
    # Every input in one padded batch: the export must not depend on length or padding.
    o32_batch = run_ort(fp32, token_batches)
    o8_batch = run_ort(int8, token_batches)
    torch_batch = torch_padded(model, token_batches)
    checks = {
        "ort_fp32_vs_st_fp32_mean": compare(o32_all, st_all),
        "ort_fp32_vs_st_fp32_normalized": compare(normalize64(o32_all), st_norm_all),
        "ort_int8_vs_ort_fp32_mean": compare(o8_all, o32_all),
        "ort_int8_vs_st_fp32_normalized": compare(normalize64(o8_all), st_norm_all),
        "ort_fp32_padded_batch_vs_torch_padded_batch_mean": compare(o32_batch, torch_batch),
        "ort_fp32_padded_batch_vs_st_fp32_mean": compare(o32_batch, st_all),
        # Dynamic int8 quantizes activations with one scale per tensor, computed over the
        # whole batch (padding included), so int8 results depend on batch composition.
        "ort_int8_padded_batch_vs_ort_int8_single_mean": compare(o8_batch, o8_all),
        "padded_batch_shape": [len(token_batches), max(len(t) for t in token_batches)],
    }
    # How much of each raw st_fp32 vector the outlier channel holds: |v_c| / ||v||.
    share = np.abs(st_all[:, OUTLIER]) / np.linalg.norm(st_all.astype(np.float64), axis=1)
    checks["st_fp32_outlier_share"] = {"median": float(np.median(share)),
                                       "min": float(share.min()), "max": float(share.max())}
    if args.onnx_variants:
        if fp16 is not None:
            o16_all = np.stack(o16_all)
            o16_batch = run_ort(fp16, token_batches).astype(np.float32)
            checks["ort_fp16_vs_st_fp32_mean"] = compare(o16_all, st_all)
            checks["ort_fp16_vs_st_fp32_normalized"] = compare(normalize64(o16_all), st_norm_all)
            # NaN would come from padding rows that see no key in a sliding window (their
            # fully masked softmax); mean pooling multiplies them by 0 but NaN * 0 = NaN.
            checks["ort_fp16_padded_batch_finite"] = bool(np.all(np.isfinite(o16_batch)))
            if checks["ort_fp16_padded_batch_finite"]:
                checks["ort_fp16_padded_batch_vs_st_fp32_mean"] = compare(o16_batch, st_all)
        else:
            checks["ort_fp16_error"] = fp16_error
        n14_all = np.stack(n14_all)
        checks["ort_normalized_opset14_vs_st_fp32_normalized"] = compare(n14_all, st_norm_all)
        n14 = checks["ort_normalized_opset14_vs_st_fp32_normalized"]
        assert n14["max_abs_diff"] <= 1e-5, n14
    for k, v in checks.items():
        print(f"  check {k}: {v}")
    n = checks["ort_fp32_vs_st_fp32_normalized"]
    assert n["max_abs_diff"] <= 1e-5 and n["min_cosine"] >= 0.99999, n
    b = checks["ort_fp32_padded_batch_vs_st_fp32_mean"]
    assert b["min_cosine"] >= 0.99999, b

    doc = {
        "generator": {
            "command": args.command,
            "seed": args.seed,
            "versions": {p.replace("-", "_"): version(p) for p in [
                "torch", "transformers", "sentence-transformers", "onnxruntime", "onnx",
                "tokenizers", "numpy", "safetensors", "sentencepiece"]},
        },
        "model_dir": args.model_dir_label,
        "max_seq_length": max_len,
        "dim": dim,
        # The planted massive-activation channel (tools/testdata/build_model.py).
        "outlier_channel": OUTLIER,
        # ONNX Runtime's int8 GEMM kernels depend on these (MLAS dispatches on them), so the
        # ort_int8 vectors are only reproducible to float summation order on a CPU that has
        # the same ones (ruri_testkit::Reference::int8_kernels_match).
        "int8_isa": int8_isa(),
        "checks": checks,
        "items": items,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"references: {len(items)} items -> {args.out}")


if __name__ == "__main__":
    main()
