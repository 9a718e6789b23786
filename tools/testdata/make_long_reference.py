#!/usr/bin/env python3
"""A long text for testdata/tiny: past the 512 tokens of testdata/inputs.json and past the
1,024 rotary angles the engines cache (ruri-native computes those beyond per call, on its
workers from 512 new positions on). Writes its token ids and its sentence-transformers fp32
vector (torch, CPU) with `max_seq_length` raised to 2,048 (the model's positions go to
8,192), in the item format of testdata/reference/tiny.json (st_fp32 only);
int8_reference.py then writes ruri-native's int8 references from its token ids:

    .venv-testdata/bin/python tools/testdata/make_long_reference.py \\
        --out testdata/reference/tiny_long.json
    .venv-testdata/bin/python tools/testdata/int8_reference.py --model testdata/tiny \\
        --tokens testdata/reference/tiny_long.json \\
        --out testdata/reference/tiny_long_native_int8.json
    .venv-testdata/bin/python tools/testdata/int8_reference.py --attention bf16 \\
        --model testdata/tiny --tokens testdata/reference/tiny_long.json \\
        --out testdata/reference/tiny_long_native_int8_bf16.json
    .venv-testdata/bin/python tools/testdata/int8_reference.py --attention int13 \\
        --model testdata/tiny --tokens testdata/reference/tiny_long.json \\
        --out testdata/reference/tiny_long_native_int8_int13.json

The text is this project's own prose (below), numbered paragraphs repeated until the
tokens reach --tokens; no corpus text.
"""

from __future__ import annotations

import argparse
import json
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

PARAGRAPH = (
    "川沿いの小さな町では、朝になると市場に野菜や魚が並び、店の人が大きな声で客を呼ぶ。"
    "午後には図書館で子どもたちが本を読み、古い地図を広げて昔の道をたどる人もいる。"
    "夕方、駅前の広場に明かりがともると、仕事を終えた人々が集まって今日の出来事を語り合う。"
)
MAX_SEQ_LENGTH = 2048


def f32_list(v) -> list[float]:
    return [float(np.float32(x)) for x in v]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, default=Path("testdata/tiny"))
    ap.add_argument("--tokens", type=int, default=1600, help="at least this many tokens")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = SentenceTransformer(str(args.model_dir), device="cpu")
    model.eval()
    model.max_seq_length = MAX_SEQ_LENGTH
    text, n = "", 0
    while True:
        n += 1
        text += f"第{n}段。" + PARAGRAPH
        ids = model.preprocess([text])["input_ids"][0].tolist()
        if len(ids) >= args.tokens:
            break
    assert len(ids) < MAX_SEQ_LENGTH, len(ids)
    fed: list[torch.Tensor] = []
    model[0].register_forward_pre_hook(
        lambda _module, a, kw: fed.append((a[0] if a else kw["features"])["input_ids"].clone()),
        with_kwargs=True)
    kwargs = dict(batch_size=1, convert_to_numpy=True)
    mean = model.encode([text], normalize_embeddings=False, **kwargs)[0]
    normalized = model.encode([text], normalize_embeddings=True, **kwargs)[0]
    assert fed[0][0].tolist() == ids, "sentence-transformers fed other ids"
    out = {
        "generator": {
            "command": "tools/testdata/make_long_reference.py --out " + str(args.out),
            "versions": {p: version(p) for p in ("sentence-transformers", "torch", "transformers", "numpy")},
        },
        "model_dir": str(args.model_dir),
        "max_seq_length": MAX_SEQ_LENGTH,
        "items": [{
            "id": f"long_{len(ids)}",
            "prompt_name": "",
            "prompt": "",
            "text": text,
            "token_ids": ids,
            "st_fp32": {"mean": f32_list(mean), "normalized": f32_list(normalized)},
        }],
    }
    args.out.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(ids)} tokens, {n} paragraphs")


if __name__ == "__main__":
    main()
