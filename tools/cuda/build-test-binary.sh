#!/usr/bin/env bash
# Builds the CUDA binaries on a machine WITHOUT a GPU, with the CUDA 13.0 toolkit pieces taken
# from PyPI (tools/cuda/toolkit.sh), and packs them into target-cuda/bundle/ to carry to a lent
# GPU machine (see README.md here):
#   - the library, `cargo build -p ruri-candle --features cuda --release`;
#   - `parity`: the root package's tests/parity.rs (`cuda_*` cases run on Device::Cuda(0));
#   - `gpu_bench`: ruri-candle/examples/gpu_bench, the one GPU command's binary.
#
#   tools/cuda/build-test-binary.sh                       # build + bundle
#   CUDA_COMPUTE_CAP=80 tools/cuda/build-test-binary.sh   # another GPU generation
#
# Needs python3 with pip (or RURI_PYTHON), cargo, cc. Downloads ~680 MB of wheels once into
# target-cuda/toolkit/. The CUDA build has its own target folder (target-cuda/, git-ignored).
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
# shellcheck source=toolkit.sh
source tools/cuda/toolkit.sh
bundle="${RURI_CUDA_BUNDLE:-$CARGO_TARGET_DIR/bundle}"
# The stripped binaries, for running here; the bundle holds them gzipped: each embeds
# candle-kernels' PTX and its sm_90a kernel library (33 MB of .nv_fatbin, registered at
# start-up whether used or not), 55 MB a binary, 110 MB for the two: over the carry limit.
bin="$CARGO_TARGET_DIR/cuda-bin"
# What can be carried to the GPU machine with the working tree.
carry_limit=$((64 * 1024 * 1024))
nvcc --version | tail -2

started=$SECONDS
# The executables' paths come from cargo's JSON messages; diagnostics still print.
artifacts="$CARGO_TARGET_DIR/bundle-artifacts.json"
# One cargo invocation for all three: separate ones unify features differently, and each
# different set of build-dependency features rebuilds candle-kernels (its nvcc work) again.
cargo build --release -p ruri -p ruri-candle --features ruri/cuda,ruri-candle/cuda \
  --lib --test parity --example gpu_bench \
  --message-format=json-render-diagnostics >"$artifacts"
build_s=$((SECONDS - started))

rm -rf "$bundle" "$bin"
mkdir -p "$bundle" "$bin"
"$python" - "$artifacts" "$bin" <<'EOF'
import json, os, shutil, sys
artifacts, dest = sys.argv[1], sys.argv[2]
wanted, found = {"parity", "gpu_bench"}, set()
for line in open(artifacts, encoding="utf-8"):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in wanted:
        shutil.copy(m["executable"], os.path.join(dest, m["target"]["name"]))
        found.add(m["target"]["name"])
if found != wanted:
    sys.exit(f"build-test-binary.sh: no executable for {sorted(wanted - found)} in cargo's output")
EOF
strip "$bin"/*
tar -C "$bin" -cf - parity gpu_bench | gzip -9 >"$bundle/bin.tar.gz"

{
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (uncommitted changes)')"
  echo "CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP, $(nvcc --version | tail -1)"
  echo "cargo build: ${build_s} s"
  echo "shared libraries the binaries need on the GPU machine:"
  for exe in "$bin"/*; do
    echo "  $(basename "$exe"): $(readelf -d "$exe" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
  done
  echo "stripped sizes:"
  (cd "$bin" && ls -l parity gpu_bench | awk '{print "  " $NF ": " $5 " bytes"}')
} >"$bundle/BUILD.txt"
cat "$bundle/BUILD.txt"
ls -la "$bundle"
size=$(du -sb "$bundle" | cut -f1)
echo "bundle: $bundle, $size bytes ($((size / 1024 / 1024)) MiB; carry limit 64 MiB)"
if ((size > carry_limit)); then
  echo "build-test-binary.sh: the bundle is over the 64 MiB carry limit" >&2
  exit 1
fi
