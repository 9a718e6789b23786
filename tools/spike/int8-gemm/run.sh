#!/usr/bin/env bash
# Runs the spike: rten-gemm (src/main.rs) and ONNX Runtime's MLAS (mlas.py) alternately,
# ROUNDS rounds (default 5), each a fresh process, then prints the medians over rounds with
# their ranges and the ratio MLAS ÷ rten-gemm (> 1: rten-gemm faster). Python: the test-data
# venv (onnxruntime 1.31.1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
rounds="${1:-5}" reps="${2:-100}"
py="${RURI_PYTHON:-../../../.venv-testdata/bin/python}"
cargo build --release -q
out=target/rounds.jsonl
: > "$out"
for ((r = 0; r < rounds; r++)); do
  if ((r % 2)); then order="mlas rten"; else order="rten mlas"; fi
  for e in $order; do
    if [[ $e == rten ]]; then ./target/release/int8-gemm-spike "$reps"; else "$py" mlas.py "$reps"; fi >> "$out"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs[(r["engine"].split()[0], r["k"], r["n"], r["m"], r["threads"])].append(r)
def cell(rs, key):
    v = [r[key] for r in rs]
    return statistics.median(v), f"{statistics.median(v):,.0f} [{min(v):,.0f}–{max(v):,.0f}]"
print("| K→N | M | threads | MLAS int8 µs | rten-gemm int8 µs | MLAS ÷ rten int8 | MLAS fp32 µs | rten-gemm fp32 µs |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for (eng, k, n, m, t) in sorted({key for key in runs if key[0] == "rten-gemm"}, key=lambda x: (x[4], x[1], x[2], -x[3])):
    rt, ml = runs[("rten-gemm", k, n, m, t)], runs[("onnxruntime", k, n, m, t)]
    (ri, ris), (mi, mis) = cell(rt, "int8_us"), cell(ml, "int8_us")
    (_, rfs), (_, mfs) = cell(rt, "fp32_us"), cell(ml, "fp32_us")
    print(f"| {k}→{n} | {m} | {t} | {mis} | {ris} | {mi / ri:.2f}× | {mfs} | {rfs} |")
print(f"\nrten-gemm kernel: {runs[next(iter(runs))][0].get('kernel', '?')}; rounds: {len(next(iter(runs.values())))}")
PY
