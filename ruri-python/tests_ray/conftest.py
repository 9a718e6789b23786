"""Fixtures of the ruri.ray tests: a real two-node Ray cluster on this machine
(local_cluster.py), started once for the session and always stopped in teardown, whatever
the tests did; the texts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from local_cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "testdata" / "tiny"


@pytest.fixture(scope="session")
def cluster():
    cluster = Cluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def make_texts(n: int) -> list:
    """n distinct texts of varied length, from the committed inputs (testdata/inputs.json)."""
    with (ROOT / "testdata" / "inputs.json").open(encoding="utf-8") as f:
        base = [item["text"] for item in json.load(f) if item["text"].strip()]
    return [f"{i}番: " + base[i % len(base)] * (1 + (i * 7) % 4) for i in range(n)]
