#!/usr/bin/env bash
# The one comparison command (BENCHMARKS.md): on this machine, with the same workload and
# model files, measures ruri's systems (examples/compare.rs) and the Python peers
# (python_peers.py) in interleaved rounds: each round runs every system once, each in a fresh
# process, in an order rotated from round to round, so that the slow phases of a shared
# machine fall on all systems alike. Prints the median of each metric with its range, and
# ratios of medians and per-round ratios from the same run (tools/bench/rounds.py).
#
#   tools/bench/compare.sh [--rounds N] [--rust "fused_int8 ort_int8 …"]
#                          [--peers "st_fp32 ruri_python_int8 …"]
#                          [--long-text TOKENS] [--cold-queries MB]
#                          [--concurrent-queries THREADS]
#
# --long-text: instead of the workload, one document of about TOKENS tokens per process
# (time and peak RSS; the Python peers are skipped).
# --cold-queries: ruri's systems also time each query after reading MB megabytes that evict
# the CPU caches (p50/p99 cold; the Python peers do not measure it).
# --concurrent-queries: ruri's systems also embed the queries from THREADS threads at once on
# one embedder (queries/s, p50/p99; the Python peers do not measure it).
#
# Needs the 30m-shaped model and the workload (made here if missing, with the test-data venv:
# tools/testdata/generate.sh 30m, tools/bench/make_workload.py). Measure on an idle machine.
# Results: testdata/generated/bench/{rounds.jsonl,table.md}.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
rounds=5
rust="fused_int8 ort_int8 fused_int8_x2 ort_int8_x2 fused_fp32 ort_fp32"
peers="ort_py_int8_sorted st_fp32"
# The Python package (ruri-python) through python_peers.py, when tools/test-python.sh has
# built its venv (target/venv-python).
if [[ -x target/venv-python/bin/python ]]; then peers+=" ruri_python_int8"; fi
long_text=""
cold_queries=""
concurrent_queries=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --rust) rust="$2"; shift 2 ;;
    --peers) peers="$2"; shift 2 ;;
    --long-text) long_text="$2"; peers=""; shift 2 ;;
    --cold-queries) cold_queries="$2"; shift 2 ;;
    --concurrent-queries) concurrent_queries="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

model=testdata/generated/ruri-v3-30m-shape
out=testdata/generated/bench
if [[ ! -f "$model/onnx/model_quantized.onnx" ]]; then
  tools/testdata/generate.sh 30m
fi
py="${RURI_PYTHON:-$root/.venv-testdata/bin/python}"
if [[ ! -f "$out/documents.jsonl" ]]; then
  "$py" tools/bench/make_workload.py
fi
tools/fetch-onnxruntime.sh >/dev/null
cargo build --quiet --release --example compare

systems=()
for s in $rust; do systems+=("rust:$s"); done
for s in $peers; do systems+=("py:$s"); done
n=${#systems[@]}
: > "$out/rounds.jsonl"
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < n; i++)); do
    entry="${systems[$(((i + r) % n))]}"
    kind="${entry%%:*}" system="${entry#*:}"
    echo "round $((r + 1))/$rounds: $system" >&2
    if [[ "$kind" == rust ]]; then
      extra=()
      [[ -n "$long_text" ]] && extra=(--long-text "$long_text")
      [[ -n "$cold_queries" ]] && extra+=(--cold-queries "$cold_queries")
      [[ -n "$concurrent_queries" ]] && extra+=(--concurrent-queries "$concurrent_queries")
      ./target/release/examples/compare --repeats 1 --systems "$system" "${extra[@]}"
    else
      "$py" tools/bench/python_peers.py --repeats 1 --systems "$system" --out /dev/null
    fi | python3 -c "
import json, sys
for line in sys.stdin:
    if line.strip():
        r = json.loads(line); r['round'] = $r; print(json.dumps(r))" >> "$out/rounds.jsonl"
  done
done
python3 tools/bench/rounds.py "$out/rounds.jsonl" --per-round | tee "$out/table.md"
