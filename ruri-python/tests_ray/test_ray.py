"""ruri.ray on a real two-node Ray cluster (conftest.py): every vector Ray Data writes equals
the one a single-process ruri.Embedder gives the same text, one row per input id, also when
a worker is killed mid-run.

Tolerances: the native backend packs each batch's tokens end to end (no padding), so its
vectors do not depend on which texts share a batch: Ray's batches must give them bit for bit.
ort pads a batch to its longest text, and a different batch composition changes the float
rounding of the padded GEMMs (2.4e-7 max |Δ| seen on the tiny model): ort is held to 1e-6,
far below any real change (a lost prompt or a wrong row moves vectors by > 0.1).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import ray.data

import ruri
import ruri.ray
from conftest import TINY, make_texts

import progress

ray.cloudpickle.register_pickle_by_value(progress)

# Each test fails rather than hangs (a scheduling deadlock would otherwise block CI).
pytestmark = pytest.mark.timeout(120)

ROWS = 3000
ORT_TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def parquet(tmp_path_factory) -> Path:
    """ROWS rows (id, text) in a Parquet file of 6 row groups, ids shuffled so that
    row order and id order differ."""
    path = tmp_path_factory.mktemp("data") / "texts.parquet"
    ids = np.random.default_rng(23).permutation(ROWS).astype(np.int64)
    texts = make_texts(ROWS)
    table = pa.table({"id": ids, "text": [texts[i] for i in ids]})
    pq.write_table(table, path, row_group_size=ROWS // 6)
    return path


def read(path: Path):
    """The Parquet file as a Dataset whose reading takes no CPU: the two actors hold the
    cluster's two CPUs for the whole run, and a read task waiting for a CPU would never run.
    Ray 2.60's default Parquet path (DataSourceV2) lists files in a task of one CPU whatever
    the read's num_cpus (seen: the run hung); its classic path honours num_cpus."""
    context = ray.data.DataContext.get_current()
    if hasattr(context, "use_datasource_v2"):
        context.use_datasource_v2 = False
    return ray.data.read_parquet(str(path), num_cpus=0)


def collect(ds) -> "tuple[np.ndarray, np.ndarray]":
    ids, vectors = [], []
    for batch in ds.iter_batches(batch_format="numpy", batch_size=None):
        ids.append(batch["id"])
        vectors.append(np.asarray(batch["embedding"]))
    return np.concatenate(ids), np.concatenate(vectors)


def check_rows(ids: np.ndarray, vectors: np.ndarray, expected: np.ndarray, exact: bool) -> None:
    assert len(ids) == ROWS, f"{len(ids)} rows out for {ROWS} in"
    assert sorted(ids.tolist()) == list(range(ROWS)), "rows lost or duplicated"
    assert vectors.dtype == np.float32 and vectors.shape == expected.shape
    got = vectors[np.argsort(ids)]
    if exact:
        different = np.flatnonzero((got != expected).any(axis=1))
        assert different.size == 0, f"{different.size} vectors differ, e.g. id {different[:5]}"
    else:
        worst = np.abs(got - expected).max()
        assert worst <= ORT_TOLERANCE, f"max |Δ| {worst}"


def test_two_nodes_native_bit_equal(cluster, parquet):
    assert sum(1 for node in ray.nodes() if node["Alive"]) == 2
    texts = make_texts(ROWS)
    # The plain package in this process, all texts in one call.
    expected = ruri.Embedder(TINY, backend="native").encode_document(texts)
    ds = read(parquet).map_batches(
        ruri.ray.Embed,
        fn_constructor_kwargs={"model": str(TINY), "backend": "native", "task": "document"},
        compute=ray.data.ActorPoolStrategy(size=2), num_cpus=1, batch_size=128)
    ids, vectors = collect(ds)
    check_rows(ids, vectors, expected, exact=True)


def test_two_nodes_ort_fp32_pyarrow(cluster, parquet):
    texts = make_texts(ROWS)
    expected = ruri.Embedder(TINY, backend="ort", precision="fp32").encode(
        texts, normalize_embeddings=True)
    ds = ruri.ray.embed_dataset(
        read(parquet), TINY, workers=2, batch_size=200,
        backend="ort", precision="fp32", normalize=True,
        map_batches_kwargs={"batch_format": "pyarrow"})
    table = ds.to_arrow_refs()
    table = pa.concat_tables(ray.get(table))
    assert pa.types.is_fixed_size_list(table.schema.field("embedding").type)
    assert table.schema.field("embedding").type.list_size == expected.shape[1]
    assert table.schema.field("embedding").type.value_type == pa.float32()
    vectors = np.asarray(table.column("embedding").combine_chunks().flatten()).reshape(
        len(table), -1)
    check_rows(table.column("id").to_numpy(), vectors, expected, exact=False)


def test_killed_worker_loses_and_duplicates_nothing(cluster, parquet, tmp_path):
    texts = make_texts(ROWS)
    expected = ruri.Embedder(TINY, backend="native").encode(texts)
    progress_dir = tmp_path / "progress"
    progress_dir.mkdir()
    head = ray.get_runtime_context().get_node_id()
    batch_size = 50  # 60 batches; 0.1 s each after the vectors: the run lasts ≈ 3 s
    killed = {}

    def reports():
        for path in progress_dir.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                if line.strip():
                    yield json.loads(line)

    def killer():
        # Wait for a worker on the second node to have done a few batches, with most
        # still to do, then SIGKILL its process (as the OOM killer or a crash would).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            done = list(reports())
            remote = [r for r in done if r["node"] != head]
            if len(done) >= 8 and remote:
                pid = remote[-1]["pid"]
                killed.update(pid=pid, batches_before=len(done))
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    ds = read(parquet).map_batches(
        progress.ReportingEmbed,
        fn_constructor_kwargs={"model": str(TINY), "backend": "native",
                               "progress_dir": str(progress_dir), "delay": 0.1},
        compute=ray.data.ActorPoolStrategy(size=2), num_cpus=1, batch_size=batch_size,
        # Ray Data's defaults, written out: restart a dead actor, resend its batch.
        max_restarts=-1, max_task_retries=-1)
    ids, vectors = collect(ds)
    thread.join(timeout=5)

    assert killed, "no worker on the second node reported a batch: nothing was killed"
    assert killed["batches_before"] < ROWS // batch_size, "the kill came after the last batch"
    assert not Path(f"/proc/{killed['pid']}").exists() or \
        "zombie" in Path(f"/proc/{killed['pid']}/status").read_text().lower(), \
        "the killed worker is still running"
    done = list(reports())
    after = [r for r in done if r["pid"] != killed["pid"]]
    assert len(done) > killed["batches_before"], "no batch ran after the kill"
    assert after, "no other worker took over"
    check_rows(ids, vectors, expected, exact=True)
