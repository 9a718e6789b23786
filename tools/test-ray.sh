#!/usr/bin/env bash
# ruri.ray's tests (ruri-python/tests_ray/): a venv of its own at target/venv-ray (Ray Data is
# ≈ 600 MB installed, so it stays out of target/venv-python and of the wheel's dependencies),
# made once and its pinned requirements reinstalled only when ruri-python/requirements-ray.txt
# changes; the wheel built from source as tools/test-python.sh builds it (maturin release
# build in target/python, which that script has already warmed when tools/test.sh runs both);
# then pytest, which starts a real two-node Ray cluster on this machine (head and worker node,
# one CPU each, own ports and temp dir) and stops it at the end.
# Idempotent; prints nothing but pip's and pytest's output. Extra arguments go to pytest.
#
#   tools/test-ray.sh [-k PATTERN …]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"
venv="$root/target/venv-ray"
requirements="$root/ruri-python/requirements-ray.txt"
source "$root/tools/python-venv.sh"
ruri_venv "$venv" "$requirements"
ruri_wheel "$venv"

# No token authentication (Ray >= 2.5x writes one into ~/.ray) and no usage reports, for a
# cluster that listens on this machine only for the test's length.
RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/ruri-python/tests_ray" "$@"
