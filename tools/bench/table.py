#!/usr/bin/env python3
"""Merge benchmark result files (JSON lines, one object per system) into one Markdown table.

    python tools/bench/table.py peers.jsonl rust.jsonl [--peak peak.json]

Every input line must have the keys system, texts_per_s, tokens_per_s, p50_ms, p99_ms,
cold_start_s, peak_rss_mb (details optional). With --peak (the output of peak_flops.py),
two more columns: useful GFLOP/s = tokens_per_s × model FLOPs per token (at the workload's
token-weighted length; padding not counted) and that as % of the measured fp32 peak.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KEYS = ["system", "texts_per_s", "tokens_per_s", "p50_ms", "p99_ms", "cold_start_s", "peak_rss_mb"]


def fmt(x, nd=1):
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return str(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--peak", type=Path, help="JSON written by peak_flops.py --out")
    args = ap.parse_args()

    rows = []
    for f in args.files:
        for line in f.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            missing = [k for k in KEYS if k not in r]
            if missing:
                raise SystemExit(f"{f}: {r.get('system')}: missing keys {missing}")
            rows.append(r)

    peak = json.loads(args.peak.read_text(encoding="utf-8")) if args.peak else None
    head = ["system", "texts/s", "tokens/s", "p50 ms", "p99 ms", "cold start s", "peak RSS MB"]
    if peak:
        head += ["useful GFLOP/s", "% of fp32 peak"]
        fpt = peak["model"]["at_token_weighted_length"]["total_flops"]
        pk = peak["fp32_peak_gflops"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
    for r in rows:
        cells = [r["system"], fmt(r["texts_per_s"]), fmt(r["tokens_per_s"], 0), fmt(r["p50_ms"], 2),
                 fmt(r["p99_ms"], 2), fmt(r["cold_start_s"], 2), fmt(r["peak_rss_mb"], 0)]
        if peak:
            g = r["tokens_per_s"] * fpt / 1e9 if r["tokens_per_s"] else None
            cells += [fmt(g, 1), fmt(100 * g / pk if g else None, 1)]
        print("| " + " | ".join(cells) + " |")
    if peak:
        print(f"\nfp32 peak {pk} GFLOP/s ({peak['method']}); "
              f"{fpt / 1e6:.3f} MFLOP/token at L = {peak['model']['workload_token_weighted_length']}.")
    print_ratios(rows)


# Metric, label, and whether larger is better (ratios are written so that > 1 means better).
RATIOS = [
    ("texts_per_s", "texts/s", True),
    ("p50_ms", "p50 latency", False),
    ("p99_ms", "p99 latency", False),
    ("cold_start_s", "cold start", False),
    ("peak_rss_mb", "peak RSS", False),
]


def print_ratios(rows: list[dict]) -> None:
    """One table per metric: each ruri system against each peer, > 1 meaning ruri is better
    (faster, quicker, smaller)."""
    ours = [r for r in rows if r["system"].startswith("ruri ")]
    peers = [r for r in rows if not r["system"].startswith("ruri ")]
    if not ours or not peers:
        return
    for key, label, larger_better in RATIOS:
        print(f"\n**{label}: ruri ÷ peer as an improvement factor (> 1: ruri better)**\n")
        print("| ruri system | " + " | ".join(p["system"] for p in peers) + " |")
        print("|---|" + "---:|" * len(peers))
        for r in ours:
            cells = []
            for p in peers:
                a, b = r.get(key), p.get(key)
                if not a or not b:
                    cells.append("–")
                else:
                    cells.append(f"{(a / b) if larger_better else (b / a):.2f}×")
            print(f"| {r['system']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
