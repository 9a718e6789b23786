# Sourced by tools/test-python.sh and tools/test-ray.sh: a venv with pinned test requirements
# and the ruri wheel built from source.
#
#   ruri_venv VENV REQUIREMENTS   makes VENV once (python3's venv module); reinstalls the
#                                 pinned REQUIREMENTS only when that file changed (a stamp)
#   ruri_wheel VENV               builds ruri-python with maturin from VENV (release build in
#                                 target/python, its own folder, so it never waits on the
#                                 debug build's lock) and installs it, fresh, without deps

export PIP_DISABLE_PIP_VERSION_CHECK=1
ruri_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

ruri_venv() {
  local venv="$1" requirements="$2" python stamp wanted
  if [[ ! -x "$venv/bin/python" ]]; then
    python="$(command -v python3 || command -v python || true)"
    if [[ -z "$python" ]]; then
      echo "$(basename "$0"): needs python3 (3.9 or newer, with the venv module)" >&2
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
}

# maturin (from the venv, hence --no-build-isolation and PATH) builds the release wheel;
# --force-reinstall so an unchanged version number still installs the fresh build.
ruri_wheel() {
  local venv="$1"
  PATH="$venv/bin:$PATH" CARGO_TARGET_DIR="$ruri_root/target/python" \
    "$venv/bin/python" -m pip install --quiet --no-build-isolation --no-deps --force-reinstall \
    "$ruri_root/ruri-python"
}
