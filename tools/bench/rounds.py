#!/usr/bin/env python3
"""Summarize interleaved benchmark rounds (JSON lines; each line one system in one round, with
a "round" key) as one Markdown table: the median of each metric with its range over the
rounds, and each system's median ratio to a baseline system of the same run.

    python tools/bench/rounds.py rounds.jsonl [--baseline "ruri ort_int8" …] [--per-round]

--baseline may be given more than once: the ratio tables are printed for each.

--per-round: also each system's ratio to the baseline round by round (the same round's two
processes), as the median with its range: the figure to quote for a comparison, since a
shared machine's slow phases move both.

Written for tools/bench/compare.sh, which runs every system once per round, each in a fresh
process, rotating the order, so that slow phases of a shared machine fall on all systems.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

# key, header, digits, larger is better
METRICS = [
    ("texts_per_s", "texts/s", 0, True),
    ("p50_ms", "p50 ms", 2, False),
    ("p99_ms", "p99 ms", 2, False),
    ("p50_cold_ms", "p50 cold caches ms", 2, False),
    ("p99_cold_ms", "p99 cold caches ms", 2, False),
    ("concurrent_queries_per_s", "concurrent queries/s", 0, True),
    ("concurrent_p50_ms", "concurrent p50 ms", 2, False),
    ("concurrent_p99_ms", "concurrent p99 ms", 2, False),
    ("cold_start_s", "cold start s", 3, False),
    ("peak_rss_mb", "peak RSS MB", 0, False),
    ("seconds", "one long text s", 2, False),
    ("wasm_mib", "wasm memory MiB", 0, False),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", type=Path)
    ap.add_argument("--baseline", action="append")
    ap.add_argument("--per-round", action="store_true")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = defaultdict(list)
    order: list[str] = []
    for line in args.file.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        if r["system"] not in runs:
            order.append(r["system"])
        runs[r["system"]].append(r)
    metrics = [m for m in METRICS if any(r.get(m[0]) is not None for rs in runs.values() for r in rs)]
    rounds = max(len(v) for v in runs.values())
    print(f"Median over {rounds} interleaved rounds (each a fresh process), [min–max].\n")
    print("| system | " + " | ".join(m[1] for m in metrics) + " |")
    print("|---|" + "---:|" * len(metrics))
    med: dict[tuple[str, str], float] = {}
    for s in order:
        cells = []
        for key, _, nd, _ in metrics:
            vals = [r[key] for r in runs[s] if r.get(key) is not None]
            if not vals:
                cells.append("–")
                continue
            m = statistics.median(vals)
            med[(s, key)] = m
            cells.append(f"{m:,.{nd}f} [{min(vals):,.{nd}f}–{max(vals):,.{nd}f}]")
        print(f"| {s} (n={len(runs[s])}) | " + " | ".join(cells) + " |")
    for baseline in args.baseline or ["ruri ort_int8"]:
        ratios(runs, order, metrics, med, baseline, args.per_round)


def ratios(runs: dict[str, list[dict]], order: list[str], metrics: list, med: dict, baseline: str, per: bool) -> None:
    """The ratio of each system's medians to `baseline`'s, and (`per`) the per-round ones."""
    if baseline in runs:
        print(f"\nRatio of medians to {baseline} (> 1: better than it).\n")
        print("| system | " + " | ".join(m[1] for m in metrics) + " |")
        print("|---|" + "---:|" * len(metrics))
        for s in order:
            cells = []
            for key, _, _, larger in metrics:
                a, b = med.get((s, key)), med.get((baseline, key))
                cells.append("–" if not a or not b else f"{(a / b) if larger else (b / a):.2f}×")
            print(f"| {s} | " + " | ".join(cells) + " |")
        if per:
            per_round(runs, order, metrics, baseline)


def per_round(runs: dict[str, list[dict]], order: list[str], metrics: list, baseline: str) -> None:
    """Each system's ratio to `baseline` within each round (> 1: better), median [min–max]."""
    base = {r["round"]: r for r in runs[baseline]}
    print(f"\nPer-round ratio to {baseline} (> 1: better than it), median [min–max].\n")
    print("| system | " + " | ".join(m[1] for m in metrics) + " |")
    print("|---|" + "---:|" * len(metrics))
    for s in order:
        if s == baseline:
            continue
        cells = []
        for key, _, _, larger in metrics:
            ratios = sorted(
                (r[key] / b[key]) if larger else (b[key] / r[key])
                for r in runs[s]
                if (b := base.get(r["round"])) and r.get(key) and b.get(key)
            )
            cells.append(
                "–"
                if not ratios
                else f"{statistics.median(ratios):.3f} [{ratios[0]:.3f}–{ratios[-1]:.3f}] (n={len(ratios)})"
            )
        print(f"| {s} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
