#!/usr/bin/env bash
# The Python package's tests (ruri-python/): a venv at target/venv-python (made once, its pinned
# requirements reinstalled only when ruri-python/requirements-test.txt changes), the wheel
# built from source with maturin (`pip install ./ruri-python`, release build in its own target
# folder, target/python, so it never waits on the debug build's lock), then pytest.
# Idempotent; prints nothing but pip's and pytest's output. Extra arguments go to pytest.
#
#   tools/test-python.sh [-k PATTERN …]
#
# tools/test.sh runs it before the cargo tests and exports RURI_TEST_PYTHON (this venv's
# python, which has huggingface_hub) to them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"
venv="$root/target/venv-python"
requirements="$root/ruri-python/requirements-test.txt"
source "$root/tools/python-venv.sh"
ruri_venv "$venv" "$requirements"
ruri_wheel "$venv"

"$venv/bin/python" -m pytest -q "$root/ruri-python/tests" "$@"
