#!/usr/bin/env bash
# The main job on a fresh machine: installs ONNX Runtime if needed (tools/fetch-onnxruntime.sh),
# then runs `examples/embed.rs` in release mode with the given arguments, texts on stdin.
#
#   echo "瑠璃色はどんな色？" | tools/embed.sh --task query
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/tools/fetch-onnxruntime.sh" >/dev/null
exec cargo run --quiet --release --manifest-path "$root/Cargo.toml" --example embed -- "$@"
