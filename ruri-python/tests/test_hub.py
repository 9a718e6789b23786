"""Hub model ids (ruri's `hub` feature): the standard Hugging Face cache layout, offline, and
typed errors when the id is not cached or the Hub cannot be reached. (Downloads themselves are
tested in Rust against a mock Hub: tests/hub.rs.)"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import ruri
from conftest import TINY

pytestmark = pytest.mark.skipif(not ruri.HUB, reason="this build of ruri has no Hub support")

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def cache(tmp_path):
    """A Hugging Face cache holding testdata/tiny as ruri-test/tiny at main (huggingface_hub's
    layout: refs/main names the commit, snapshots/<commit>/ holds the files)."""
    repo = tmp_path / "models--ruri-test--tiny"
    shutil.copytree(TINY, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return tmp_path


def test_a_cached_id_loads_offline_and_equals_the_folder(cache):
    texts = ["瑠璃色はどんな色？", "瑠璃は青い宝石です。"]
    folder = ruri.Embedder(TINY, backend="ort", precision="fp32")
    for kwargs in ({}, {"revision": "main"}, {"revision": COMMIT}):
        by_id = ruri.Embedder("ruri-test/tiny", backend="ort", precision="fp32",
                              cache_folder=cache, local_files_only=True, **kwargs)
        assert by_id.model_path == "ruri-test/tiny"
        np.testing.assert_array_equal(by_id.encode(texts), folder.encode(texts))


def test_hf_hub_offline_and_cache_from_the_environment(cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = ruri.Embedder("ruri-test/tiny")
    assert model.encode("瑠璃").shape == (64,)


def test_an_uncached_id_offline_is_a_load_error(cache):
    with pytest.raises(ruri.ModelLoadError, match="not in the cache"):
        ruri.Embedder("ruri-test/absent", cache_folder=cache, local_files_only=True)
    with pytest.raises(ruri.ModelLoadError, match="not in the cache"):
        ruri.Embedder("ruri-test/tiny", revision="v9", cache_folder=cache, local_files_only=True)


def test_an_unreachable_hub_is_a_load_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ruri.ModelLoadError, match="cannot reach"):
        ruri.Embedder("ruri-test/tiny", cache_folder=tmp_path)
