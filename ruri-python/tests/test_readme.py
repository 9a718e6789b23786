"""The README's Python corpus example (the block after its `readme-corpus-python` marker), run
as written, with only the model folder replaced by the committed tiny test model."""

from __future__ import annotations

import contextlib
import io
import re

import numpy as np

from conftest import ROOT, TINY


def readme_block(marker: str) -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    at = readme.index(f"<!-- {marker}:")
    match = re.search(r"```python\n(.*?)```", readme[at:], re.S)
    assert match, f"a python block after {marker}"
    return match.group(1)


def test_the_readme_corpus_example_runs() -> None:
    code = readme_block("readme-corpus-python")
    assert '"path/to/ruri-v3-30m"' in code
    code = code.replace('"path/to/ruri-v3-30m"', repr(str(TINY)))
    out = io.StringIO()
    scope: dict = {}
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), scope)
    # 64 dimensions (the test model's), one bit each: 8 bytes a text.
    assert out.getvalue().strip() == "(2, 64) (2, 8)"
    vectors, bits = scope["vectors"], scope["bits"]
    assert bits.dtype == np.uint8
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
    # The bits are the signs of the vectors, packed as sentence-transformers packs them.
    np.testing.assert_array_equal(bits, np.packbits(vectors > 0, axis=-1))
