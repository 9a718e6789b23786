"""sentence-transformers' call shapes, defaults and return types (checked against
SentenceTransformer.encode of sentence-transformers 6.2 on the same model: a str gives (dim,)
float32, a list (n, dim) float32, an empty list np.array([]) of shape (0,), float64)."""

from __future__ import annotations

import inspect
import json
import logging

import numpy as np
import pytest

import ruri
from conftest import TINY

TEXTS = ["瑠璃色はどんな色？", "瑠璃は青い宝石です。", "今日は晴れです。"]


def test_str_gives_1d_float32(ort_int8):
    v = ort_int8.encode(TEXTS[0])
    assert isinstance(v, np.ndarray) and v.shape == (64,) and v.dtype == np.float32


@pytest.mark.parametrize("make", [list, tuple, np.array, lambda t: (x for x in t)],
                         ids=["list", "tuple", "ndarray", "generator"])
def test_sequences_give_2d_float32(ort_int8, make):
    v = ort_int8.encode(make(TEXTS))
    assert isinstance(v, np.ndarray) and v.shape == (3, 64) and v.dtype == np.float32
    assert v.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(v, ort_int8.encode(TEXTS))


def test_empty_list_gives_what_sentence_transformers_gives(ort_int8):
    empty = ort_int8.encode([])
    assert isinstance(empty, np.ndarray) and empty.shape == (0,) and empty.dtype == np.float64
    assert ort_int8.encode([], convert_to_numpy=False) == []
    assert ort_int8.encode_query([]).shape == (0,)


def test_convert_to_numpy_false_gives_a_list_of_rows(ort_int8):
    rows = ort_int8.encode(TEXTS, convert_to_numpy=False)
    assert isinstance(rows, list) and len(rows) == 3
    np.testing.assert_array_equal(np.stack(rows), ort_int8.encode(TEXTS))
    assert ort_int8.encode(TEXTS[0], convert_to_numpy=False).shape == (64,)


def test_the_array_is_the_engines_buffer_not_a_copy(ort_int8):
    v = ort_int8.encode(TEXTS)
    # Owned by the Rust Vec (a PySliceContainer), not a NumPy-allocated copy of it.
    assert not v.flags["OWNDATA"]
    assert v.base is not None and not isinstance(v.base, np.ndarray)
    assert v.flags["WRITEABLE"]


def test_single_and_batched_rows_agree(ort_fp32):
    batched = ort_fp32.encode(TEXTS)
    for text, row in zip(TEXTS, batched):
        np.testing.assert_allclose(ort_fp32.encode(text), row, atol=1e-5)


def test_normalize_embeddings(ort_fp32):
    raw = ort_fp32.encode(TEXTS)
    unit = ort_fp32.encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-6)
    assert np.all(np.abs(np.linalg.norm(raw, axis=1) - 1.0) > 1e-3), "default is raw vectors"
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6)


def test_truncate_dim(ort_fp32):
    raw = ort_fp32.encode(TEXTS)
    short = ort_fp32.encode(TEXTS, truncate_dim=16)
    assert short.shape == (3, 16)
    np.testing.assert_allclose(short, raw[:, :16], atol=1e-6)
    unit = ort_fp32.encode(TEXTS, truncate_dim=16, normalize_embeddings=True)
    # Truncated first, then normalized (sentence-transformers' order).
    np.testing.assert_allclose(unit, raw[:, :16] / np.linalg.norm(raw[:, :16], axis=1,
                                                                 keepdims=True), atol=1e-6)
    assert ort_fp32.encode(TEXTS, truncate_dim=1000).shape == (3, 64)
    model = ruri.Embedder(TINY, backend="ort", precision="fp32", truncate_dim=8)
    assert model.get_sentence_embedding_dimension() == 8
    assert model.encode(TEXTS[0]).shape == (8,)
    assert model.encode(TEXTS[0], truncate_dim=32).shape == (32,)


def test_batch_size_changes_batching_not_vectors(ort_fp32):
    texts = [t * (i + 1) for i, t in enumerate(TEXTS * 4)]
    np.testing.assert_allclose(ort_fp32.encode(texts, batch_size=1),
                               ort_fp32.encode(texts, batch_size=64), atol=1e-5)


def test_prompts(ort_fp32):
    with (TINY / "config_sentence_transformers.json").open(encoding="utf-8") as f:
        config = json.load(f)
    assert ort_fp32.prompts == config["prompts"]
    assert ort_fp32.default_prompt_name is None
    query = ort_fp32.encode(TEXTS, prompt_name="query")
    np.testing.assert_array_equal(query, ort_fp32.encode(TEXTS, prompt="検索クエリ: "))
    np.testing.assert_array_equal(query, ort_fp32.encode_query(TEXTS))
    np.testing.assert_array_equal(ort_fp32.encode_document(TEXTS),
                                  ort_fp32.encode(TEXTS, prompt_name="document"))
    assert not np.allclose(query, ort_fp32.encode(TEXTS), atol=1e-4)
    # An explicit prompt wins over encode_query's default.
    np.testing.assert_array_equal(ort_fp32.encode_query(TEXTS, prompt=""), ort_fp32.encode(TEXTS))
    np.testing.assert_array_equal(ort_fp32.encode_query(TEXTS, prompt_name="topic"),
                                  ort_fp32.encode(TEXTS, prompt="トピック: "))
    # sentence-transformers 6's name for the first argument.
    np.testing.assert_array_equal(ort_fp32.encode(inputs=TEXTS), ort_fp32.encode(TEXTS))


def test_prompt_wins_over_prompt_name_with_a_warning(ort_fp32, caplog):
    with caplog.at_level(logging.WARNING, logger="ruri"):
        both = ort_fp32.encode(TEXTS, prompt_name="query", prompt="トピック: ")
    assert "Ignoring the `prompt_name`" in caplog.text
    np.testing.assert_array_equal(both, ort_fp32.encode(TEXTS, prompt_name="topic"))


def test_default_prompt_name_applies_when_no_prompt_is_named(tmp_path):
    import shutil
    folder = tmp_path / "tiny"
    shutil.copytree(TINY, folder)
    path = folder / "config_sentence_transformers.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["default_prompt_name"] = "query"
    path.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    model = ruri.Embedder(folder, backend="ort", precision="fp32")
    assert model.default_prompt_name == "query"
    plain = ruri.Embedder(TINY, backend="ort", precision="fp32")
    np.testing.assert_allclose(model.encode(TEXTS), plain.encode(TEXTS, prompt_name="query"),
                               atol=1e-6)
    np.testing.assert_allclose(model.encode(TEXTS, prompt=""), plain.encode(TEXTS), atol=1e-6)


def test_similarity_is_cosine(ort_fp32):
    a = ort_fp32.encode(TEXTS)
    b = ort_fp32.encode(TEXTS[:2], prompt_name="document")
    sim = ort_fp32.similarity(a, b)
    assert sim.shape == (3, 2) and sim.dtype == np.float32
    for i in range(3):
        for j in range(2):
            expected = a[i] @ b[j] / (np.linalg.norm(a[i]) * np.linalg.norm(b[j]))
            assert abs(sim[i, j] - expected) < 1e-5
    assert ort_fp32.similarity(a[0], b).shape == (1, 2)
    assert ort_fp32.similarity(list(a), list(b)).shape == (3, 2)
    np.testing.assert_allclose(np.diag(ort_fp32.similarity(a, a)), 1.0, atol=1e-6)
    np.testing.assert_allclose(ort_fp32.similarity_pairwise(a[:2], b), np.diag(sim[:2]),
                               atol=1e-6)
    assert ort_fp32.similarity_fn_name == "cosine"


def test_the_default_backend_is_native_at_int8(native_int8):
    """Fails if ruri.Embedder's default moves off the native engine (issue 21: it beat ort at
    fp32 and int8), or off int8."""
    assert ruri.DEFAULT_BACKEND == "native"
    assert inspect.signature(ruri.Embedder).parameters["backend"].default is None
    model = ruri.Embedder(TINY)
    assert (model.backend, model.precision) == ("native", "int8")
    np.testing.assert_array_equal(model.encode(TEXTS), native_int8.encode(TEXTS))
    # ONNX Runtime only when named.
    assert ruri.Embedder(TINY, backend="ort").backend == "ort"


def test_model_attributes(ort_int8, ort_fp32):
    assert ort_int8.backend == "ort" and ort_int8.precision == "int8"
    assert ort_fp32.precision == "fp32" and ort_fp32.device == "cpu"
    assert ort_int8.get_sentence_embedding_dimension() == 64
    assert ort_int8.max_seq_length == 512 == ort_int8.get_max_seq_length()
    assert "ruri.Embedder(" in repr(ort_int8) and "int8" in repr(ort_int8)
    assert ruri.__version__ and "ort" in ruri.BACKENDS


def test_runtime_comes_from_the_onnxruntime_wheel(ort_int8, monkeypatch):
    library = ruri.onnxruntime_library()
    assert library is not None and "onnxruntime" in library and "capi" in library
    import os
    if os.environ.get("ORT_DYLIB_PATH"):
        pytest.skip("ORT_DYLIB_PATH is set: ruri loads that library instead")
    loaded = ruri._ruri.Engine.loaded_runtime_path()
    assert loaded is not None and os.path.realpath(loaded) == os.path.realpath(library)
