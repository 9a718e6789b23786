#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine: installs the ONNX Runtime library the
# ort tests load (tools/fetch-onnxruntime.sh, idempotent); builds the Python package's wheel
# into a venv and runs its pytest suite (tools/test-python.sh, idempotent: target/venv-python);
# then ruri.ray's tests on a two-node local Ray cluster (tools/test-ray.sh, its own venv:
# target/venv-ray, reusing the wheel build's target/python);
# then `cargo test --workspace` (but ruri-python, the extension module, which pytest tests:
# it would link against libpython), with RURI_TEST_PYTHON set to that venv's python (it has
# huggingface_hub, for the tests that check Python reads ruri's cache).
# Extra arguments go to cargo test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tools/fetch-onnxruntime.sh >/dev/null
tools/test-python.sh
tools/test-ray.sh
export RURI_TEST_PYTHON="$PWD/target/venv-python/bin/python"
cargo test --workspace --exclude ruri-python --all-targets "$@"
cargo test --workspace --exclude ruri-python --doc "$@"
