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
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [[ ! -x "$venv/bin/python" ]]; then
  python="$(command -v python3 || command -v python || true)"
  if [[ -z "$python" ]]; then
    echo "test-python.sh: needs python3 (3.9 or newer, with the venv module)" >&2
    exit 1
  fi
  "$python" -m venv "$venv"
fi
stamp="$venv/.requirements.sha256"
wanted="$(sha256sum "$requirements" | cut -d' ' -f1)"
if [[ "$(cat "$stamp" 2>/dev/null || true)" != "$wanted" ]]; then
  "$venv/bin/python" -m pip install --quiet -r "$requirements"
  echo "$wanted" > "$stamp"
fi

# maturin (from the venv, hence --no-build-isolation and PATH) builds the release wheel;
# --force-reinstall so an unchanged version number still installs the fresh build.
PATH="$venv/bin:$PATH" CARGO_TARGET_DIR="$root/target/python" \
  "$venv/bin/python" -m pip install --quiet --no-build-isolation --no-deps --force-reinstall \
  "$root/ruri-python"

"$venv/bin/python" -m pytest -q "$root/ruri-python/tests" "$@"
