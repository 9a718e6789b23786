#!/usr/bin/env bash
# ruri-server under load: 32, then 256 keep-alive connections on loopback, each sending one
# short query again as soon as it has its answer, for SECONDS; prints answers per second,
# errors, p50/p99 latency and the server's peak resident memory (ruri-server/benches/serve.rs,
# --load). A fresh server process per run.
#
#   tools/bench/serve_load.sh              # the 30m-shape int8 model, else the tiny one
#   SECONDS_EACH=30 CONNECTIONS="16 64" tools/bench/serve_load.sh --threads 1
#   CONNECTIONS=800 SLOW=200 tools/bench/serve_load.sh   # plus 200 slowloris clients
#
# Extra arguments go to every run. Loopback only; every loop is bounded by SECONDS_EACH.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

SECONDS_EACH=${SECONDS_EACH:-20}
CONNECTIONS=${CONNECTIONS:-"32 256"}
# Slowloris clients beside the ordinary ones (headers a byte a second; cut at the server's
# header-read timeout).
SLOW=${SLOW:-0}
# cargo runs a bench in its package's folder: hand it absolute paths.
absolute() { if [[ $1 == /* ]]; then echo "$1"; else echo "$PWD/$1"; fi; }
SHAPE=$(absolute "${SHAPE:-testdata/generated/ruri-v3-30m-shape}")
TINY=$(absolute "${TINY:-testdata/tiny}")

tools/fetch-onnxruntime.sh >/dev/null
nice -n 10 cargo bench --quiet -p ruri-server --bench serve --no-run

if [[ -f $SHAPE/onnx/model_quantized.onnx ]]; then
    model=(--model "$SHAPE" --precision int8)
elif [[ -d $SHAPE ]]; then
    echo "== no int8 file in $SHAPE/onnx: fp32"
    model=(--model "$SHAPE" --precision fp32)
else
    echo "== no 30m-shape model at $SHAPE (tools/testdata/generate.sh 30m): the tiny model"
    model=(--model "$TINY" --precision fp32)
fi
for connections in $CONNECTIONS; do
    cargo bench --quiet -p ruri-server --bench serve -- "${model[@]}" \
        --load "$connections" --slow "$SLOW" --seconds "$SECONDS_EACH" --rounds 1 "$@"
done
