#!/usr/bin/env bash
# The main job on a fresh machine: installs ONNX Runtime if needed (tools/fetch-onnxruntime.sh),
# then runs `examples/embed.rs` in release mode with the given arguments, texts on stdin.
#
#   echo "瑠璃色はどんな色？" | tools/embed.sh --task query
#   echo "瑠璃色はどんな色？" | tools/embed.sh --model cl-nagoya/ruri-v3-30m --task query
#
# `--model` takes a folder or a Hugging Face Hub model id (with `--revision`), fetched into the
# Hub's cache (HF_HOME / HF_HUB_CACHE; HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE=1 apply). Try
# it without the Hub against the mock: `cargo run -p ruri-testkit --bin hub-mock -- --port 8765`,
# then `HF_ENDPOINT=http://127.0.0.1:8765 tools/embed.sh --model ruri-test/tiny`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/tools/fetch-onnxruntime.sh" >/dev/null
exec cargo run --quiet --release --manifest-path "$root/Cargo.toml" --example embed -- "$@"
