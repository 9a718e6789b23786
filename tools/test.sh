#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine: installs the ONNX Runtime library the
# ort tests load (tools/fetch-onnxruntime.sh, idempotent), then `cargo test --workspace`.
# Extra arguments go to cargo test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tools/fetch-onnxruntime.sh >/dev/null
cargo test --workspace --all-targets "$@"
cargo test --workspace --doc "$@"
