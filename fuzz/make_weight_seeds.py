#!/usr/bin/env python3
"""Writes fuzz/seeds_weights/: valid `model.safetensors` files for the 8-wide one-layer
configuration of the `fused_weights` fuzz target (fuzz/fuzz_targets/fused_weights.rs), so the
fuzzer starts from a header that parses and mutates its offsets, shapes and dtypes. The
layout is written by hand from the safetensors format (8-byte little-endian header length,
JSON header, data), with no library, so the seeds do not depend on the reader under test.
Run from anywhere; rewrites the folder.
"""

import json
import shutil
import struct
from pathlib import Path

OUT = Path(__file__).resolve().parent / "seeds_weights"
H, I, V = 8, 16, 10
TENSORS = [
    ("embeddings.tok_embeddings.weight", [V, H]),
    ("embeddings.norm.weight", [H]),
    ("final_norm.weight", [H]),
    ("layers.0.attn.Wqkv.weight", [3 * H, H]),
    ("layers.0.attn.Wo.weight", [H, H]),
    ("layers.0.mlp_norm.weight", [H]),
    ("layers.0.mlp.Wi.weight", [2 * I, H]),
    ("layers.0.mlp.Wo.weight", [H, I]),
]


def checkpoint(prefix: str, dtype: str) -> bytes:
    width = 4 if dtype == "F32" else 2
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, shape in TENSORS:
        count = 1
        for d in shape:
            count *= d
        start = len(data)
        data += bytes((k * 7 + 1) % 251 for k in range(count * width))
        header[prefix + name] = {"dtype": dtype, "shape": shape, "data_offsets": [start, len(data)]}
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + data


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    for prefix, dtype in [("", "F32"), ("model.", "BF16"), ("", "F16")]:
        name = f"{prefix or 'plain.'}{dtype.lower()}.safetensors"
        (OUT / name).write_bytes(checkpoint(prefix, dtype))


if __name__ == "__main__":
    main()
