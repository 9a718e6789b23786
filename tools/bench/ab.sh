#!/usr/bin/env bash
# Two builds of examples/compare.rs against each other: the working tree and an earlier
# revision. In every round each build runs each system of --systems once (and the base
# build the --ref system, if given), each in a fresh process, in an order rotated from round
# to round, so that the slow phases of a shared machine fall on both builds alike. Prints
# rounds.py's table, with per-round ratios to the base build's first system (and to --ref).
#
#   tools/bench/ab.sh --base REV [--rounds N] [--systems "native_int8 …"] [--ref SYSTEM]
#                     [-- ARGS for compare, e.g. --long-text 8192]
#
# The base build lives in target/ab/<commit> (a git worktree with its own target directory:
# the first build of a revision takes minutes). Needs what compare.sh needs (the 30m-shaped
# model and the workload: run tools/bench/compare.sh once). Measure on an idle machine.
# Results: testdata/generated/bench/{ab.jsonl,ab.md}.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
base="" rounds=5 systems="native_int8" ref=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --base) base="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --systems) systems="$2"; shift 2 ;;
    --ref) ref="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "unknown option $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
done
[[ -n "$base" ]] || { echo "--base REV is required" >&2; exit 2; }
commit="$(git rev-parse --verify "$base^{commit}")"
short="${commit:0:7}"
tree="target/ab/$commit"
if [[ ! -d "$tree" ]]; then
  git worktree add --detach "$tree" "$commit" >/dev/null
fi
# The base build's tree reads the same model files and workload as this one.
(cd "$tree" && cargo build --quiet --release --example compare --target-dir target)
cargo build --quiet --release --example compare
bin_base="$tree/target/release/examples/compare"
model="$root/testdata/generated/ruri-v3-30m-shape"
workload="$root/testdata/generated/bench"
[[ -f "$model/config.json" && -f "$workload/queries.jsonl" ]] ||
  { echo "no model or workload: run tools/bench/compare.sh once" >&2; exit 2; }
bin_here="target/release/examples/compare"

runs=()
for s in $systems; do runs+=("here:$s" "$short:$s"); done
[[ -n "$ref" ]] && runs+=("$short:$ref")
out=testdata/generated/bench
mkdir -p "$out"
: > "$out/ab.jsonl"
n=${#runs[@]}
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < n; i++)); do
    entry="${runs[$(((i + r) % n))]}"
    build="${entry%%:*}" system="${entry#*:}"
    bin="$bin_here"; [[ "$build" == here ]] || bin="$bin_base"
    echo "round $((r + 1))/$rounds: $system ($build)" >&2
    # Both builds read this tree's model and workload (compare's defaults are its own tree's).
    "$bin" --repeats 1 --systems "$system" --model "$model" --workload "$workload" "$@" \
      | python3 -c "
import json, sys
for line in sys.stdin:
    if line.strip():
        r = json.loads(line); r['system'] += ' @$build'; r['round'] = $r; print(json.dumps(r))" \
      >> "$out/ab.jsonl"
  done
done
# Ratios to the base build's first system, and to --ref's if given.
first="${systems%% *}"
baselines=(--baseline "ruri $first @$short")
[[ -n "$ref" ]] && baselines+=(--baseline "ruri $ref @$short")
python3 tools/bench/rounds.py "$out/ab.jsonl" "${baselines[@]}" --per-round | tee "$out/ab.md"
