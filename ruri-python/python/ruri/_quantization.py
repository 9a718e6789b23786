"""sentence-transformers' ``quantize_embeddings``, computed by ruri (``ruri::Embeddings::quantize``)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ._errors import InputError
from ._ruri import quantize as _quantize

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")


def quantize_embeddings(embeddings: Any, precision: str, ranges: Optional[Any] = None,
                        calibration_embeddings: Optional[Any] = None) -> np.ndarray:
    """Quantizes float embeddings exactly as
    ``sentence_transformers.quantization.quantize_embeddings`` does (tested byte for byte
    against it): ``"int8"`` / ``"uint8"`` cut each dimension's range (``ranges``, shape
    ``(2, dim)``; else the per-dimension min and max of ``calibration_embeddings``; else of
    ``embeddings`` themselves, which needs at least two) into 255 steps; ``"binary"`` /
    ``"ubinary"`` pack ``x > 0`` eight dimensions to a byte. ``"float32"`` returns a float32
    copy. A 1-D input gives a 1-D result."""
    array = np.asarray(embeddings)
    if array.dtype in (np.int8, np.uint8):
        raise InputError("Embeddings to quantize must be float rather than int8 or uint8.")
    if precision not in PRECISIONS:
        raise InputError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "float32":
        return array.astype(np.float32)
    if array.ndim not in (1, 2):
        raise InputError(f"embeddings of shape {array.shape}: expected 1-D or 2-D")
    single = array.ndim == 1
    rows = np.ascontiguousarray(np.atleast_2d(array), dtype=np.float32)
    if rows.shape[0] == 0:
        width = rows.shape[1] if precision.endswith("int8") else (rows.shape[1] + 7) // 8
        signed = precision in ("int8", "binary")
        return np.zeros((0, width), dtype=np.int8 if signed else np.uint8)

    def matrix(value: Optional[Any]) -> Optional[np.ndarray]:
        return None if value is None else np.ascontiguousarray(np.atleast_2d(value), dtype=np.float32)

    out = _quantize(rows, precision, matrix(ranges), matrix(calibration_embeddings))
    return out[0] if single else out
