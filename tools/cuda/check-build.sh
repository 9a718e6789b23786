#!/usr/bin/env bash
# The compile check of the `cuda` feature alone, on a machine without a GPU: clippy over the
# whole workspace, every target, with ruri's (and so ruri-candle's) `cuda` feature, warnings
# denied. It runs candle-kernels' nvcc build like a real build does, but links nothing.
#
#   tools/cuda/check-build.sh
#
# In the release profile on purpose: candle-kernels' build-script output (its PTX and static
# kernel library, most of the time of a CUDA build) is then shared with
# tools/cuda/build-test-binary.sh instead of being compiled a second time for dev.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
# shellcheck source=toolkit.sh
source tools/cuda/toolkit.sh
started=$SECONDS
cargo clippy --workspace --all-targets --release --features ruri/cuda -- -D warnings
echo "check-build.sh: clippy --features cuda clean in $((SECONDS - started)) s"
