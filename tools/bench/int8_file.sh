#!/usr/bin/env bash
# ruri's int8 file (model.ruri-int8.safetensors) against model.safetensors, on the 30m shape
# (BENCHMARKS.md, "ruri's int8 file"): the native cold start (examples/compare.rs; native_int8
# and native_int8_table8, each with and without the file) and the node load (ruri-wasm's
# tests/bench.mjs, the fp32 file and the int8 file streamed in turn), in alternated rounds,
# each run a fresh process. Needs the 30m-shape model and workload (tools/testdata/generate.sh
# 30m, tools/bench/make_workload.py) and ruri-wasm/pkg (tools/wasm/build.sh).
#
#   tools/bench/int8_file.sh [ROUNDS]     (default 6; results in target/bench-int8-file/)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
rounds="${1:-6}"
model="$root/testdata/generated/ruri-v3-30m-shape"
workload="$root/testdata/generated/bench"
out="${CARGO_TARGET_DIR:-$root/target}/bench-int8-file"
mkdir -p "$out"
cargo build --quiet --release --example compare
cargo build --quiet --release -p ruri-native --example write_int8
bin="${CARGO_TARGET_DIR:-$root/target}/release/examples"
# Two folders of links to the model's files, each with its int8 file (f32 and int8 table).
for table in f32 int8; do
  dir="$out/model-$table"
  rm -rf "$dir" && mkdir -p "$dir"
  for f in "$model"/*; do ln -s "$f" "$dir/"; done
  rm -f "$dir/model.ruri-int8.safetensors"
  "$bin/write_int8" "$dir" "$dir/model.ruri-int8.safetensors" $([ "$table" = f32 ] && echo f32)
done
systems=("native_int8 model-f32" "native_int8_prequant model-f32"
  "native_int8_table8 model-int8" "native_int8_table8_prequant model-int8")
: > "$out/native.jsonl"
for ((round = 1; round <= rounds; round++)); do
  for i in 0 1 2 3; do
    set -- ${systems[$(((i + round) % 4))]}
    "$bin/compare" --systems "$1" --repeats 1 --model "$out/$2" --workload "$workload" \
      2>/dev/null | tail -1 >> "$out/native.jsonl"
  done
done
files=("$model/model.safetensors" "$out/model-int8/model.ruri-int8.safetensors")
: > "$out/wasm.jsonl"
for ((round = 1; round <= rounds; round++)); do
  for i in 0 1; do
    (cd ruri-wasm && RURI_WASM_MODEL="$model" RURI_WASM_WORKLOAD="$workload" \
      RURI_WASM_WEIGHTS="${files[$(((i + round) % 2))]}" node --expose-gc tests/bench.mjs |
      tail -1) >> "$out/wasm.jsonl"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
def med(xs): return f"{statistics.median(xs):.1f} [{min(xs):.1f}–{max(xs):.1f}]"
by = {}
for line in open(f"{out}/native.jsonl"):
    r = json.loads(line); by.setdefault(r["system"], []).append(r)
for system, rs in by.items():
    print(f"{system}: cold start {med([r['cold_start_s'] * 1e3 for r in rs])} ms, peak RSS {med([r['peak_rss_mb'] for r in rs])} MB, {med([r['texts_per_s'] for r in rs])} texts/s ({len(rs)} runs)")
by = {}
for line in open(f"{out}/wasm.jsonl"):
    r = json.loads(line); by.setdefault(r["weights_file"].rsplit("/", 1)[-1], []).append(r)
for name, rs in by.items():
    load = lambda k: [r["load_ms"][k] for r in rs]
    mem = lambda k: [r["memory_mb"][k]["total"] for r in rs]
    print(f"node, {name} ({rs[0]['weights_bytes']} bytes): load {med(load('total'))} ms (weights {med(load('weights'))}), memory after load {med(mem('after_load'))}, peak {med([r['memory_mb']['peak_total'] for r in rs])} MiB ({len(rs)} runs)")
PY
