#!/usr/bin/env python3
"""Ruri v3 at its four real shapes (30m, 70m, 130m, 310m), with weights that Rust can rebuild
bit for bit, so that no weight file has to be committed. See testdata/shapes/README.md.

For each size this writes, under --out-root/<size>/ (small files only):
  config.json, modules.json, sentence_bert_config.json, 1_Pooling/config.json,
  config_sentence_transformers.json   the folder as the published models have it
  onnx/model.onnx                     the exported graph, every parameter as external data
  weights.json                        the weight recipe (tensor list, PRNG streams, checksums)
                                      and where each ONNX parameter goes in model.onnx.data
and the reference vectors (sentence-transformers, fp32) to --ref-root/<size>.json.

The weights come from a counter-based PRNG (SplitMix64, below) that
tools/testkit/src/shapes.rs implements identically; model.safetensors and onnx/model.onnx.data
are rebuilt from it (here in a scratch folder, in Rust in a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_model import (  # noqa: E402  (same folder)
    PROMPTS,
    SentenceEmbedder,
    dummy_batch,
    legacy_config,
    write_json,
    write_st_files,
)

# hidden, layers (full depth), heads, intermediate: the published Ruri v3 configs.
SIZES = {
    "30m": dict(hidden_size=256, num_hidden_layers=10, num_attention_heads=4,
                intermediate_size=1024),
    "70m": dict(hidden_size=384, num_hidden_layers=13, num_attention_heads=6,
                intermediate_size=1536),
    "130m": dict(hidden_size=512, num_hidden_layers=19, num_attention_heads=8,
                 intermediate_size=2048),
    "310m": dict(hidden_size=768, num_hidden_layers=25, num_attention_heads=12,
                 intermediate_size=3072),
}
CI_LAYERS = 4  # global attention on layers 0 and 3, local on 1 and 2
MAX_SEQ_LENGTH = 8192
BASE_SEED = 20241130
PAD_ID = 3
# testdata/inputs.json ids: a prompt, an empty text, byte fallback, literal specials, and two
# long texts (342 and 377 tokens: the 128-token window is crossed several times, and the
# shorter one is padded in a batch with the longer).
INPUT_IDS = ["query_capital", "empty", "emoji", "literal_special_tokens",
             "long_over_two_windows_plain", "long_over_two_windows"]
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]

# --- the PRNG (tools/testkit/src/shapes.rs implements the same) -----------------------------

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def _mix(z):
    """SplitMix64's output function (Vigna), on Python ints or numpy uint64 arrays."""
    if isinstance(z, int):
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & MASK64
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB & MASK64
        return z ^ (z >> 31)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def splitmix64(seed: int, i: int) -> int:
    """Output i (0-based) of SplitMix64 seeded with `seed`: mix(seed + (i + 1)·γ mod 2^64)."""
    return _mix((seed + (i + 1) * GAMMA) & MASK64)


def splitmix64_stream(seed: int, n: int) -> np.ndarray:
    """Outputs 0..n of SplitMix64 seeded with `seed`, as uint64 (wrapping arithmetic)."""
    i = np.arange(1, n + 1, dtype=np.uint64)
    return _mix(np.uint64(seed) + i * np.uint64(GAMMA))


def stream_seed(k: int) -> int:
    """Seed of tensor k's stream: output k of SplitMix64 seeded with BASE_SEED."""
    return splitmix64(BASE_SEED, k)


def uniform_pm1(seed: int, n: int) -> np.ndarray:
    """v = 2u − 1 with u = (x >> 40) · 2^-24: 24-bit uniforms in [-1, 1), exact in f32."""
    x = splitmix64_stream(seed, n)
    u = (x >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)
    return np.float32(2.0) * u - np.float32(1.0)


def linear_scale(fan_in: int) -> np.float32:
    # sqrt(3 / fan_in) in f64, rounded once to f32: variance 1/fan_in.
    return np.float32(math.sqrt(3.0 / fan_in))


EMBEDDING_SCALE = np.float32(math.sqrt(3.0))  # variance 1
NORM_SCALE = np.float32(0.1 * math.sqrt(3.0))  # 1 + 0.1·N(0, 1)-like


def make_tensor(init: str, shape: list[int], k: int) -> np.ndarray:
    n = int(np.prod(shape))
    v = uniform_pm1(stream_seed(k), n)
    if init == "embedding":
        w = v * EMBEDDING_SCALE
    elif init == "linear":
        w = v * linear_scale(shape[1])
    elif init == "norm":
        # Two f32 roundings (product, then sum); no fused multiply-add.
        w = np.float32(1.0) + NORM_SCALE * v
    else:
        raise ValueError(init)
    assert w.dtype == np.float32
    return w.reshape(shape)


def checksum(w: np.ndarray) -> int:
    """Σ bits_i · splitmix64(0, i) mod 2^64 over the f32 bit patterns, in row-major order."""
    bits = np.ascontiguousarray(w, dtype=np.float32).reshape(-1).view(np.uint32)
    weights = splitmix64_stream(0, bits.size)
    return int(np.sum(bits.astype(np.uint64) * weights, dtype=np.uint64))


def tensor_specs(cfg: dict) -> list[dict]:
    """The tensors in their fixed order (ModernBertModel's state_dict order); stream = index."""
    h, i, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    specs = [("embeddings.tok_embeddings.weight", [cfg["vocab_size"], h], "embedding"),
             ("embeddings.norm.weight", [h], "norm")]
    for layer in range(n):
        p = f"layers.{layer}."
        if layer > 0:  # layer 0's attn_norm is an Identity: no weight
            specs.append((p + "attn_norm.weight", [h], "norm"))
        specs += [(p + "attn.Wqkv.weight", [3 * h, h], "linear"),
                  (p + "attn.Wo.weight", [h, h], "linear"),
                  (p + "mlp_norm.weight", [h], "norm"),
                  (p + "mlp.Wi.weight", [2 * i, h], "linear"),
                  (p + "mlp.Wo.weight", [h, i], "linear")]
    specs.append(("final_norm.weight", [h], "norm"))
    return [dict(name=name, shape=shape, init=init, stream=k)
            for k, (name, shape, init) in enumerate(specs)]


def print_prng_pins() -> None:
    """Values tools/testkit/src/shapes.rs pins in its unit test."""
    print("PRNG pins:")
    # Vigna's SplitMix64 seeded with 0 starts 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4.
    print(f"  splitmix64(0, 0..2) = {splitmix64(0, 0):#018x}, {splitmix64(0, 1):#018x}")
    for k in range(3):
        print(f"  stream_seed({k}) = {stream_seed(k):#018x}")
    s = stream_seed(0)
    print("  splitmix64(stream_seed(0), 0..4) =",
          [f"{int(x):#018x}" for x in splitmix64_stream(s, 4)])
    for init, shape, k in [("embedding", [2, 3], 0), ("norm", [4], 1), ("linear", [2, 3], 2),
                           ("linear", [1, 1024], 5)]:
        w = make_tensor(init, shape, k).reshape(-1)
        print(f"  make_tensor({init}, {shape}, stream {k})[:4] bits =",
              [f"{int(b):#010x}" for b in w[:4].view(np.uint32)], "=",
              [float(x) for x in w[:4]], f"checksum {checksum(w):#018x}")


# --- model folder --------------------------------------------------------------------------

def size_config(size: str, layers: int, vocab_size: int) -> dict:
    shape = dict(SIZES[size], num_hidden_layers=layers)
    return legacy_config(shape, vocab_size)


def build_weights(cfg: dict, specs: list[dict]) -> dict[str, np.ndarray]:
    from transformers import ModernBertConfig, ModernBertModel

    # The exact parameter names, shapes and order ModernBertModel has for this config.
    model = ModernBertModel(ModernBertConfig(**cfg))
    have = [(k, list(v.shape)) for k, v in model.state_dict().items()]
    want = [(s["name"], s["shape"]) for s in specs]
    assert have == want, f"tensor list differs from ModernBertModel's state_dict:\n{have}\n{want}"
    weights = {}
    for s in specs:
        w = make_tensor(s["init"], s["shape"], s["stream"])
        s["checksum"] = f"{checksum(w):#018x}"
        weights[s["name"]] = w
    return weights


def write_folder(work: Path, out: Path, cfg: dict, weights: dict[str, np.ndarray],
                 tokenizer_dir: Path) -> None:
    """The full model folder in `work` (scratch); the small files also go to `out`."""
    from safetensors.numpy import save_file

    shape = dict(hidden_size=cfg["hidden_size"], max_seq_length=MAX_SEQ_LENGTH)
    for d in (work, out):
        write_json(d / "config.json", cfg)
        write_st_files(d, shape)
    for f in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / f, work / f)
    save_file(weights, str(work / "model.safetensors"), metadata={"format": "pt"})


def load_hf(work: Path, attn: str, **overrides):
    from transformers import AutoModel
    return AutoModel.from_pretrained(str(work), attn_implementation=attn, **overrides).eval()


def check_loaded(work: Path, cfg: dict) -> None:
    """What transformers makes of the legacy config (as build_model.verify_loaded)."""
    model = load_hf(work, "sdpa")
    c, n = model.config, cfg["num_hidden_layers"]
    assert c.layer_types == ["full_attention" if i % 3 == 0 else "sliding_attention"
                             for i in range(n)], c.layer_types
    assert c.local_attention == 128 and c.sliding_window == 64
    assert c.rope_parameters["full_attention"]["rope_theta"] == 160000.0
    assert c.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
    assert c.pad_token_id == PAD_ID and c.norm_eps == 1e-5
    assert c.hidden_size == cfg["hidden_size"] and c.num_attention_heads == cfg[
        "num_attention_heads"] and c.intermediate_size == cfg["intermediate_size"]
    assert isinstance(model.layers[0].attn_norm, torch.nn.Identity)
    print(f"  loaded: layer_types={c.layer_types}")


def pooled(model, ids: list[list[int]]) -> np.ndarray:
    s = max(len(r) for r in ids)
    t = torch.full((len(ids), s), PAD_ID, dtype=torch.long)
    m = torch.zeros((len(ids), s), dtype=torch.long)
    for b, r in enumerate(ids):
        t[b, :len(r)] = torch.tensor(r)
        m[b, :len(r)] = 1
    with torch.no_grad():
        return SentenceEmbedder(model)(t, m)[1].numpy()


def cos64(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def window_matters(work: Path, long_items: list[dict]) -> dict:
    """Dropping the sliding window must visibly move every long input (cosine < 0.9999)."""
    model = load_hf(work, "sdpa")
    wide = load_hf(work, "sdpa", local_attention=1 << 20)
    out = {}
    for item in long_items:
        ids = [item["token_ids"]]
        c = cos64(pooled(model, ids)[0], pooled(wide, ids)[0])
        out[item["id"]] = {"tokens": len(item["token_ids"]), "cosine_without_window": c}
        print(f"  window matters: {item['id']} ({len(item['token_ids'])} tokens): "
              f"cosine(window 128, no window) = {c:.6f}")
        assert c < 0.9999, f"{item['id']}: the sliding window does not show ({c})"
    return out


# --- ONNX with external parameters ---------------------------------------------------------

def export_graph(work: Path, out: Path, specs: list[dict], weights: dict[str, np.ndarray],
                 vocab: int) -> dict:
    """Exports with every parameter left a named initializer, moves the parameters to
    external data (model.onnx.data) and writes only the graph to out/onnx/model.onnx.
    Returns the manifest's "onnx" section."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import set_external_data

    (work / "onnx").mkdir(parents=True, exist_ok=True)
    (out / "onnx").mkdir(parents=True, exist_ok=True)
    wrapper = SentenceEmbedder(load_hf(work, "eager")).eval()
    # Longer than the 128-token window and padded, so no shortcut can be traced in.
    ids, mask = dummy_batch(vocab, [333, 150], seed=1)
    full = work / "onnx" / "model_inline.onnx"
    with torch.no_grad():
        torch.onnx.export(
            wrapper, (ids, mask), str(full), dynamo=False, opset_version=17,
            input_names=["input_ids", "attention_mask"],
            output_names=["token_embeddings", "sentence_embedding"],
            dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                          "attention_mask": {0: "batch", 1: "sequence"},
                          "token_embeddings": {0: "batch", 1: "sequence"},
                          "sentence_embedding": {0: "batch"}},
            do_constant_folding=False)
    proto = onnx.load(str(full))

    # Which initializer holds which tensor: by name (wrapper prefix "model."), else by value
    # (the tensor itself or its transpose), so a renamed or transposed parameter still maps.
    by_checksum = {}
    for s in specs:
        w = weights[s["name"]]
        by_checksum[(tuple(w.shape), checksum(w))] = (s["name"], False)
        if w.ndim == 2:
            by_checksum[(tuple(w.T.shape), checksum(w.T))] = (s["name"], True)
    entries, offset, covered = [], 0, set()
    align = 4096
    for init in proto.graph.initializer:
        arr = numpy_helper.to_array(init)
        name = init.name.removeprefix("model.")
        if name in weights and arr.dtype == np.float32 and np.array_equal(
                arr.view(np.uint32), weights[name].view(np.uint32)):
            source, transpose = name, False
        elif arr.dtype == np.float32 and arr.size >= 64 and \
                (tuple(arr.shape), checksum(arr)) in by_checksum:
            source, transpose = by_checksum[(tuple(arr.shape), checksum(arr))]
            src = weights[source].T if transpose else weights[source]
            assert np.array_equal(arr.view(np.uint32), src.view(np.uint32)), init.name
        else:
            continue  # a small constant of the graph: stays inline
        length = arr.size * 4
        offset = (offset + align - 1) // align * align
        entries.append(dict(name=init.name, source=source, transpose=transpose,
                            offset=offset, length=length, dims=list(arr.shape)))
        set_external_data(init, location="model.onnx.data", offset=offset, length=length)
        init.ClearField("raw_data")
        init.data_location = onnx.TensorProto.EXTERNAL
        covered.add(source)
        offset += length
    missing = [s["name"] for s in specs if s["name"] not in covered]
    assert not missing, f"parameters not found as initializers (folded away?): {missing}"
    renamed = [e for e in entries if e["name"] != "model." + e["source"] or e["transpose"]]
    inline = [(i.name, list(i.dims)) for i in proto.graph.initializer
              if i.data_location != onnx.TensorProto.EXTERNAL]
    print(f"  onnx: {len(entries)} parameter initializers external ({len(renamed)} renamed or "
          f"transposed), {len(inline)} small initializers inline")
    graph = out / "onnx" / "model.onnx"
    onnx.save(proto, str(graph))
    full.unlink()
    print(f"  onnx graph: {graph} ({graph.stat().st_size} bytes), data {offset} bytes")
    return dict(graph="onnx/model.onnx", data="onnx/model.onnx.data", data_length=offset,
                alignment=align, initializers=entries)


def write_onnx_data(path: Path, onnx_manifest: dict, weights: dict[str, np.ndarray]) -> None:
    """model.onnx.data from the weights, exactly as shapes.rs writes it: zeros, then each
    initializer's f32 little-endian bytes (transposed when flagged) at its offset."""
    buf = bytearray(onnx_manifest["data_length"])
    for e in onnx_manifest["initializers"]:
        w = weights[e["source"]]
        w = np.ascontiguousarray(w.T if e["transpose"] else w, dtype="<f4")
        assert list(w.shape) == e["dims"] and w.nbytes == e["length"]
        buf[e["offset"]:e["offset"] + e["length"]] = w.tobytes()
    path.write_bytes(bytes(buf))


def ort_session(graph: Path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])


def check_onnx(work: Path, out: Path, vocab: int) -> dict:
    """onnxruntime on the committed graph + data rebuilt from the PRNG vs torch."""
    shutil.copyfile(out / "onnx" / "model.onnx", work / "onnx" / "model.onnx")
    sess = ort_session(work / "onnx" / "model.onnx")
    model = SentenceEmbedder(load_hf(work, "sdpa")).eval()
    worst_abs, worst_rel = 0.0, 0.0
    for k, lengths in enumerate([[1], [2], [65], [66], [129], [333], [727],
                                 [727, 1, 65, 129, 300]]):
        ids, mask = dummy_batch(vocab, lengths, seed=100 + k)
        with torch.no_grad():
            _, sent = model(ids, mask)
        _, o_sent = sess.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        d = float(np.max(np.abs(o_sent - sent.numpy())))
        scale = float(np.max(np.abs(sent.numpy())))
        worst_abs, worst_rel = max(worst_abs, d), max(worst_rel, d / max(1.0, scale))
        assert d <= 1e-5 * max(1.0, scale), f"ONNX differs from torch at {lengths}: {d}"
    print(f"  onnxruntime (graph + PRNG data) vs torch: max |Δ| {worst_abs:.2e} "
          f"(relative {worst_rel:.2e})")
    return {"max_abs_diff": worst_abs, "max_rel_diff": worst_rel}


# --- references ----------------------------------------------------------------------------

def f32_list(v) -> list[float]:
    return [float(x) for x in np.asarray(v, dtype=np.float32)]


def normalize64(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return (v / np.linalg.norm(v, axis=-1, keepdims=True)).astype(np.float32)


def references(work: Path, inputs: list[dict]) -> list[dict]:
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    model = SentenceTransformer(str(work), device="cpu").eval()
    assert model.prompts == PROMPTS, model.prompts
    assert model.max_seq_length == MAX_SEQ_LENGTH
    raw_tok = Tokenizer.from_file(str(work / "tokenizer.json"))
    fed: list[torch.Tensor] = []
    model[0].register_forward_pre_hook(
        lambda _m, args, kwargs: fed.append(
            (args[0] if args else kwargs["features"])["input_ids"].clone()),
        with_kwargs=True)
    items = []
    for inp in inputs:
        prompt = PROMPTS[inp["prompt_name"]]
        kwargs = dict(prompt=prompt, batch_size=1, convert_to_numpy=True)
        fed.clear()
        st = model.encode([inp["text"]], normalize_embeddings=False, **kwargs)[0]
        assert len(fed) == 1 and fed[0].shape[0] == 1, inp["id"]
        ids = fed[0][0].tolist()
        assert ids == raw_tok.encode(prompt + inp["text"]).ids, inp["id"]
        st_n = model.encode([inp["text"]], normalize_embeddings=True, **kwargs)[0]
        items.append({
            "id": inp["id"], "prompt_name": inp["prompt_name"], "prompt": prompt,
            "text": inp["text"], "token_ids": ids, "truncated": False,
            "st_fp32": {"mean": f32_list(st), "normalized": f32_list(st_n)},
        })
        print(f"  {inp['id']}: {len(ids)} tokens")
    return items


def compare(a, b) -> dict:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    cos = np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    return {"max_abs_diff": float(np.max(np.abs(a - b))), "min_cosine": float(np.min(cos))}


# --- main ----------------------------------------------------------------------------------

def build_size(size: str, layers: int, args, inputs: list[dict]) -> None:
    out, work = args.out_root / size, args.work_root / size
    print(f"== {size}: {layers} layers -> {out}")
    for d in (out, work):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    tok = json.loads((args.tokenizer / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = len(tok["model"]["vocab"])
    cfg = size_config(size, layers, vocab)
    specs = tensor_specs(cfg)
    weights = build_weights(cfg, specs)
    print(f"  {sum(w.size for w in weights.values())} parameters in {len(specs)} tensors")
    write_folder(work, out, cfg, weights, args.tokenizer)
    check_loaded(work, cfg)

    onnx_manifest = export_graph(work, out, specs, weights, vocab)
    write_onnx_data(work / "onnx" / "model.onnx.data", onnx_manifest, weights)
    onnx_check = check_onnx(work, out, vocab)

    items = references(work, inputs)
    long_items = [i for i in items if len(i["token_ids"]) > 300]
    assert long_items, "no input crosses the window several times"
    window = window_matters(work, long_items)

    # onnxruntime-Python on the same inputs, one by one and in one padded batch.
    sess = ort_session(work / "onnx" / "model.onnx")

    def run(batch):
        s = max(len(r) for r in batch)
        ids = np.full((len(batch), s), PAD_ID, dtype=np.int64)
        mask = np.zeros((len(batch), s), dtype=np.int64)
        for b, r in enumerate(batch):
            ids[b, :len(r)], mask[b, :len(r)] = r, 1
        return sess.run(["sentence_embedding"], {"input_ids": ids, "attention_mask": mask})[0]

    st_n = np.stack([i["st_fp32"]["normalized"] for i in items])
    alone = np.concatenate([run([i["token_ids"]]) for i in items])
    together = run([i["token_ids"] for i in items])
    checks = {
        "onnx_graph_vs_torch_sentence": onnx_check,
        "ort_py_fp32_alone_vs_st_fp32_normalized": compare(normalize64(alone), st_n),
        "ort_py_fp32_padded_batch_vs_st_fp32_normalized": compare(normalize64(together), st_n),
        "window_matters": window,
    }
    for k in ("ort_py_fp32_alone_vs_st_fp32_normalized",
              "ort_py_fp32_padded_batch_vs_st_fp32_normalized"):
        print(f"  check {k}: {checks[k]}")
        assert checks[k]["max_abs_diff"] <= 1e-5 and checks[k]["min_cosine"] >= 0.99999

    manifest = {
        "about": "Weight recipe for this folder; see testdata/shapes/README.md. "
                 "Made by tools/testdata/shapes.py.",
        "size": size,
        "prng": {"algorithm": "splitmix64-counter-v1", "base_seed": BASE_SEED},
        "tensors": specs,
        "onnx": onnx_manifest,
    }
    write_json(out / "weights.json", manifest)
    doc = {
        "generator": {
            "command": args.command, "seed": BASE_SEED,
            "versions": {p.replace("-", "_"): version(p) for p in [
                "torch", "transformers", "sentence-transformers", "onnxruntime", "onnx",
                "tokenizers", "numpy", "safetensors"]},
        },
        "size": size, "num_hidden_layers": layers, "model_dir": str(out),
        "max_seq_length": MAX_SEQ_LENGTH, "dim": cfg["hidden_size"],
        "checks": checks, "items": items,
    }
    ref = args.ref_root / f"{size}.json"
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"  references: {len(items)} items -> {ref}")
    if not args.keep_work:
        shutil.rmtree(work)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--full", action="store_true", help="the real layer counts (else 4)")
    ap.add_argument("--out-root", type=Path, required=True)
    ap.add_argument("--ref-root", type=Path, required=True)
    ap.add_argument("--work-root", type=Path, required=True,
                    help="scratch folders with the weights (deleted unless --keep-work)")
    ap.add_argument("--keep-work", action="store_true")
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--inputs", type=Path, required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--pins-only", action="store_true")
    args = ap.parse_args()

    print_prng_pins()
    if args.pins_only:
        return
    torch.manual_seed(BASE_SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    all_inputs = {i["id"]: i for i in json.loads(args.inputs.read_text(encoding="utf-8"))}
    inputs = [all_inputs[i] for i in INPUT_IDS]
    for size in args.sizes.split(","):
        layers = SIZES[size]["num_hidden_layers"] if args.full else CI_LAYERS
        build_size(size, layers, args, inputs)


if __name__ == "__main__":
    main()
