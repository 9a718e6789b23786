#!/usr/bin/env python3
"""ruri.ray's throughput: rows/s with 1 and 2 Ray Data workers against the plain package's
`encode` on the same rows, each run in a fresh process, the systems alternated per round.

    target/venv-ray/bin/python tools/bench/ray_bench.py [--model DIR] [--rows N] [--rounds 5]

Systems (all ort int8, the wheel's default, one model thread per worker):
- `encode`: one process pinned to core 0 (taskset), `ruri.Embedder(model, intra_threads=1)`,
  all rows in one `encode` call.
- `ray-1`, `ray-2`: a two-node Ray cluster on this machine (tests_ray/local_cluster.py), the
  head node pinned to core 0 and the worker node to core 1, one CPU each; rows read from a
  Parquet file, `map_batches(ruri.Embed, ActorPoolStrategy(size=1|2), num_cpus=1,
  batch_size=256)`, vectors collected in the driver. The cluster's start is not timed; the
  actors' start and model load are (what a job pays); the table also gives the time to the
  first output block, which is mostly that start.

Overhead per row = (ray-1's time − encode's time, both including the model load) / rows:
what Ray Data adds on one core; ray-2 gets its speed-up over ray-1 (same round) instead.
Medians and ranges over the rounds. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS_RAY = ROOT / "ruri-python" / "tests_ray"


def texts(n: int) -> list:
    with (ROOT / "testdata" / "inputs.json").open(encoding="utf-8") as f:
        base = [item["text"] for item in json.load(f) if item["text"].strip()]
    return [f"{i}番: " + base[i % len(base)] * (1 + (i * 7) % 4) for i in range(n)]


def run_encode(model: str, rows: int) -> dict:
    import ruri

    data = texts(rows)
    start = time.perf_counter()
    embedder = ruri.Embedder(model, intra_threads=1)
    loaded = time.perf_counter()
    vectors = embedder.encode(data)
    end = time.perf_counter()
    assert vectors.shape[0] == rows
    return {"total_s": end - start, "load_s": loaded - start, "first_s": None}


def run_ray(model: str, rows: int, workers: int, parquet: str) -> dict:
    sys.path.insert(0, str(TESTS_RAY))
    from local_cluster import Cluster

    cluster = Cluster()
    try:
        cluster.start(pin=True)
        import ray
        import ray.data

        import ruri.ray

        context = ray.data.DataContext.get_current()
        if hasattr(context, "use_datasource_v2"):
            context.use_datasource_v2 = False  # see tests_ray/test_ray.py's read()
        start = time.perf_counter()
        ds = ray.data.read_parquet(parquet, num_cpus=0).map_batches(
            ruri.ray.Embed, fn_constructor_kwargs={"model": model},
            compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=1, batch_size=256)
        got, first = 0, None
        for batch in ds.iter_batches(batch_format="numpy", batch_size=None):
            if first is None:
                first = time.perf_counter() - start
            got += len(batch["embedding"])
        end = time.perf_counter()
        assert got == rows, (got, rows)
        return {"total_s": end - start, "load_s": None, "first_s": first}
    finally:
        cluster.stop()


def child(args) -> None:
    if args.system == "encode":
        result = run_encode(args.model, args.rows)
    else:
        result = run_ray(args.model, args.rows, int(args.system.split("-")[1]), args.parquet)
    print("RESULT " + json.dumps(result), flush=True)


def spread(values: list) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=str(ROOT / "testdata" / "tiny"))
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--system", help=argparse.SUPPRESS)
    parser.add_argument("--parquet", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.system:
        return child(args)

    import pyarrow as pa
    import pyarrow.parquet as pq

    systems = ["encode", "ray-1", "ray-2"]
    results = {s: [] for s in systems}
    with tempfile.TemporaryDirectory(prefix="ruri-ray-bench-") as tmp:
        parquet = os.path.join(tmp, "texts.parquet")
        pq.write_table(pa.table({"id": list(range(args.rows)), "text": texts(args.rows)}),
                       parquet, row_group_size=max(1, args.rows // 16))
        for round_ in range(args.rounds):
            # Rotated each round, so no system always runs first (or after the same one).
            order = systems[round_ % 3:] + systems[:round_ % 3]
            for system in order:
                command = [sys.executable, __file__, "--system", system, "--model", args.model,
                           "--rows", str(args.rows), "--parquet", parquet]
                if system == "encode":
                    command = ["taskset", "-c", "0"] + command
                out = subprocess.run(command, capture_output=True, text=True, check=True,
                                     env={**os.environ, "RAY_AUTH_MODE": "disabled",
                                          "RAY_USAGE_STATS_ENABLED": "0"})
                line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")][-1]
                result = json.loads(line[len("RESULT "):])
                results[system].append(result)
                print(f"round {round_ + 1} {system}: {result['total_s']:.2f} s",
                      file=sys.stderr, flush=True)

    encode_total = [r["total_s"] for r in results["encode"]]
    print(f"\nmodel {args.model}, {args.rows} rows, {args.rounds} rounds; "
          "medians (min–max)\n")
    print("| system | rows/s (load included) | time to first block, s | "
          "overhead per row vs encode, µs (ray-2: speed-up over ray-1) |")
    print("|---|---|---|---|")
    for system in systems:
        totals = [r["total_s"] for r in results[system]]
        rate = spread([args.rows / t for t in totals])
        if system == "encode":
            loads = [r["load_s"] for r in results[system]]
            first = f"(load {statistics.median(loads):.2f})"
            overhead = "—"
        else:
            firsts = [r["first_s"] for r in results[system]]
            first = f"{statistics.median(firsts):.2f} ({min(firsts):.2f}–{max(firsts):.2f})"
            if system == "ray-1":
                per_row = [(t - e) / args.rows * 1e6 for t, e in zip(totals, encode_total)]
                overhead = (f"{statistics.median(per_row):,.0f} "
                            f"({min(per_row):,.0f}–{max(per_row):,.0f})")
            else:
                one = [r["total_s"] for r in results["ray-1"]]
                ups = [o / t for o, t in zip(one, totals)]
                overhead = f"×{statistics.median(ups):.2f} ({min(ups):.2f}–{max(ups):.2f})"
        print(f"| {system} | {rate} | {first} | {overhead} |")
    encode_only = [args.rows / (r["total_s"] - r["load_s"]) for r in results["encode"]]
    print(f"\nencode alone (model load excluded): {spread(encode_only)} rows/s")


if __name__ == "__main__":
    main()
