"""Vectors against the committed sentence-transformers references, through the Python API.

Tolerances are those of the Rust parity suite (tests/parity.rs), stated once here:
- fp32 (ort, candle and native) vs sentence-transformers fp32: max |Δ| ≤ 1e-5 on raw and normalized
  vectors (the same math; only summation order differs).
- ort int8 vs sentence-transformers fp32: cosine ≥ 0.995, and ≥ 0.99 over the channels other
  than the planted outlier channel (which holds ≈ 0.8 of each unit vector and hides errors),
  alone and in mixed-length batches: dynamic quantization's own error (tests/parity.rs
  INT8_VS_ST, INT8_IN_BATCH_VS_ALONE).
"""

from __future__ import annotations

import numpy as np
import pytest

import ruri
from conftest import TINY, cosine, load_reference

FP32_MAX_ABS_DIFF = 1e-5
INT8_MIN_COSINE = 0.995
INT8_MIN_COSINE_WITHOUT_OUTLIER = 0.99


def st(item: dict, normalized: bool) -> np.ndarray:
    return np.asarray(item["st_fp32"]["normalized" if normalized else "mean"], dtype=np.float32)


@pytest.mark.parametrize("normalized", [False, True])
def test_fp32_alone_matches_sentence_transformers(fp32, tiny_reference, normalized):
    worst = 0.0
    for item in tiny_reference["items"]:
        v = fp32.encode(item["text"], prompt_name=item["prompt_name"],
                        normalize_embeddings=normalized)
        assert v.shape == (tiny_reference["dim"],) and v.dtype == np.float32
        diff = float(np.max(np.abs(v - st(item, normalized))))
        worst = max(worst, diff)
        assert diff <= FP32_MAX_ABS_DIFF, f"{item['id']}: max |Δ| {diff:.3e}"
    print(f"{fp32!r} alone, normalized={normalized}: max |Δ| {worst:.3e}")


@pytest.mark.parametrize("batch_size", [32, 4])
def test_fp32_batched_matches_sentence_transformers(fp32, tiny_reference, batch_size):
    items = tiny_reference["items"]
    # Each prompt written into its text, so texts of every length and prompt share batches.
    vectors = fp32.encode([i["prompt"] + i["text"] for i in items], batch_size=batch_size)
    assert vectors.shape == (len(items), tiny_reference["dim"])
    for item, v in zip(items, vectors):
        diff = float(np.max(np.abs(v - st(item, False))))
        assert diff <= FP32_MAX_ABS_DIFF, f"{item['id']}: max |Δ| {diff:.3e}"


def test_encode_query_and_document_pick_the_reference_prompts(ort_fp32, tiny_reference):
    """encode_query / encode_document without a prompt give what sentence-transformers gave
    for prompt_name="query" / "document"."""
    by_prompt = {"query": ort_fp32.encode_query, "document": ort_fp32.encode_document}
    checked = 0
    for item in tiny_reference["items"]:
        encode = by_prompt.get(item["prompt_name"])
        if encode is None:
            continue
        diff = float(np.max(np.abs(encode(item["text"]) - st(item, False))))
        assert diff <= FP32_MAX_ABS_DIFF, f"{item['id']}: max |Δ| {diff:.3e}"
        checked += 1
    assert checked >= 8


def without(v: np.ndarray, channel) -> np.ndarray:
    return v if channel is None else np.delete(v, channel)


def test_int8_within_quantization_bound_alone_and_batched(ort_int8, tiny_reference):
    items = tiny_reference["items"]
    outlier = tiny_reference.get("outlier_channel")
    alone = [ort_int8.encode(i["text"], prompt_name=i["prompt_name"]) for i in items]
    batched = ort_int8.encode([i["prompt"] + i["text"] for i in items])
    worst = (1.0, 1.0)
    for label, vectors in (("alone", alone), ("batched", batched)):
        for item, v in zip(items, vectors):
            ref = st(item, False)
            c = cosine(v, ref)
            c_rest = cosine(without(v, outlier), without(ref, outlier))
            worst = (min(worst[0], c), min(worst[1], c_rest))
            assert c >= INT8_MIN_COSINE, f"{label} {item['id']}: cosine {c}"
            assert c_rest >= INT8_MIN_COSINE_WITHOUT_OUTLIER, \
                f"{label} {item['id']}: cosine without the outlier {c_rest}"
    print(f"int8 vs sentence-transformers fp32: min cosine {worst[0]:.5f}, "
          f"without the outlier {worst[1]:.5f}")


def test_native_int8_is_within_the_bound_and_batch_independent(native_int8, tiny_reference):
    """The native engine's int8 (exact integer kernels, per-row activations): within the same
    quantization bound, and each vector has the same bits alone and in a batch."""
    items = tiny_reference["items"]
    outlier = tiny_reference.get("outlier_channel")
    alone = np.stack([native_int8.encode(i["text"], prompt_name=i["prompt_name"]) for i in items])
    batched = native_int8.encode([i["prompt"] + i["text"] for i in items], batch_size=32)
    assert np.array_equal(alone, batched)
    for item, v in zip(items, alone):
        ref = st(item, False)
        assert cosine(v, ref) >= INT8_MIN_COSINE, item["id"]
        assert cosine(without(v, outlier), without(ref, outlier)) >= \
            INT8_MIN_COSINE_WITHOUT_OUTLIER, item["id"]


def test_int8_is_not_fp32(ort_int8, ort_fp32, tiny_reference):
    """The int8 embedder runs quantized weights (else the bound above would test nothing)."""
    text = tiny_reference["items"][1]["text"]
    assert float(np.max(np.abs(ort_int8.encode(text) - ort_fp32.encode(text)))) > 1e-4


@pytest.mark.parametrize("policy,reference", [
    ("keep", "tiny_whitespace_keep.json"),    # sentence-transformers 6.2 (keeps, as >= 5.4)
    ("strip", "tiny_whitespace_strip.json"),  # sentence-transformers 5.3 (strips, as 2.x-5.3)
])
def test_whitespace_policies_match_their_sentence_transformers(policy, reference):
    ref = load_reference(reference)
    assert ref["behaviour"] == policy
    model = ruri.Embedder(TINY, backend="ort", precision="fp32", whitespace=policy)
    default = ruri.Embedder(TINY, backend="ort", precision="fp32")
    assert model.whitespace == policy and default.whitespace == "keep"
    items = ref["items"]
    vectors = [model.encode(i["text"], prompt_name=i["prompt_name"]) for i in items]
    differs = 0
    for item, v in zip(items, vectors):
        diff = float(np.max(np.abs(v - st(item, False))))
        assert diff <= FP32_MAX_ABS_DIFF, f"{policy} {item['id']}: max |Δ| {diff:.3e}"
        if policy == "strip":
            kept = default.encode(item["text"], prompt_name=item["prompt_name"])
            differs += float(np.max(np.abs(kept - v))) > 1e-4
    if policy == "strip":
        assert differs > 10, "the strip references must differ from keep on many inputs"


def test_token_counts_match_sentence_transformers(ort_fp32, tiny_reference):
    items = tiny_reference["items"]
    for item in items:
        assert ort_fp32.token_counts([item["text"]], prompt=item["prompt"]) == \
            [len(item["token_ids"])], item["id"]
    assert ort_fp32.max_seq_length == tiny_reference["max_seq_length"]
    assert ort_fp32.get_sentence_embedding_dimension() == tiny_reference["dim"]


def test_hostile_inputs_match_sentence_transformers(ort_fp32):
    """NUL bytes, control and invisible characters, lone combining marks, whitespace past the
    maximum length (testdata/hostile_inputs.json, docs/hostile-inputs.md)."""
    ref = load_reference("tiny_hostile.json")
    texts = [i["text"] for i in ref["items"]]
    vectors = ort_fp32.encode([i["prompt"] + t for i, t in zip(ref["items"], texts)])
    for item, v in zip(ref["items"], vectors):
        diff = float(np.max(np.abs(v - st(item, False))))
        assert diff <= FP32_MAX_ABS_DIFF, f"{item['id']}: max |Δ| {diff:.3e}"
