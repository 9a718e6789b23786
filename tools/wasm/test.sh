#!/usr/bin/env bash
# ruri in WebAssembly, end to end: installs the toolchain if missing (setup.sh), builds
# ruri-wasm (build.sh), writes the native x86 int8 engine's vectors for the 30m-shape model
# (ruri-native's wasm_reference example), then runs the node tests (the simd128 kernel
# against JavaScript sums byte for byte; vectors equal to x86's; ruri's int8 file written by
# x86 and by wasm alike and read to the fp32 file's bits; errors), the Worker under
# workerd, and prints the figures of tests/bench.mjs. Needs the 30m-shape model and workload
# (`tools/testdata/generate.sh 30m`, in testdata/generated/; the kernel test alone runs without
# them). `--no-setup` skips setup.sh; `--no-bench` skips the figures (and builds the x86
# example in the dev profile, as CI's `cargo test` does, instead of release).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
setup=1 bench=1
for arg in "$@"; do
  case "$arg" in
    --no-setup) setup=0 ;;
    --no-bench) bench=0 ;;
    *) echo "unknown argument $arg (known: --no-setup, --no-bench)" >&2; exit 2 ;;
  esac
done
[ "$setup" = 1 ] && "$root/tools/wasm/setup.sh"
"$root/tools/wasm/build.sh"

cd "$root/ruri-wasm"
node --test tests/kernel.mjs

model="${RURI_WASM_MODEL:-$root/testdata/generated/ruri-v3-30m-shape}"
reference="${RURI_WASM_REFERENCE:-$root/testdata/generated/reference/ruri-v3-30m-shape.json}"
workload="$root/testdata/generated/bench"
if ! [ -f "$model/model.safetensors" ] || ! [ -f "$reference" ]; then
  echo "no 30m-shape model in $model: run tools/testdata/generate.sh 30m for the parity tests" >&2
  exit 1
fi
x86="$root/target/wasm/x86_int8.json"
mkdir -p "$(dirname "$x86")"
# Release for the figures; without them the dev profile (ruri-native is optimized there too, and
# CI's `cargo test` has built it already): int8 vectors have the same bits either way.
profile=() speed=()
[ "$bench" = 1 ] && profile=(--release) speed=("$workload")
(cd "$root" && cargo run "${profile[@]}" -q -p ruri-native --example wasm_reference -- \
  "$model" "$reference" "$x86" "${speed[@]}")
# ruri's int8 file as x86 writes it: the wasm build's `quantize` must write the same bytes.
int8_file="$root/target/wasm/model.ruri-int8.safetensors"
(cd "$root" && cargo run "${profile[@]}" -q -p ruri-native --example write_int8 -- "$model" "$int8_file")
export RURI_WASM_MODEL="$model" RURI_WASM_REFERENCE="$reference" RURI_WASM_X86="$x86"
node --test tests/parity.mjs
RURI_WASM_INT8_FILE="$int8_file" node --test tests/int8.mjs
(cd worker && { [ -x node_modules/.bin/workerd ] || npm ci --no-audit --no-fund; } && node test.mjs)
[ "$bench" = 1 ] && node --expose-gc tests/bench.mjs
echo "tools/wasm/test.sh: all passed"
