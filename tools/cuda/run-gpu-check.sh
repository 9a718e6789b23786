#!/usr/bin/env bash
# The one GPU command: runs the bundle of tools/cuda/build-test-binary.sh (parity tests on the
# GPU, throughput at 16k–128k-token budgets, single-query latency, peak GPU memory, the copy
# share of a batch) and writes results.json, results.md and parity.log into OUT_DIR.
#
#   tools/cuda/run-gpu-check.sh OUT_DIR                  # on the lent GPU machine (cuda:0)
#   tools/cuda/run-gpu-check.sh OUT_DIR --device cpu     # the same steps on the CPU
#
# Further options go to gpu_bench (--dtypes, --budgets, --texts, --seconds, --shape, --model;
# see ruri-candle/examples/gpu_bench/main.rs). Stopped after 7 min 50 s whatever happens: the
# GPU defaults are sized for about 3 min (an estimate: no GPU has run them yet).
#
# Needs the bundle (target-cuda/bundle/bin.tar.gz, or RURI_CUDA_BUNDLE) and testdata/ of this
# checkout; unpacks the binaries into a temporary folder for the run.
# The binaries link libcuda.so.1 (the driver) and CUDA 13's libcublas.so.13 (with
# libcublasLt.so.13), libcudart.so.13 and libcurand.so.10 (bundle/BUILD.txt lists them): the
# GPU machine's toolkit provides them; on a machine without a GPU the PyPI toolkit of
# build-test-binary.sh (with its stub libcuda) does.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
if [[ $# -lt 1 || "$1" == -* ]]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
out="$1"
shift
bundle="${RURI_CUDA_BUNDLE:-$root/target-cuda/bundle}"
mkdir -p "$out"
export RURI_TESTDATA="${RURI_TESTDATA:-$root/testdata}"

libs=""
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  /usr/local/cuda-13.0/lib64 /usr/local/cuda-13.0/targets/x86_64-linux/lib; do
  [[ -d "$dir" ]] && libs="$libs:$dir"
done
# No CUDA toolkit under /usr/local: the CUDA 13 libraries of the machine's Python packages
# (PyTorch's cu130 wheels put them in site-packages/nvidia/cu13/lib), after the toolkit's.
if command -v python3 >/dev/null; then
  for dir in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    [[ -d "$dir/nvidia/cu13/lib" ]] && libs="$libs:$dir/nvidia/cu13/lib"
  done
fi
# No driver here (a machine without a GPU): the PyPI toolkit's libraries and stub libcuda.
toolkit_lib="$root/target-cuda/toolkit/site/nvidia/cu13/lib"
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' && [[ -d "$toolkit_lib" ]]; then
  libs="$libs:$toolkit_lib:$toolkit_lib/stubs"
fi
export LD_LIBRARY_PATH="${libs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

{
  echo "$ nvidia-smi"
  nvidia-smi 2>&1 || echo "(no nvidia-smi: no GPU driver on this machine)"
  echo
  cat "$bundle/BUILD.txt" 2>/dev/null || echo "(no $bundle/BUILD.txt)"
} >"$out/environment.txt"
head -12 "$out/environment.txt"

[[ -f "$bundle/bin.tar.gz" ]] || {
  echo "run-gpu-check.sh: no $bundle/bin.tar.gz (run tools/cuda/build-test-binary.sh)" >&2
  exit 1
}
bin="$(mktemp -d "${TMPDIR:-/tmp}/ruri-cuda-bin.XXXXXX")"
tar -C "$bin" -xzf "$bundle/bin.tar.gz"
for exe in gpu_bench parity; do
  missing=$(ldd "$bin/$exe" | grep 'not found' || true)
  if [[ -n "$missing" ]]; then
    echo "run-gpu-check.sh: $exe cannot find these libraries (set LD_LIBRARY_PATH):" >&2
    echo "$missing" >&2
    exit 1
  fi
done

status=0
timeout --signal=INT --kill-after=10 470 \
  "$bin/gpu_bench" "$out" --parity "$bin/parity" "$@" || status=$?
rm -rf "$bin"
exit "$status"
