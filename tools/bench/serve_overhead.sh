#!/usr/bin/env bash
# What one request to ruri-server costs over the library: sequential keep-alive requests of one
# short query against the release server on loopback, next to the library embedding the same
# text. Each of ROUNDS rounds starts fresh processes (library and server) and alternates them in
# blocks of 50 calls; prints both sides' p50 and p99 per round, then their medians with the range
# (ruri-server/benches/serve.rs).
#
#   tools/bench/serve_overhead.sh                 # tiny model, then the 30m-shape int8 one
#   ROUNDS=7 REQUESTS=1000 tools/bench/serve_overhead.sh
#   tools/bench/serve_overhead.sh --server-bin /tmp/old-ruri-server   # compare two builds
#
# Extra arguments go to every run. The 30m-shape model (tools/testdata/generate.sh 30m) is
# skipped, with a note, when it is absent. Loopback only; every loop is bounded.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

ROUNDS=${ROUNDS:-5}
REQUESTS=${REQUESTS:-500}
# cargo runs a bench in its package's folder: hand it absolute paths.
absolute() { if [[ $1 == /* ]]; then echo "$1"; else echo "$PWD/$1"; fi; }
TINY=$(absolute "${TINY:-testdata/tiny}")
SHAPE=$(absolute "${SHAPE:-testdata/generated/ruri-v3-30m-shape}")

tools/fetch-onnxruntime.sh >/dev/null
# The bench's build also builds the release ruri-server it starts (CARGO_BIN_EXE_ruri-server).
nice -n 10 cargo bench --quiet -p ruri-server --bench serve --no-run

bench() {
    cargo bench --quiet -p ruri-server --bench serve -- \
        --rounds "$ROUNDS" --requests "$REQUESTS" "$@"
}

echo "== tiny test model, ort fp32"
bench --model "$TINY" --precision fp32 "$@"
if [[ -f $SHAPE/onnx/model_quantized.onnx ]]; then
    echo "== 30m-shape model, ort int8"
    bench --model "$SHAPE" --precision int8 "$@"
elif [[ -d $SHAPE ]]; then
    echo "== 30m-shape model, ort fp32 (no int8 file in $SHAPE/onnx)"
    bench --model "$SHAPE" --precision fp32 "$@"
else
    echo "== no 30m-shape model at $SHAPE (tools/testdata/generate.sh 30m): tiny only"
fi
