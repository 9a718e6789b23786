#!/usr/bin/env bash
# Installs what the WebAssembly build needs, skipping what is already there (see
# ../../../shared/ENVIRONMENT.md, "WebAssembly"): rustup cannot add the wasm32 target on these
# machines, so std is built from source with Debian's `rustc-web` (`-Zbuild-std`), and
# wasm-bindgen-cli is built from crates.io at the version ruri-wasm pins.
set -euo pipefail

packages=(rustc-web cargo-web rust-web-src rust-web-llvm lld-22 wasi-libc)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update
  # lld-22 is needed although rust-web-llvm does not pull it in.
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

# The version ruri-wasm/Cargo.toml pins (`wasm-bindgen = "=…"`): the CLI must match it exactly.
version=$(sed -n 's/^wasm-bindgen = "=\([0-9.]*\)".*/\1/p' "$(dirname "${BASH_SOURCE[0]}")/../../ruri-wasm/Cargo.toml")
bindgen="${CARGO_HOME:-$HOME/.cargo}/bin/wasm-bindgen"
if ! [ -x "$bindgen" ] || [ "$("$bindgen" --version)" != "wasm-bindgen $version" ]; then
  # Built with the host toolchain (rustup's cargo). `--locked` fails on a yanked webpki-roots.
  cargo install wasm-bindgen-cli --version "$version" --no-default-features
fi

command -v node >/dev/null || { echo "node (20 or newer) is needed for the tests" >&2; exit 1; }
echo "wasm toolchain ready: $(/usr/bin/rustc --version), $("$bindgen" --version), node $(node --version)"
