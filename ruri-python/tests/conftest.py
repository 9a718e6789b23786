"""Shared fixtures: the committed tiny model, its sentence-transformers references, and one
embedder per backend × precision (loaded once per session: the ONNX Runtime library is loaded
once per process anyway)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ruri

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "testdata" / "tiny"
REFERENCE = ROOT / "testdata" / "reference"


def load_reference(name: str) -> dict:
    with (REFERENCE / name).open(encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="session")
def tiny_reference() -> dict:
    """testdata/reference/tiny.json: sentence-transformers 6.2 (fp32, torch CPU) on the 30
    committed inputs (tools/testdata/generate.sh tiny)."""
    return load_reference("tiny.json")


@pytest.fixture(scope="session")
def ort_fp32() -> ruri.Embedder:
    return ruri.Embedder(TINY, backend="ort", precision="fp32")


@pytest.fixture(scope="session")
def ort_int8() -> ruri.Embedder:
    return ruri.Embedder(TINY, backend="ort")


@pytest.fixture(scope="session")
def candle_fp32() -> ruri.Embedder:
    if "candle" not in ruri.BACKENDS:
        pytest.skip("this build of ruri has no candle backend")
    return ruri.Embedder(TINY, backend="candle")


@pytest.fixture(scope="session")
def native_fp32() -> ruri.Embedder:
    return ruri.Embedder(TINY, backend="native", precision="fp32")


@pytest.fixture(scope="session")
def native_int8() -> ruri.Embedder:
    return ruri.Embedder(TINY, backend="native")


@pytest.fixture(params=["ort_fp32", "candle_fp32", "native_fp32"])
def fp32(request) -> ruri.Embedder:
    """Every fp32 embedder: each must equal sentence-transformers within 1e-5."""
    return request.getfixturevalue(request.param)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
