#!/usr/bin/env bash
# Builds the CUDA parity test (the root package's tests/parity.rs, `cuda_*` cases), ruri-candle's
# loading tests and its throughput bench on a machine WITHOUT a GPU, with the CUDA
# 13.0 toolkit pieces taken from PyPI, and packs them with what they need into
# target/cuda-bundle/ (small enough to carry to a lent GPU machine; see README.md here).
#
#   tools/cuda/build-test-binary.sh            # build + bundle
#   CUDA_COMPUTE_CAP=80 tools/cuda/build-test-binary.sh   # another GPU generation
#
# Needs: python3 with pip (or RURI_PYTHON), cargo. Downloads ~1 GB of wheels once into
# target/cuda-toolkit/ (git-ignored because it is under target/).
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
python="${RURI_PYTHON:-python3}"
toolkit="$root/target/cuda-toolkit"
bundle="$root/target/cuda-bundle"
# The lent H200 has driver 580 (CUDA 13.0): build for sm_90 with CUDA 13.0 so the PTX and the
# libraries' ABI match what the driver accepts.
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"

# CUDA 13.0 pieces, pinned (all published on PyPI by NVIDIA).
packages=(
  "nvidia-cuda-nvcc==13.0.88"     # nvcc, ptxas (candle-kernels compiles .cu → PTX at build time)
  "nvidia-cuda-crt==13.0.88"      # crt/ headers nvcc includes (split out of nvcc in 13.x)
  "nvidia-cuda-cccl==13.0.85"     # cuda/std headers used by cuda_fp16.h / cuda_bf16.h
  "nvidia-cuda-runtime==13.0.96"  # cuda_runtime.h, cuda_fp16.h, cuda_bf16.h, libcudart
  "nvidia-cuda-nvrtc==13.0.88"    # libnvrtc (cudarc links it)
  "nvidia-cublas==13.0.2.14"      # libcublas, libcublasLt (cudarc links them)
  "nvidia-curand==10.4.0.35"      # libcurand (cudarc links it)
)

if [[ ! -f "$toolkit/.done" ]]; then
  rm -rf "$toolkit"
  "$python" -m pip install --quiet --no-deps --target "$toolkit/site" "${packages[@]}"
  # One CUDA_ROOT-shaped tree: bin/, include/, lib64/ gathered from the wheels' nvidia/*/.
  mkdir -p "$toolkit/root/bin" "$toolkit/root/include" "$toolkit/root/lib64"
  for part in "$toolkit"/site/nvidia/*/ "$toolkit"/site/nvidia/cu13/; do
    [[ -d "$part" ]] || continue
    for sub in bin include lib lib64 nvvm; do
      [[ -d "$part/$sub" ]] || continue
      case "$sub" in
        lib|lib64) cp -a "$part/$sub/." "$toolkit/root/lib64/" ;;
        *) cp -a "$part/$sub/." "$toolkit/root/$sub/" 2>/dev/null || cp -a "$part/$sub" "$toolkit/root/" ;;
      esac
    done
  done
  # The wheels ship only versioned sonames (libcublas.so.13); the linker wants libX.so.
  (cd "$toolkit/root/lib64" && for lib in *.so.*; do
     base="${lib%%.so.*}.so"; [[ -e "$base" ]] || ln -s "$lib" "$base"; done)
  # No driver here: link against a stub libcuda.so exporting nothing; the real one is
  # loaded on the GPU machine (symbols resolve there at load time).
  if [[ ! -e "$toolkit/root/lib64/libcuda.so" ]]; then
    echo 'void ruri_cuda_stub(void) {}' > "$toolkit/stub.c"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$toolkit/root/lib64/libcuda.so" "$toolkit/stub.c"
  fi
  chmod +x "$toolkit"/root/bin/* || true
  touch "$toolkit/.done"
fi

export CUDA_ROOT="$toolkit/root" CUDA_PATH="$toolkit/root" CUDA_TOOLKIT_ROOT_DIR="$toolkit/root"
export PATH="$toolkit/root/bin:$PATH"
export LIBRARY_PATH="$toolkit/root/lib64${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$toolkit/root/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# libcuda symbols are resolved on the GPU machine, not here.
export RUSTFLAGS="${RUSTFLAGS:-} -C link-arg=-Wl,--allow-shlib-undefined -C link-arg=-Wl,--unresolved-symbols=ignore-in-shared-libs"
nvcc --version | tail -2

# Test and bench binaries, release (our crate is slow unoptimized).
cargo test -p ruri --features cuda --release --test parity --no-run
cargo test -p ruri-candle --features cuda --release --test loading --no-run
messages="$(cargo test -p ruri --features cuda --release --test parity --no-run --message-format=json 2>/dev/null
  cargo test -p ruri-candle --features cuda --release --test loading --no-run --message-format=json 2>/dev/null)"
cargo bench -p ruri-candle --features cuda --bench throughput --no-run
benches="$(cargo bench -p ruri-candle --features cuda --bench throughput --no-run --message-format=json 2>/dev/null)"

rm -rf "$bundle"
mkdir -p "$bundle/bin"
printf '%s\n%s\n' "$messages" "$benches" |
  "$python" -c '
import json, sys, shutil, os
dest = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("parity", "loading", "throughput"):
        shutil.copy(m["executable"], os.path.join(dest, m["target"]["name"]))
' "$bundle/bin"
strip "$bundle"/bin/* || true
ls -la "$bundle/bin"
du -sh "$bundle"
