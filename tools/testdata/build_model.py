#!/usr/bin/env python3
"""Write a seeded random-weight ModernBERT in the folder layout of the published Ruri v3
models (legacy transformers-4 / sentence-transformers-3 file formats), export it to ONNX
(fp32 + dynamic int8, layout of sirasagi62/ruri-v3-30m-ONNX) and verify what
transformers 5 loads from it.

The tokenizer files (tokenizer.json, tokenizer_config.json, special_tokens_map.json) must
already be in --out-dir (train_tokenizer.py writes them).

The random weights carry a planted massive-activation ("outlier") channel like the one
real Ruri v3 models have (plant_outlier, calibrate_layers, calibrate_final_norm,
check_outlier); with
--variants-dir it also writes two more ONNX files (export_variants).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

SHAPES = {
    # hidden, layers, heads, intermediate, max_seq_length (sentence_bert_config)
    "tiny": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                 intermediate_size=128, max_seq_length=512),
    "30m": dict(hidden_size=256, num_hidden_layers=10, num_attention_heads=4,
                intermediate_size=1024, max_seq_length=8192),
}

PROMPTS = {"query": "検索クエリ: ", "document": "検索文書: ", "topic": "トピック: ", "": ""}

# --- The massive-activation ("outlier") channel -------------------------------------------
# Real ruri-v3-30m vectors put about 0.8 of their unit length into one dimension (index 152
# of 256): a channel that is huge in the residual stream of every layer. Random weights have
# no such channel, and int8 / f16 / bf16 errors measured without it are unrealistic (one
# huge channel sets the per-tensor int8 scale of a MatMul input and dominates every
# LayerNorm's variance). We plant one at the same relative position (outlier_channel).
# testdata/README.md ("The outlier channel") has the measured figures. The constants, and
# why (figures measured on tiny / 30m-shape while developing this):
OUTLIER_REAL_INDEX, OUTLIER_REAL_HIDDEN = 152, 256  # ruri-v3-30m
# Target |x_c| / rms(x_others) in the residual stream: at the input of layer 0 (the
# embeddings' output), of every attn_norm / mlp_norm and of final_norm (asserted 20-100).
# A LayerNorm over a residual with a massive channel subtracts its mean, ~x_c / hidden,
# from every other channel: a constant vector, ratio / hidden times the token information,
# in every norm output and so in every pooled vector. It keeps |v_c| / ||v|| similar for a
# 2-token and a 1600-token text (too little and short texts fall below a share of 0.6), and
# it dilutes how much the other channels move with the input (too much and the sliding
# window stops showing). 50 satisfies both at hidden 64 and 256.
OUTLIER_RESIDUAL_RATIO = 50.0
# Column c of the token embedding table: every token carries +10 there, against N(0, 1) in
# the other columns, so after embeddings.norm (a LayerNorm) channel c is ~10x the others;
# embeddings.norm.weight[c] = OUTLIER_RESIDUAL_RATIO / 10 = 5 makes it ~50x.
OUTLIER_TOK_EMBEDDING = 10.0
# Target |y_c| / rms(y_others) at every attn_norm / mlp_norm output, the inputs of the
# quantized MatMuls (asserted 5-20): an outlier that sets the int8 activation scale.
OUTLIER_NORM_OUTPUT_RATIO = 10.0
# Trained models keep small the weights that read a massive channel. Column c of every
# Wqkv and Wi is multiplied by 1 / (the ratio that Linear sees): 1 / OUTLIER_RESIDUAL_RATIO
# for layer 0's Wqkv (layer 0 has no attn_norm, it reads the residual stream itself), else
# 1 / OUTLIER_NORM_OUTPUT_RATIO; channel c then feeds the next layer about as much as one
# ordinary channel. With the seeded columns the constant y_c writes one large constant
# vector into every token: the texts become alike (tiny: pairwise cosine without channel c
# median 0.990, min 0.883) and the sliding window stops showing (0.999976, asserted
# < 0.9999).
OUTLIER_READ_SCALE = 1.0 / OUTLIER_NORM_OUTPUT_RATIO
# Every sublayer adds to the other channels of the residual stream, so on its own the ratio
# falls (tiny: 50 at layer 0, 18 at final_norm, 10 for some texts). One quarter of each
# MLP's intermediate units are therefore "outlier writers": gate row = input row = 2x the
# seeded input row, both blind to channel c, so the unit's GeGLU output gelu(z) z = z^2 Phi(z) is >= 0 and grows
# like |y_others|^2; its Wo column writes only channel c, one weight per layer calibrated so
# that the ratio after the MLP is again the target. A token whose other channels grew more
# (few or repeated tokens, which attention does not average down) gets a bigger write, so
# the ratio is self-stabilizing; a write linear in the MLP's input (tried first) let the
# ratio drift to 5-15 on such texts, and their share down to 0.15. The quarter and the 2x
# keep the writer weights (tiny 0.19-0.37, 30m-shape 0.009-0.019) inside the range of Wo's
# seeded weights: with weights ~3, per-tensor int8 weight quantization of mlp.Wo broke
# (int8 vs fp32 cosine -0.56).
OUTLIER_WRITER_FRACTION = 1 / 4
OUTLIER_WRITER_INPUT_GAIN = 2.0
# The per-layer calibration (norm gains and weight[c], MLP writer weights;
# each rounded to 4 significant digits) runs on seeded random-token sequences of these
# lengths, not on the committed inputs, which then measure the result (check_outlier).
CALIBRATION_LENGTHS = [300, 150, 60, 20]
CALIBRATION_SEED = 300
# final_norm.weight[c] is solved in closed form (calibrate_final_norm) so that the median
# share |v_c| / ||v|| of the raw mean-pooled vector over testdata/inputs.json is 0.80, then
# rounded to 4 significant digits.
OUTLIER_POOLED_SHARE = 0.80
# Asserted ranges (check_outlier).
RESIDUAL_RATIO_RANGE = (20.0, 100.0)   # mean over tokens of |x_c| / rms(x_others)
NORM_OUTPUT_RATIO_RANGE = (5.0, 20.0)  # the same at attn_norm / mlp_norm outputs
POOLED_SHARE_EACH = (0.6, 0.95)        # every input
POOLED_SHARE_MEDIAN = (0.78, 0.82)


def outlier_channel(hidden: int) -> int:
    """152 of 256 scaled to this width: tiny (64) -> 38, 30m-shape (256) -> 152."""
    return round(OUTLIER_REAL_INDEX * hidden / OUTLIER_REAL_HIDDEN)


def writer_units(intermediate: int) -> range:
    """The MLP intermediate units that write the outlier forward (the last quarter)."""
    m = max(1, round(OUTLIER_WRITER_FRACTION * intermediate))
    return range(intermediate - m, intermediate)


def legacy_config(shape: dict, vocab_size: int) -> dict:
    """config.json exactly as transformers 4.48 writes a ModernBertConfig (keys sorted)."""
    cfg = {
        "architectures": ["ModernBertModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "classifier_activation": "gelu",
        "classifier_bias": False,
        "classifier_dropout": 0.0,
        "classifier_pooling": "cls",
        "cls_token_id": 6,
        "decoder_bias": True,
        "deterministic_flash_attn": False,
        "embedding_dropout": 0.0,
        "eos_token_id": 2,
        "global_attn_every_n_layers": 3,
        "global_rope_theta": 160000.0,
        "hidden_activation": "gelu",
        "hidden_size": shape["hidden_size"],
        "initializer_cutoff_factor": 2.0,
        "initializer_range": 0.02,
        "intermediate_size": shape["intermediate_size"],
        "layer_norm_eps": 1e-05,
        "local_attention": 128,
        "local_rope_theta": 10000.0,
        "max_position_embeddings": 8192,
        "mlp_bias": False,
        "mlp_dropout": 0.0,
        "model_type": "modernbert",
        "norm_bias": False,
        "norm_eps": 1e-05,
        "num_attention_heads": shape["num_attention_heads"],
        "num_hidden_layers": shape["num_hidden_layers"],
        "pad_token_id": 3,
        "reference_compile": False,
        "repad_logits_with_grad": False,
        "sep_token_id": 4,
        "sparse_pred_ignore_index": -100,
        "sparse_prediction": False,
        "torch_dtype": "float32",
        "transformers_version": "4.48.0",
        "vocab_size": vocab_size,
    }
    return dict(sorted(cfg.items()))


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_st_files(out: Path, shape: dict) -> None:
    write_json(out / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
    ])
    write_json(out / "sentence_bert_config.json",
               {"max_seq_length": shape["max_seq_length"], "do_lower_case": False})
    write_json(out / "1_Pooling" / "config.json", {
        "word_embedding_dimension": shape["hidden_size"],
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False,
        "include_prompt": True,
    })
    write_json(out / "config_sentence_transformers.json", {
        "__version__": {"sentence_transformers": "3.4.1", "transformers": "4.48.0",
                        "pytorch": "2.5.1+cu124"},
        "prompts": PROMPTS,
        "default_prompt_name": None,
        "similarity_fn_name": "cosine",
    })


def random_state_dict(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Weights at a scale where architecture mistakes show (see testdata/README.md).

    The default init (std 0.02) makes every layer nearly the identity on the residual
    stream, so e.g. a missing sliding window barely changes the output. Instead:
    embeddings ~ N(0, 1); Linear ~ N(0, 1/fan_in); LayerNorm weight ~ 1 + 0.1 N(0, 1).
    numpy's PCG64 stream is platform independent, so the bytes are reproducible.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, ref in model.state_dict().items():
        shape = tuple(ref.shape)
        z = rng.standard_normal(shape, dtype=np.float32)
        if name == "embeddings.tok_embeddings.weight":
            w = z
        elif "norm" in name:
            assert name.endswith(".weight") and len(shape) == 1, name
            w = np.float32(1.0) + np.float32(0.1) * z
        else:
            assert len(shape) == 2 and name.endswith(".weight"), name
            w = z * np.float32(1.0 / math.sqrt(shape[1]))
        out[name] = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    return out


def plant_outlier(state: dict[str, torch.Tensor], shape_name: str) -> int:
    """Overwrite the entries that make channel c a massive activation (closed form; the
    calibrated ones follow in calibrate_layers and calibrate_final_norm). Called right after
    random_state_dict, so every other number stays the seeded draw. Returns c."""
    shape = SHAPES[shape_name]
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    c = outlier_channel(hidden)
    state["embeddings.tok_embeddings.weight"][:, c] = OUTLIER_TOK_EMBEDDING
    state["embeddings.norm.weight"][c] = OUTLIER_RESIDUAL_RATIO / OUTLIER_TOK_EMBEDDING
    units = writer_units(inter)
    for n in range(shape["num_hidden_layers"]):
        # Layer 0 has no attn_norm: its Wqkv reads the residual stream itself.
        state[f"layers.{n}.attn.Wqkv.weight"][:, c] *= (
            1.0 / OUTLIER_RESIDUAL_RATIO if n == 0 else OUTLIER_READ_SCALE)
        wi = state[f"layers.{n}.mlp.Wi.weight"]  # rows [0, inter): input, [inter, 2 inter): gate
        wi[:, c] *= OUTLIER_READ_SCALE
        wo = state[f"layers.{n}.mlp.Wo.weight"]
        for k in units:
            # Writer unit: gate = input, both blind to channel c, so its GeGLU output
            # gelu(z) * z = z^2 Phi(z) >= 0 grows with |y_others|^2; it writes only channel c
            # (weight set by calibrate_layers).
            wi[k, c] = 0.0
            wi[k] *= OUTLIER_WRITER_INPUT_GAIN
            wi[inter + k] = wi[k]
            wo[:, k] = 0.0
    state["final_norm.weight"][c] = 1.0  # placeholder, see calibrate_final_norm
    return c


def calibrate_layers(model: torch.nn.Module, c: int, vocab: int) -> list[dict]:
    """Per layer, in forward order: each norm's gain (the other channels' weights, times one
    factor that brings them to rms 1) and weight[c] (output ratio OUTLIER_NORM_OUTPUT_RATIO),
    then the MLP's writer weight (ratio OUTLIER_RESIDUAL_RATIO after the MLP). Measured on
    CALIBRATION_LENGTHS random-token sequences; works on the torch module in place."""
    seqs = [dummy_batch(vocab, [n], seed=CALIBRATION_SEED + k)[0]
            for k, n in enumerate(CALIBRATION_LENGTHS)]
    hidden = model.config.hidden_size
    inter = model.config.intermediate_size
    others = torch.arange(hidden) != c
    units = torch.tensor(list(writer_units(inter)))
    target = OUTLIER_RESIDUAL_RATIO

    def r4(x: float) -> float:
        # 4 significant digits: the files do not depend on the last bits of a measurement.
        return float(f"{x:.4g}")

    def capture(points: dict[str, tuple[torch.nn.Module, str]]) -> dict[str, torch.Tensor]:
        got: dict[str, list[torch.Tensor]] = {k: [] for k in points}
        handles = []
        for name, (mod, where) in points.items():
            if where == "in":
                handles.append(mod.register_forward_pre_hook(
                    lambda m, a, name=name: got[name].append(a[0][0].double())))
            else:
                handles.append(mod.register_forward_hook(
                    lambda m, a, o, name=name: got[name].append(o[0].double())))
        with torch.no_grad():
            for ids in seqs:
                model(input_ids=ids, attention_mask=torch.ones_like(ids))
        for h in handles:
            h.remove()
        return {k: torch.cat(v) for k, v in got.items()}

    def calibrate_norm(norm: torch.nn.LayerNorm) -> dict:
        x = capture({"x": (norm, "in")})["x"]
        n = torch.nn.functional.layer_norm(x, (hidden,), eps=norm.eps)
        gain = r4(float(1.0 / n[:, others].pow(2).mean().sqrt()))
        w = norm.weight.detach().double().clone()
        w[others] *= gain
        y_rms = (n[:, others] * w[others]).pow(2).mean(dim=1).sqrt()
        w[c] = r4(OUTLIER_NORM_OUTPUT_RATIO / float((n[:, c].abs() / y_rms).mean()))
        with torch.no_grad():
            norm.weight.copy_(w.float())
        return {"gain": gain, "weight_c": float(w[c])}

    def calibrate_writer(layer) -> dict:
        wo = layer.mlp.Wo
        with torch.no_grad():
            wo.weight[c, units] = 0.0
        got = capture({"x": (layer.mlp_norm, "in"), "h": (wo, "in"), "o": (wo, "out")})
        x, h, o = got["x"], got["h"], got["o"]
        after = (x + o)[:, others].pow(2).mean(dim=1).sqrt()  # independent of the writers
        q = h[:, units].sum(dim=1)
        assert float(q.min()) >= 0
        base = (x[:, c] + o[:, c]) / after
        beta = r4(float((target - base.mean()) / (q / after).mean()))
        assert beta > 0, "a negative writer weight would destabilize the outlier"
        with torch.no_grad():
            wo.weight[c, units] = beta
        return {"writer_weight": beta}

    report = []
    for n, layer in enumerate(model.layers):
        entry = {"layer": n}
        if n >= 1:
            entry["attn_norm"] = calibrate_norm(layer.attn_norm)
        entry["mlp_norm"] = calibrate_norm(layer.mlp_norm)
        entry["mlp"] = calibrate_writer(layer)
        report.append(entry)
        print(f"  outlier calibration layer {n}: "
              + "; ".join(f"{k} " + ", ".join(f"{kk}={vv:.4g}" for kk, vv in v.items())
                          for k, v in entry.items() if k != "layer"))
    return report


def load_inputs(path: Path) -> list[tuple[str, str, str]]:
    """(id, prompt, text) of every committed input."""
    return [(x["id"], PROMPTS[x["prompt_name"]], x["text"])
            for x in json.loads(path.read_text(encoding="utf-8"))]


def load_st(out: Path):
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(str(out), device="cpu")
    st.eval()
    return st


def st_encode(st, inputs) -> np.ndarray:
    """Raw mean-pooled vectors (not normalized), one input at a time, with its prompt."""
    return np.stack([st.encode([text], prompt=prompt, batch_size=1, convert_to_numpy=True,
                               normalize_embeddings=False)[0]
                     for _, prompt, text in inputs]).astype(np.float64)


def without(v: np.ndarray, c: int) -> np.ndarray:
    return np.delete(v, c, axis=-1)


def pooled_share(v: np.ndarray, c: int) -> np.ndarray:
    return np.abs(v[..., c]) / np.linalg.norm(v, axis=-1)


def calibrate_final_norm(out: Path, inputs, c: int) -> float:
    """final_norm.weight[c] such that the median share |v_c| / ||v|| is OUTLIER_POOLED_SHARE.

    final_norm has no bias, so channel c of its output is weight[c] x (normalized x_c) and
    no other channel depends on weight[c]; mean pooling is linear. With the model saved with
    weight[c] = 1: v_c(w) = w a and ||v_others|| = o do not depend on w, so
    share(w) = w|a| / sqrt(w^2 a^2 + o^2), increasing in w for every input, and the median
    over inputs is solved by bisection on w without running the model again.
    """
    v = st_encode(load_st(out), inputs)
    a, o = np.abs(v[:, c]), np.linalg.norm(without(v, c), axis=1)

    def median_share(w: float) -> float:
        return float(np.median(w * a / np.sqrt((w * a) ** 2 + o ** 2)))

    lo, hi = 1e-6, 1e3
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if median_share(mid) < OUTLIER_POOLED_SHARE else (lo, mid)
    w = float(f"{math.sqrt(lo * hi):.4g}")
    print(f"  outlier: final_norm.weight[{c}] = {w} (median share with weight 1: "
          f"{median_share(1.0):.3f})")
    return w


def ratio_hooks(model: torch.nn.Module, c: int, acc: dict[str, list[np.ndarray]]) -> list:
    """Per-token |x_c| / rms(x_others) at the residual stream and LayerNorm outputs."""
    def record(name):
        def f(x):
            x = x.detach()[0].double()
            others = torch.cat([x[:, :c], x[:, c + 1:]], dim=1)
            acc.setdefault(name, []).append(
                (x[:, c].abs() / others.pow(2).mean(dim=1).sqrt()).numpy())
        return f

    handles = []
    pre = lambda name: (lambda m, args: record(name)(args[0]))  # noqa: E731
    post = lambda name: (lambda m, args, out: record(name)(out))  # noqa: E731
    # Residual stream: the input of every layer's attention (layer 0: no attn_norm, the
    # Wqkv input itself), of every mlp_norm and of final_norm.
    # Layer 0's input is the embeddings' output.
    # Layer 0's input: the embeddings' output (layer 0 has no attn_norm; its Wqkv reads it).
    handles.append(model.embeddings.register_forward_hook(post("residual/layers.0.input")))
    for n, layer in enumerate(model.layers):
        if n >= 1:
            handles.append(layer.attn_norm.register_forward_pre_hook(
                pre(f"residual/layers.{n}.attn_norm")))
            handles.append(layer.attn_norm.register_forward_hook(
                post(f"norm_output/layers.{n}.attn_norm")))
        handles.append(layer.mlp_norm.register_forward_pre_hook(
            pre(f"residual/layers.{n}.mlp_norm")))
        handles.append(layer.mlp_norm.register_forward_hook(
            post(f"norm_output/layers.{n}.mlp_norm")))
    handles.append(model.final_norm.register_forward_pre_hook(pre("residual/final_norm")))
    return handles


def check_outlier(out: Path, inputs, c: int) -> dict:
    """Measure and assert the outlier statistics on the committed inputs (batch of one)."""
    from transformers import ModernBertModel

    st = load_st(out)
    bert = next(m for m in st.modules() if isinstance(m, ModernBertModel))
    acc: dict[str, list[np.ndarray]] = {}
    handles = ratio_hooks(bert, c, acc)
    v = st_encode(st, inputs)
    for h in handles:
        h.remove()

    stats = {}
    print(f"  outlier channel {c}: mean over tokens of |x_c| / rms(x_others) "
          f"(all tokens of all {len(inputs)} inputs; per-input means min..max)")
    for name, per_input in acc.items():
        pooled = float(np.concatenate(per_input).mean())
        means = [float(r.mean()) for r in per_input]
        stats[name] = {"mean": pooled, "min_input": min(means), "max_input": max(means)}
        print(f"    {name:32s} {pooled:6.1f}  ({min(means):.1f}..{max(means):.1f})")
        lo, hi = RESIDUAL_RATIO_RANGE if name.startswith("residual/") else \
            NORM_OUTPUT_RATIO_RANGE
        assert lo <= pooled <= hi, (name, pooled)

    share = pooled_share(v, c)
    med = float(np.median(share))
    print(f"  outlier: pooled share |v_c|/||v||: median {med:.4f}, min {share.min():.4f}, "
          f"max {share.max():.4f}")
    order = np.argsort(share)
    print("    lowest: " + ", ".join(f"{inputs[i][0]} {share[i]:.3f}" for i in order[:4])
          + "; highest: " + ", ".join(f"{inputs[i][0]} {share[i]:.3f}" for i in order[-3:]))
    for (name, _, _), s_ in zip(inputs, share):
        assert POOLED_SHARE_EACH[0] <= s_ <= POOLED_SHARE_EACH[1], (name, s_)
    assert POOLED_SHARE_MEDIAN[0] <= med <= POOLED_SHARE_MEDIAN[1], med

    # The texts must still differ once the outlier (which inflates every cosine) is removed.
    def pairwise(x):
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        cos = x @ x.T
        return cos[np.triu_indices(len(x), 1)]
    full, rest = pairwise(v), pairwise(without(v, c))
    print(f"  pairwise cosine of the {len(inputs)} inputs: full min {full.min():.4f} median "
          f"{np.median(full):.4f} max {full.max():.4f}; without channel {c}: min "
          f"{rest.min():.4f} median {np.median(rest):.4f} max {rest.max():.4f}")
    assert rest.min() < 0.9, "texts no longer differ once the outlier is removed"
    return {"ratios": stats, "pooled_share": {"median": med, "min": float(share.min()),
                                              "max": float(share.max())}}


class SentenceEmbedder(torch.nn.Module):
    """ModernBERT + masked mean pooling, as sentence-transformers' Pooling(mean)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        tok = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(tok.dtype)
        summed = (tok * mask).sum(dim=1)
        count = torch.clamp(mask.sum(dim=1), min=1e-9)
        return tok, summed / count


def load_hf(out: Path, attn: str = "eager", **overrides):
    from transformers import AutoModel
    model = AutoModel.from_pretrained(str(out), attn_implementation=attn, **overrides)
    return model.eval()


def dummy_batch(vocab: int, lengths: list[int], seed: int):
    g = np.random.default_rng(seed)
    s = max(lengths)
    ids = np.full((len(lengths), s), 3, dtype=np.int64)
    mask = np.zeros((len(lengths), s), dtype=np.int64)
    for b, n in enumerate(lengths):
        ids[b, :n] = g.integers(7, vocab, n)
        ids[b, 0], ids[b, n - 1] = 1, 2
        mask[b, :n] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


def export_onnx(out: Path, vocab: int) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    (out / "onnx").mkdir(exist_ok=True)
    wrapper = SentenceEmbedder(load_hf(out, attn="eager")).eval()
    # Longer than the 128-token window and padded, so no "short input" or "no padding"
    # shortcut can be traced into the graph.
    ids, mask = dummy_batch(vocab, [333, 150], seed=1)
    fp32 = out / "onnx" / "model.onnx"
    with torch.no_grad():
        torch.onnx.export(
            wrapper, (ids, mask), str(fp32), dynamo=False, opset_version=17,
            input_names=["input_ids", "attention_mask"],
            output_names=["token_embeddings", "sentence_embedding"],
            dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                          "attention_mask": {0: "batch", 1: "sequence"},
                          "token_embeddings": {0: "batch", 1: "sequence"},
                          "sentence_embedding": {0: "batch"}},
            do_constant_folding=True)
    onnx.checker.check_model(str(fp32))
    quantize_dynamic(str(fp32), str(out / "onnx" / "model_quantized.onnx"),
                     weight_type=QuantType.QInt8)


def check_onnx_lengths(out: Path, vocab: int) -> dict:
    """ORT fp32 vs torch at many lengths (around the window edges) and a padded batch."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(out / "onnx" / "model.onnx"), so,
                                providers=["CPUExecutionProvider"])
    model = SentenceEmbedder(load_hf(out, attn="sdpa")).eval()
    worst = 0.0
    cases = [[1], [2], [7], [64], [65], [66], [129], [130], [200], [333], [700],
             [700, 1, 65, 129, 300]]
    for k, lengths in enumerate(cases):
        ids, mask = dummy_batch(vocab, lengths, seed=100 + k)
        with torch.no_grad():
            tok, sent = model(ids, mask)
        o_tok, o_sent = sess.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        m = mask.numpy()[..., None].astype(bool)
        d_tok = float(np.max(np.abs(np.where(m, o_tok - tok.numpy(), 0))))
        d_sent = float(np.max(np.abs(o_sent - sent.numpy())))
        scale = float(np.max(np.abs(sent.numpy())))
        worst = max(worst, d_sent / scale)
        print(f"  onnx vs torch lengths={lengths}: max|Δ| token {d_tok:.2e}, "
              f"sentence {d_sent:.2e} (max|v| {scale:.2f})")
        assert d_sent <= 1e-4 * max(1.0, scale), "ONNX export differs from torch"
    return {"max_rel_sentence_delta": worst}


class NormalizedEmbedder(torch.nn.Module):
    """ModernBERT + masked mean pooling + L2 normalization, one output (Teradata-style)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.inner = SentenceEmbedder(model)

    def forward(self, input_ids, attention_mask):
        return torch.nn.functional.normalize(self.inner(input_ids, attention_mask)[1], p=2,
                                             dim=1)


def export_variants(out: Path, variants: Path, vocab: int) -> dict:
    """Two more ONNX files of the same weights, for the Rust ONNX-discovery tests (which
    copy them into temporary folders under the file names real ports use).

    tiny_normalized_opset14.onnx: like the Teradata exports: legacy TorchScript exporter,
      opset 14, one output "sentence_embedding" = the L2-normalized mean-pooled vector.
    tiny_normalized_with_tokens.onnx: onnx/model.onnx with an LpNormalization on its
      sentence_embedding output (token_embeddings unchanged), as ports that bake the
      normalization into the pooled output only.
    tiny_fp16.onnx: onnx/model.onnx converted to float16 with onnxruntime's
      convert_float_to_float16(keep_io_types=False): float16 outputs, int64 inputs.
    """
    import onnx
    import onnxruntime as ort
    from onnxruntime.transformers.float16 import convert_float_to_float16

    variants.mkdir(parents=True, exist_ok=True)
    result = {}

    norm_path = variants / "tiny_normalized_opset14.onnx"
    wrapper = NormalizedEmbedder(load_hf(out, attn="eager")).eval()
    ids, mask = dummy_batch(vocab, [333, 150], seed=1)
    with torch.no_grad():
        torch.onnx.export(
            wrapper, (ids, mask), str(norm_path), dynamo=False, opset_version=14,
            input_names=["input_ids", "attention_mask"],
            output_names=["sentence_embedding"],
            dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                          "attention_mask": {0: "batch", 1: "sequence"},
                          "sentence_embedding": {0: "batch"}},
            do_constant_folding=True)
    onnx.checker.check_model(str(norm_path))
    m = onnx.load(str(norm_path))
    assert m.opset_import[0].version == 14, m.opset_import
    assert [o.name for o in m.graph.output] == ["sentence_embedding"]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(norm_path), so, providers=["CPUExecutionProvider"])
    model = NormalizedEmbedder(load_hf(out, attn="sdpa")).eval()
    worst = 0.0
    for k, lengths in enumerate([[1], [65], [129], [333], [700, 1, 65, 129, 300]]):
        ids, mask = dummy_batch(vocab, lengths, seed=200 + k)
        with torch.no_grad():
            ref = model(ids, mask).numpy()
        (got,) = sess.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        worst = max(worst, float(np.max(np.abs(got - ref))))
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    print(f"  {norm_path.name}: opset 14, output sentence_embedding (normalized); "
          f"max|Δ| vs torch {worst:.2e}")
    assert worst <= 1e-5, worst
    result["normalized_opset14_vs_torch_max_abs_diff"] = worst

    # Both outputs, with the normalization baked into sentence_embedding only (some ports):
    # the exported graph with an LpNormalization appended to its pooled output.
    both_path = variants / "tiny_normalized_with_tokens.onnx"
    g = onnx.load(str(out / "onnx" / "model.onnx"))
    pooled = next(o for o in g.graph.output if o.name == "sentence_embedding")
    for node in g.graph.node:
        node.output[:] = ["sentence_embedding_raw" if x == "sentence_embedding" else x
                          for x in node.output]
    g.graph.node.append(onnx.helper.make_node(
        "LpNormalization", ["sentence_embedding_raw"], ["sentence_embedding"], axis=-1, p=2))
    del pooled  # the graph output keeps its name, type and shape
    onnx.save(g, str(both_path))
    onnx.checker.check_model(str(both_path))
    sess = ort.InferenceSession(str(both_path), so, providers=["CPUExecutionProvider"])
    assert [o.name for o in sess.get_outputs()] == ["token_embeddings", "sentence_embedding"]
    ids, mask = dummy_batch(vocab, [700, 1, 65], seed=210)
    tok, sent = sess.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    assert np.allclose(np.linalg.norm(sent, axis=1), 1.0, atol=1e-5)
    with torch.no_grad():
        ref = model(ids, mask).numpy()
    worst = float(np.max(np.abs(sent - ref)))
    print(f"  {both_path.name}: token_embeddings + normalized sentence_embedding; "
          f"max|Δ| vs torch {worst:.2e}")
    assert worst <= 1e-5, worst
    result["normalized_with_tokens_vs_torch_max_abs_diff"] = worst

    fp16_path = variants / "tiny_fp16.onnx"
    m16 = convert_float_to_float16(onnx.load(str(out / "onnx" / "model.onnx")),
                                   keep_io_types=False)
    onnx.save(m16, str(fp16_path))
    onnx.checker.check_model(str(fp16_path))
    types = {v.name: onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type)
             for v in list(m16.graph.input) + list(m16.graph.output)}
    print(f"  {fp16_path.name}: io types {types}")
    assert types == {"input_ids": "INT64", "attention_mask": "INT64",
                     "token_embeddings": "FLOAT16", "sentence_embedding": "FLOAT16"}, types
    return result


def verify_loaded(out: Path, vocab: int, shape: dict, channel: int) -> float:
    """What transformers 5 makes of the legacy config, and that the window matters."""
    from transformers.masking_utils import create_bidirectional_sliding_window_mask

    model = load_hf(out, attn="sdpa")
    c = model.config
    n = shape["num_hidden_layers"]
    print(f"  loaded: layer_types={c.layer_types}")
    print(f"  loaded: rope_parameters={c.rope_parameters} local_attention={c.local_attention} "
          f"sliding_window={c.sliding_window} pad_token_id={c.pad_token_id} "
          f"norm_eps={c.norm_eps} hidden_activation={c.hidden_activation}")
    assert c.layer_types == ["full_attention" if i % 3 == 0 else "sliding_attention"
                             for i in range(n)]
    assert c.local_attention == 128 and c.sliding_window == 64
    assert c.rope_parameters["full_attention"]["rope_theta"] == 160000.0
    assert c.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
    assert c.pad_token_id == 3 and c.norm_eps == 1e-5
    assert c.vocab_size == vocab and c.hidden_size == shape["hidden_size"]
    assert isinstance(model.layers[0].attn_norm, torch.nn.Identity)
    for i, layer in enumerate(model.layers):
        expect = None if i % 3 == 0 else 65  # transformers stores half-window + 1
        assert layer.attn.sliding_window == expect, (i, layer.attn.sliding_window)

    # The mask transformers builds for local layers: |i - j| <= 64, and padding excluded.
    s = 300
    emb = torch.zeros(1, s, shape["hidden_size"])
    am = torch.ones(1, s, dtype=torch.long)
    am[0, 290:] = 0
    m = create_bidirectional_sliding_window_mask(config=c, inputs_embeds=emb, attention_mask=am)
    allowed = (m[0, 0] == 0) if m.dtype != torch.bool else m[0, 0]
    i = torch.arange(s)
    expect = ((i[:, None] - i[None, :]).abs() <= 64) & (i[None, :] < 290)
    assert torch.equal(allowed, expect), "sliding window mask is not |i-j| <= 64"
    print("  sliding-window mask checked: key j visible from i iff |i-j| <= 64 (and not pad)")

    # Dropping the window must visibly change a long input, or the weights hide bugs.
    wide = load_hf(out, attn="sdpa", local_attention=1 << 20)
    ids, mask = dummy_batch(vocab, [300], seed=7)
    with torch.no_grad():
        a = SentenceEmbedder(model)(ids, mask)[1][0]
        b = SentenceEmbedder(wide)(ids, mask)[1][0]
    full = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    # The outlier channel is the same in both and inflates the cosine: judge without it.
    keep = torch.arange(a.shape[0]) != channel
    cos = float(torch.nn.functional.cosine_similarity(a[keep], b[keep], dim=0))
    print(f"  window matters: cosine(window 128, no window) on 300 tokens = {full:.6f} "
          f"(full), {cos:.6f} (without channel {channel})")
    assert cos < 0.9999, "weights too small: the sliding window does not show"
    return cos


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=20241130)
    ap.add_argument("--inputs", type=Path, default=Path("testdata/inputs.json"),
                    help="the committed inputs (final_norm calibration and outlier checks)")
    ap.add_argument("--variants-dir", type=Path,
                    help="also write tiny_fp16.onnx and tiny_normalized_opset14.onnx here")
    args = ap.parse_args()

    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    # One thread: the calibration's reductions then run in a fixed order (reproducible).
    torch.set_num_threads(1)
    shape = SHAPES[args.shape]
    out = args.out_dir
    vocab = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    vocab_size = len(vocab)

    cfg = legacy_config(shape, vocab_size)
    write_json(out / "config.json", cfg)
    write_st_files(out, shape)

    # Build the module from the legacy dict (as from_pretrained would) only to get the
    # exact parameter names and shapes; the file is written by hand above.
    model = ModernBertModel(ModernBertConfig(**cfg)).eval()
    state = random_state_dict(model, args.seed)
    c = plant_outlier(state, args.shape)
    model.load_state_dict(state, strict=True)
    calibrate_layers(model, c, vocab_size)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    inputs = load_inputs(args.inputs)
    # No "model." prefix: a sentence-transformers ModernBertModel checkpoint. Saved twice:
    # with final_norm.weight[c] = 1 for the calibration, then with the solved weight.
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    state["final_norm.weight"][c] = calibrate_final_norm(out, inputs, c)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    print(f"model: {sum(t.numel() for t in state.values())} parameters, "
          f"{len(state)} tensors -> {out / 'model.safetensors'}")

    check_outlier(out, inputs, c)
    verify_loaded(out, vocab_size, shape, c)
    export_onnx(out, vocab_size)
    check_onnx_lengths(out, vocab_size)
    print(f"onnx: {out / 'onnx' / 'model.onnx'}, {out / 'onnx' / 'model_quantized.onnx'}")
    if args.variants_dir:
        export_variants(out, args.variants_dir, vocab_size)


if __name__ == "__main__":
    main()
