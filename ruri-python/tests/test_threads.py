"""Several Python threads embed at once: the GIL is released, and results equal sequential
ones."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import load_reference

TEXTS = [i["prompt"] + i["text"] for i in load_reference("tiny.json")["items"]]


@pytest.mark.parametrize("name", ["ort_fp32", "ort_int8", "candle_fp32"])
def test_threads_equal_sequential(request, name):
    model = request.getfixturevalue(name)
    # Each job: a different slice, alone or in batches, with different prompts.
    jobs = [(TEXTS[i::5], ("query", "document", None)[i % 3], 32 if i % 2 else 4)
            for i in range(10)]

    def run(job):
        texts, prompt_name, batch_size = job
        return model.encode(texts, prompt_name=prompt_name, batch_size=batch_size)

    sequential = [run(job) for job in jobs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(3):
            concurrent = list(pool.map(run, jobs))
            for s, c in zip(sequential, concurrent):
                np.testing.assert_array_equal(c, s)


def test_the_gil_is_released_during_a_call():
    """A pure-Python thread keeps running while another thread is inside encode. Were the GIL
    held for the whole call, the spinner would get at most one switch interval (5 ms) of it."""
    import ruri
    from conftest import TINY

    # intra_threads=1 leaves a core to spin on.
    model = ruri.Embedder(TINY, backend="ort", precision="fp32", intra_threads=1)
    long_texts = [t * 8 for t in TEXTS] * 4
    model.encode(long_texts[:2])  # warm
    stop = threading.Event()
    count = [0]

    def spin():
        while not stop.is_set():
            count[0] += 1

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        before = count[0]
        time.sleep(0.1)  # the spinner's rate while this thread waits
        rate = (count[0] - before) / 0.1
        start = time.perf_counter()
        before = count[0]
        model.encode(long_texts)
        during = count[0] - before
        elapsed = time.perf_counter() - start
    finally:
        stop.set()
        spinner.join()
    assert elapsed > 0.1, f"the call took {elapsed:.3f} s, too short to tell"
    assert during > 0.1 * rate * elapsed, (
        f"the other thread ran {during} iterations in {elapsed:.3f} s "
        f"({rate:.0f}/s when not blocked)")
