"""ruri.quantize_embeddings and encode(precision=...) against sentence-transformers'
quantize_embeddings: testdata/reference/quantize_tiny.json, written by
tools/testdata/quantize_reference.py with sentence-transformers (not installed here)."""

import json
from pathlib import Path

import numpy as np
import pytest

import ruri

REFERENCE = Path(__file__).resolve().parents[2] / "testdata/reference/quantize_tiny.json"


def _doc():
    return json.loads(REFERENCE.read_text())


def test_every_case_equals_sentence_transformers():
    doc = _doc()
    embeddings = np.array(doc["embeddings"], dtype=np.float32)
    calibration = np.array(doc["calibration"], dtype=np.float32)
    assert len(doc["cases"]) == 12
    for case in doc["cases"]:
        dim = case["dim"]
        e = np.ascontiguousarray(embeddings[:, :dim])
        c = np.ascontiguousarray(calibration[:, :dim]) if case["calibrated"] else None
        got = ruri.quantize_embeddings(e, case["precision"], calibration_embeddings=c)
        want = np.array(case["output"], dtype=case["dtype"])
        assert got.dtype == want.dtype and got.shape == want.shape, case["precision"]
        np.testing.assert_array_equal(got, want, err_msg=f"{case['precision']} {dim}")
        if case["calibrated"]:
            # The same ranges passed explicitly (shape (2, dim)).
            ranges = np.stack([c.min(axis=0), c.max(axis=0)])
            again = ruri.quantize_embeddings(e, case["precision"], ranges=ranges)
            np.testing.assert_array_equal(again, want)


def test_one_vector_and_empty_inputs():
    e = np.array([0.5, -0.1, 0.0, 2.0, -3.0, 0.1, 0.2, 0.3, 0.4], dtype=np.float32)
    bits = ruri.quantize_embeddings(e, "ubinary")
    assert bits.shape == (2,) and bits.dtype == np.uint8
    assert list(bits) == [0b1001_0111, 0b1000_0000]
    assert list(ruri.quantize_embeddings(e, "binary")) == [0b1001_0111 - 128, 0]
    with pytest.raises(ruri.InputError):  # ranges from one vector (as sentence-transformers)
        ruri.quantize_embeddings(e, "int8")
    empty = ruri.quantize_embeddings(np.zeros((0, 9), dtype=np.float32), "binary")
    assert empty.shape == (0, 2) and empty.dtype == np.int8
    with pytest.raises(ruri.InputError, match="not one of"):
        ruri.quantize_embeddings(e[None, :], "int4")
    with pytest.raises(ruri.InputError, match="ranges"):
        ruri.quantize_embeddings(np.ones((3, 9), np.float32), "int8", ranges=np.ones((2, 4)))
    with pytest.raises(ruri.InputError, match="float rather than"):
        ruri.quantize_embeddings(np.ones((3, 9), np.int8), "int8")


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_encode_with_a_precision_quantizes_the_float_vectors(native_fp32, precision):
    texts = ["瑠璃は青い宝石です。", "今日は晴れ", "東京は日本の首都", "ラピスラズリ"]
    floats = native_fp32.encode(texts, normalize_embeddings=True)
    got = native_fp32.encode(texts, normalize_embeddings=True, precision=precision)
    np.testing.assert_array_equal(got, ruri.quantize_embeddings(floats, precision))
    assert got.dtype == (np.int8 if precision in ("int8", "binary") else np.uint8)
    with pytest.raises(ruri.InputError, match="not one of"):
        native_fp32.encode(texts, precision="float16")
