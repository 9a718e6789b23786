"""The root README's Ray example (the block after its `readme-corpus-ray` marker), run as
written in a fresh Python process (`ray.init()` finds the test cluster through RAY_ADDRESS),
with only the model folder replaced by the committed tiny model and the shared storage by a
temporary folder; its output is checked
against the plain package."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import ruri
from conftest import ROOT, TINY, make_texts


def readme_block(marker: str) -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    at = readme.index(f"<!-- {marker}:")
    match = re.search(r"```python\n(.*?)```", readme[at:], re.S)
    assert match, f"a python block after {marker}"
    return match.group(1)


def test_the_readme_ray_example_runs_on_the_cluster(cluster, tmp_path):
    code = readme_block("readme-corpus-ray")
    assert '"path/to/ruri-v3-30m"' in code
    code = code.replace('"path/to/ruri-v3-30m"', repr(str(TINY)))
    assert '"/shared/' in code
    code = code.replace('"/shared/', f'"{tmp_path}/')
    texts = make_texts(300)
    pq.write_table(pa.table({"id": np.arange(300, dtype=np.int64), "text": texts}),
                   tmp_path / "docs.parquet", row_group_size=100)
    env = dict(os.environ, RAY_ADDRESS=cluster.address)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    table = pq.read_table(tmp_path / "vectors")
    assert sorted(table.column("id").to_pylist()) == list(range(300))
    order = np.argsort(table.column("id").to_numpy())
    vectors = np.stack([np.asarray(v, dtype=np.float32)
                        for v in table.column("embedding").to_pylist()])[order]
    # The default backend and precision (native int8), as in the plain package's encode.
    default = ruri.Embedder(TINY)
    assert (default.backend, default.precision) == ("native", "int8")
    expected = default.encode_document(texts)
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
