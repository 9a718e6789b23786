#!/usr/bin/env bash
# The main job on a fresh machine: runs the `ruri` command (ruri-cli) in release mode as
# `ruri embed` with the given arguments: texts on stdin (or --input FILE), JSON lines on stdout
# (or --output FILE).
#
#   echo "瑠璃色はどんな色？" | tools/embed.sh --model cl-nagoya/ruri-v3-30m --task query
#   tools/embed.sh --model cl-nagoya/ruri-v3-30m --input docs.jsonl --output docs.parquet
#
# The default backend is ruri's own engine (native), which needs no ONNX Runtime: nothing is
# installed. With `--backend ort` (an ONNX-only folder such as sirasagi62/ruri-v3-30m-ONNX
# needs it) the ONNX Runtime library is installed first if it is not there yet
# (tools/fetch-onnxruntime.sh).
#
# `--model` takes a folder or a Hugging Face Hub model id (with `--revision`), fetched into the
# Hub's cache (HF_HOME / HF_HUB_CACHE; HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE=1 apply).
# Without `--model`, the committed tiny random-weight test model (its vectors mean nothing).
# Try the Hub without the Hub against the mock: `cargo run -p ruri-testkit --bin hub-mock --
# --port 8765`, then `HF_ENDPOINT=http://127.0.0.1:8765 tools/embed.sh --model ruri-test/tiny`.
# `cargo install --path ruri-cli` puts the same `ruri` on the PATH.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ " $* " == *" --backend ort "* || " $* " == *" --backend=ort "* ]]; then
  "$root/tools/fetch-onnxruntime.sh" >/dev/null
fi
model=()
if [[ " $* " != *" --model "* && " $* " != *" --model="* ]]; then
  echo "note: no --model given; using $root/testdata/tiny, a random-weight TEST model: its vectors mean nothing" >&2
  model=(--model "$root/testdata/tiny")
fi
exec cargo run --quiet --release --manifest-path "$root/Cargo.toml" -p ruri-cli --bin ruri -- \
  embed "${model[@]}" "$@"
