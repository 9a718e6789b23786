#!/usr/bin/env bash
# One long text in WebAssembly under node, by attention precision: ROUNDS alternated rounds
# (each precision once a round, each run a fresh node process, the order rotated from round
# to round), then the median seconds with the range and each precision's ratio to the first
# one's time, per round (ruri-wasm/tests/long_text.mjs measures one run). Needs the wasm
# build (tools/wasm/build.sh) and the 30m-shape model and workload (tools/testdata/generate.sh
# 30m, tools/bench/make_workload.py).
#
#   tools/wasm/long_text.sh [ROUNDS] [TOKENS] [PRECISIONS…]   (defaults: 5 8192 f32 int13 bf16)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rounds="${1:-5}" tokens="${2:-8192}"
shift $(($# < 2 ? $# : 2))
precisions=("$@")
[ $# -eq 0 ] && precisions=(f32 int13 bf16)
out="$root/target/wasm/long_text.jsonl"
mkdir -p "$(dirname "$out")"
: > "$out"
n=${#precisions[@]}
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < n; i++)); do
    p="${precisions[$(((i + r) % n))]}"
    echo "round $((r + 1))/$rounds: $p" >&2
    node "$root/ruri-wasm/tests/long_text.mjs" "$p" "$tokens" | sed "s/^{/{\"round\":$r,/" >> "$out"
  done
done
python3 - "$out" "${precisions[@]}" <<'PY'
import json, statistics, sys
path, first, *rest = sys.argv[1:]
runs = [json.loads(l) for l in open(path)]
by = lambda p: {r["round"]: r for r in runs if r["attention"] == p}
def span(xs):
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}–{max(xs):.2f}]"
print(f"| attention | seconds | wasm MiB | per-round time ÷ {first}'s |")
print("|---|---:|---:|---:|")
base = by(first)
for p in [first, *rest]:
    mine = by(p)
    secs = [r["seconds"] for r in mine.values()]
    mem = [r["wasm_mib"] for r in mine.values()]
    ratios = [mine[k]["seconds"] / base[k]["seconds"] for k in mine if k in base]
    print(f"| {p} | {span(secs)} | {statistics.median(mem):.0f} | {span(ratios)} |")
PY
