#!/usr/bin/env bash
# The one comparison command (BENCHMARKS.md): on this machine, with the same workload and
# model files, measures ruri (each backend × precision, examples/compare.rs) and the Python
# peers (sentence-transformers, onnxruntime-Python; python_peers.py), each in a fresh process,
# plus this machine's fp32 matmul peak, and prints one Markdown table with ratios.
#
#   tools/bench/compare.sh [--repeats N]
#
# Needs the 30m-shaped model and the workload (made here if missing, with the test-data venv:
# tools/testdata/generate.sh 30m, tools/bench/make_workload.py). Measure on an idle machine.
# Results: testdata/generated/bench/{rust.jsonl,peers.jsonl,peak.json,table.md}.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
repeats=3
if [[ "${1:-}" == "--repeats" ]]; then repeats="$2"; fi

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

"$py" tools/bench/peak_flops.py --out "$out/peak.json" >/dev/null
./target/release/examples/compare --repeats "$repeats" \
  --systems ort_int8,ort_int8_x2,ort_fp32,ort_fp32_x2,candle_f32,candle_bf16 > "$out/rust.jsonl"
"$py" tools/bench/python_peers.py --repeats "$repeats" --out "$out/peers.jsonl" >/dev/null
"$py" tools/bench/table.py "$out/peers.jsonl" "$out/rust.jsonl" --peak "$out/peak.json" \
  | tee "$out/table.md"
