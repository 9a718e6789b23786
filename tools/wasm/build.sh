#!/usr/bin/env bash
# Builds ruri-wasm for wasm32-unknown-unknown with simd128 and binds it with wasm-bindgen:
# `pkg/node` (`--target nodejs`) and `pkg/web` (`--target web`, also what a Worker imports)
# under ruri-wasm/. Needs tools/wasm/setup.sh first. Debian's rustc-web builds std for the
# target from source (`-Zbuild-std`, allowed on a stable compiler by RUSTC_BOOTSTRAP); its
# tools go first on the PATH because rustup's ~/.cargo/bin would shadow them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bindgen="${CARGO_HOME:-$HOME/.cargo}/bin/wasm-bindgen"
target_dir="${RURI_WASM_TARGET_DIR:-$root/target/wasm}"
cd "$root/ruri-wasm"
# getrandom (pulled in by the tokenizers crate, never called on ruri's path) needs its wasm
# backend named by cfg as well as by feature.
env PATH="/usr/bin:/bin" RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
  RUSTFLAGS="-C target-feature=+simd128 --cfg getrandom_backend=\"wasm_js\"" \
  CARGO_TARGET_DIR="$target_dir" \
  /usr/bin/cargo build --release -Zbuild-std=std,panic_abort --target wasm32-unknown-unknown
wasm="$target_dir/wasm32-unknown-unknown/release/ruri_wasm.wasm"
rm -rf pkg/node pkg/web
"$bindgen" --target nodejs --out-dir pkg/node "$wasm"
"$bindgen" --target web --out-dir pkg/web "$wasm"
ls -l pkg/node/ruri_wasm_bg.wasm
