"""Embed a Parquet file's "text" column with Ray Data and write the vectors to Parquet.

    pip install './ruri-python[ray]'
    python ruri-python/examples/ray_embed.py testdata/tiny texts.parquet vectors/ --workers 2

Without an input file it writes a small one first (--demo-rows). On one machine it starts a
local Ray; on a cluster (ray start --head / ray start --address=HEAD:6379 on each node, ruri
installed on all) run it on a node with --address auto: the same code, the actors spread
over the cluster's CPUs. The model must be readable on every node (a shared path or a Hub id).
"""

from __future__ import annotations

import argparse
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import ray
import ray.data

import ruri.ray


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model folder on every node, or a Hub id")
    parser.add_argument("input", help="a Parquet file or folder with a 'text' column")
    parser.add_argument("output", help="a folder for the output Parquet files")
    parser.add_argument("--address", default=None, help="a cluster's address, or 'auto'")
    parser.add_argument("--workers", type=int, default=1, help="actors (one model each)")
    parser.add_argument("--cpus-per-worker", type=float, default=1)
    parser.add_argument("--batch-size", type=int, default=256, help="rows per call")
    parser.add_argument("--backend", default=None,
                        help="native, ort or candle (default: ruri.DEFAULT_BACKEND, native)")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--task", choices=["query", "document"], default="document")
    parser.add_argument("--demo-rows", type=int, default=1000,
                        help="rows written to INPUT first when it does not exist")
    args = parser.parse_args()

    if not os.path.exists(args.input):
        texts = [f"{i}番目の文書: 瑠璃は青い宝石で、古くから装飾に使われてきました。"
                 for i in range(args.demo_rows)]
        pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), args.input)

    ray.init(address=args.address)
    # The read takes no CPU, so it runs even when the actors hold every CPU (e.g. --workers 2
    # on a 2-core machine). Ray 2.60's default Parquet reader (DataSourceV2) lists files in a
    # task of one CPU whatever num_cpus says, which then never runs: use the classic reader.
    context = ray.data.DataContext.get_current()
    if hasattr(context, "use_datasource_v2"):
        context.use_datasource_v2 = False
    ds = ray.data.read_parquet(args.input, num_cpus=0)
    ds = ds.map_batches(
        ruri.ray.Embed,
        fn_constructor_kwargs={"model": args.model, "backend": args.backend,
                               "precision": args.precision, "task": args.task},
        compute=ray.data.ActorPoolStrategy(size=args.workers),
        num_cpus=args.cpus_per_worker,
        batch_size=args.batch_size,
    )
    start = time.perf_counter()
    ds.write_parquet(args.output)
    elapsed = time.perf_counter() - start
    rows = pq.read_table(args.output).num_rows
    print(f"{rows} rows embedded into {args.output} in {elapsed:.1f} s "
          f"({rows / elapsed:.0f} rows/s, {args.workers} worker(s))")


if __name__ == "__main__":
    main()
