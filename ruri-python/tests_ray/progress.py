"""An Embed that tells the test where it runs: it writes one line per batch (its PID, its
node, the batch's ids) to a file under `progress_dir`, then waits `delay` seconds, so the
test can kill a worker while batches remain. Pickled by value (the workers cannot import the
tests folder)."""

from __future__ import annotations

import json
import os
import time

import ray

import ruri.ray


class ReportingEmbed(ruri.ray.Embed):
    def __init__(self, *args, progress_dir: str, delay: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.progress_dir = progress_dir
        self.delay = delay
        self.node = ray.get_runtime_context().get_node_id()

    def __call__(self, batch):
        out = super().__call__(batch)
        line = json.dumps({"pid": os.getpid(), "node": self.node,
                           "ids": [int(i) for i in batch["id"]]})
        with open(os.path.join(self.progress_dir, f"{os.getpid()}.jsonl"), "a") as f:
            f.write(line + "\n")
        time.sleep(self.delay)
        return out
