#!/usr/bin/env python3
"""Write a seeded random-weight ModernBERT in the folder layout of the published Ruri v3
models (legacy transformers-4 / sentence-transformers-3 file formats), export it to ONNX
(fp32 + dynamic int8, layout of sirasagi62/ruri-v3-30m-ONNX) and verify what
transformers 5 loads from it.

The tokenizer files (tokenizer.json, tokenizer_config.json, special_tokens_map.json) must
already be in --out-dir (train_tokenizer.py writes them).
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


def verify_loaded(out: Path, vocab: int, shape: dict) -> float:
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
    cos = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    print(f"  window matters: cosine(window 128, no window) on 300 tokens = {cos:.6f}")
    assert cos < 0.9999, "weights too small: the sliding window does not show"
    return cos


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=20241130)
    args = ap.parse_args()

    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
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
    model.load_state_dict(state, strict=True)
    # No "model." prefix: a sentence-transformers ModernBertModel checkpoint.
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    print(f"model: {sum(t.numel() for t in state.values())} parameters, "
          f"{len(state)} tensors -> {out / 'model.safetensors'}")

    verify_loaded(out, vocab_size, shape)
    export_onnx(out, vocab_size)
    check_onnx_lengths(out, vocab_size)
    print(f"onnx: {out / 'onnx' / 'model.onnx'}, {out / 'onnx' / 'model_quantized.onnx'}")


if __name__ == "__main__":
    main()
