#!/usr/bin/env python3
"""Reference outputs of sentence-transformers' `quantize_embeddings` for ruri-core's
`Embeddings::quantize` (ruri-core/tests/quantize.rs checks them byte for byte).

Inputs: the sentence-transformers fp32 vectors of testdata/reference/tiny.json (30 × 64),
and as a separate calibration set its ONNX Runtime int8 vectors (the same texts, other
values). Each precision runs at the full width (64) and cut to 61 dimensions (so that the
binary packings have a partial last byte); int8 and uint8 with ranges from the embeddings
themselves and from the calibration set.

    .venv-testdata/bin/python tools/testdata/quantize_reference.py \\
        --out testdata/reference/quantize_tiny.json
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
from sentence_transformers.util.quantization import quantize_embeddings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", default="testdata/reference/tiny.json")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    items = json.loads(Path(args.reference).read_text())["items"]
    full = np.array([i["st_fp32"]["normalized"] for i in items], dtype=np.float32)
    calibration_full = np.array([i["ort_int8"]["normalized"] for i in items], dtype=np.float32)
    cases = []
    for dim in (full.shape[1], 61):
        e = np.ascontiguousarray(full[:, :dim])
        c = np.ascontiguousarray(calibration_full[:, :dim])
        for precision in ("int8", "uint8", "binary", "ubinary"):
            for calibrated in ((False, True) if precision.endswith("int8") else (False,)):
                out = quantize_embeddings(e, precision=precision,
                                          calibration_embeddings=c if calibrated else None)
                cases.append(dict(dim=dim, precision=precision, calibrated=calibrated,
                                  shape=list(out.shape), dtype=str(out.dtype),
                                  output=[[int(v) for v in row] for row in out]))
    doc = dict(
        generator=dict(command="tools/testdata/quantize_reference.py " + " ".join(sys.argv[1:]),
                       versions=dict(sentence_transformers=version("sentence-transformers"),
                                     numpy=version("numpy"), python=sys.version.split()[0])),
        embeddings=[[float(v) for v in row] for row in full],
        calibration=[[float(v) for v in row] for row in calibration_full],
        cases=cases,
    )
    Path(args.out).write_text(json.dumps(doc) + "\n")


if __name__ == "__main__":
    main()
