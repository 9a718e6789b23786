#!/usr/bin/env python3
"""Writes fuzz/seeds/: starting inputs for both fuzz targets, from the committed test texts
(testdata/inputs.json and testdata/hostile_inputs.json), in the input format of
fuzz/src/lib.rs: one options byte (task in bits 0-1, Truncation::Error in bit 2, a small
maximum length in bits 4-7), then texts separated by 0xFF. Long texts are cut to 600 bytes
so the seeds stay small; runs of combining marks and ideographic spaces still pass 512
tokens. Run from anywhere; rewrites the folder.
"""

import hashlib
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fuzz" / "seeds"
TASKS = {"": 0, "query": 1, "document": 2, "topic": 3}


def items():
    for name in ["inputs.json", "hostile_inputs.json"]:
        yield from json.loads((ROOT / "testdata" / name).read_text(encoding="utf-8"))


def seed(options: int, texts: list[str]) -> bytes:
    return bytes([options]) + b"\xff".join(t.encode("utf-8")[:600] for t in texts)


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    all_items = list(items())
    seeds = []
    for k, item in enumerate(all_items):
        # Alternate the policy and the small maximum length.
        options = TASKS[item["prompt_name"]] | (4 if k % 2 else 0) | ((k % 16) << 4)
        seeds.append(seed(options, [item["text"]]))
    # A few batches mixing lengths and hostile texts, and an empty batch.
    for k in range(0, len(all_items) - 3, 7):
        seeds.append(seed(k % 4, [i["text"] for i in all_items[k:k + 4]]))
    seeds.append(bytes([2]))
    for data in seeds:
        (OUT / hashlib.sha1(data).hexdigest()).write_bytes(data)
    print(f"{len(seeds)} seeds, {sum(map(len, seeds))} bytes -> {OUT}")


if __name__ == "__main__":
    main()
