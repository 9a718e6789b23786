#!/usr/bin/env bash
# One long text in WebAssembly under node, by attention precision: ROUNDS alternated rounds
# (each precision once a round, each run a fresh node process, the order rotated from round
# to round), then tools/bench/rounds.py's tables: the medians with their ranges, and each
# precision's ratio to the first one's, per round (ruri-wasm/tests/long_text.mjs measures
# one run). Needs the wasm
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
python3 "$root/tools/bench/rounds.py" "$out" --baseline "wasm ${precisions[0]} attention" --per-round
