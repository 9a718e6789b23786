#!/usr/bin/env bash
# Installs the ONNX Runtime shared library that ruri-ort loads at run time.
#
# It comes from the `onnxruntime` wheel on PyPI (the only place this project's machines can
# reach that ships it): pip downloads the wheel, and the library is unzipped into
#   ${RURI_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ruri}/onnxruntime-<version>/
# which is where ruri-ort looks when neither the builder nor ORT_DYLIB_PATH names one.
# Idempotent: does nothing when the library is already there. Prints the library's path.
set -euo pipefail

version="${ONNXRUNTIME_VERSION:-1.31.1}"
base="${RURI_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ruri}"
dest="$base/onnxruntime-$version"
lib="$dest/libonnxruntime.so.$version"

if [[ -f "$lib" ]]; then
  echo "$lib"
  exit 0
fi

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) platform=manylinux_2_28_x86_64 ;;
  Linux-aarch64) platform=manylinux_2_28_aarch64 ;;
  *) echo "fetch-onnxruntime.sh: no onnxruntime wheel known for $(uname -sm); set ORT_DYLIB_PATH instead" >&2; exit 1 ;;
esac

python="$(command -v python3 || command -v python || true)"
if [[ -z "$python" ]]; then
  echo "fetch-onnxruntime.sh: needs python3 with pip to download the onnxruntime wheel" >&2
  exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# Any CPython tag works: the shared library inside is the same; pinned to one for repeatability.
"$python" -m pip download --quiet --no-deps --only-binary=:all: \
  --platform "$platform" --python-version 3.11 --dest "$tmp" "onnxruntime==$version" >&2
wheel="$(ls "$tmp"/onnxruntime-"$version"-*.whl)"
mkdir -p "$dest"
"$python" - "$wheel" "$dest" "$version" <<'PY'
import sys, zipfile, pathlib
wheel, dest, version = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
name = f"onnxruntime/capi/libonnxruntime.so.{version}"
with zipfile.ZipFile(wheel) as z:
    data = z.read(name)
tmp = dest / (pathlib.Path(name).name + ".part")
tmp.write_bytes(data)
tmp.rename(dest / pathlib.Path(name).name)
PY
echo "$lib"
