#!/usr/bin/env bash
# ruri-native on aarch64, emulated: cross-builds the crate's tests for aarch64-unknown-linux-gnu
# and runs them under qemu-user, so the dotprod and i8mm kernels are tested on x86 machines
# (there is no ARM machine here). Installs what is missing first, all from Debian bookworm's own
# archive:
#
# * std for the target: rustup cannot add targets on these machines, so, as tools/wasm/ does,
#   Debian's rustc-web builds std from source (`-Zbuild-std`, allowed by RUSTC_BOOTSTRAP);
# * the linker and C library: gcc-aarch64-linux-gnu, libc6-dev-arm64-cross;
# * the emulator: qemu-user (bookworm's 7.2, or a newer one already installed).
#
# Then, each under `qemu-aarch64 -cpu max` (FEAT_DotProd and FEAT_I8MM) unless said:
#
# 1. ruri-native's tests on the committed tiny model: the lib's unit tests (the kernel
#    property tests: every available kernel equals the scalar one, int13 attention's NEON
#    tiles equal its definition and portable loops; the linear tests),
#    parity.rs (int8 bits equal on every kernel, batch and thread count; NumPy's reference),
#    kernel_env.rs, with the fastest kernel (i8mm); then the parity tests that
#    take the kernel from RURI_KERNEL again with RURI_KERNEL=dotprod and RURI_KERNEL=scalar.
#    Not shapes.rs (the 310m shape in fp32 takes over ten minutes under qemu) nor stream.rs
#    (the streamed load, which no kernel changes: 2 minutes under qemu);
# 2. the int8 vectors of the committed tiny model (the wasm_reference example) on each
#    aarch64 kernel, compared bit for bit with the same example's on this x86 machine;
# 3. run-time detection on CPUs without the extensions: the lib tests and kernel_env.rs on a
#    Neoverse N1 (dotprod, no i8mm) and a Cortex-A53 (neither), where the missing kernels
#    must be refused, not run.
#
# Debug profile: ruri-native and every dependency are optimized in it (Cargo.toml), so only the
# test harnesses are unoptimized. The figures here are qemu's: they say nothing about the
# speed of an ARM CPU.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
target=aarch64-unknown-linux-gnu
target_dir="${RURI_AARCH64_TARGET_DIR:-$root/target/aarch64}"
start=$(date +%s)

packages=(rustc-web cargo-web rust-web-src gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
# RURI_QEMU_AARCH64: another qemu-aarch64 to run under (a path), else the one on the PATH.
qemu="${RURI_QEMU_AARCH64:-$(command -v qemu-aarch64 || true)}"
[ -n "$qemu" ] || packages+=(qemu-user)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi
qemu="${qemu:-/usr/bin/qemu-aarch64}"
echo "aarch64 toolchain: $(/usr/bin/rustc --version), $(aarch64-linux-gnu-gcc --version | head -1), $("$qemu" --version | head -1)"

sysroot=/usr/aarch64-linux-gnu
# Debian's tools first on the PATH: rustup's ~/.cargo/bin would shadow them.
cross() {
  local cpu="$1"
  shift
  env PATH="/usr/bin:/bin" RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 CARGO_INCREMENTAL=0 \
    CARGO_TARGET_DIR="$target_dir" \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$qemu -cpu $cpu -L $sysroot" \
    "$@"
}
cargo_aarch64() {
  local cpu="$1"
  shift
  (cd "$root" && cross "$cpu" /usr/bin/cargo "$1" -Zbuild-std --target "$target" "${@:2}")
}
tests=(-p ruri-native --lib --test parity --test kernel_env)

step=$(date +%s)
# Every test target and the examples, in one build: a separate `cargo build --example` would
# build std and every dependency a second time (another set of std crates, without `test`).
cargo_aarch64 max test -p ruri-native --no-run
echo "aarch64 build: $(($(date +%s) - step)) s"

step=$(date +%s)
RURI_KERNEL="" cargo_aarch64 max test "${tests[@]}"
echo "aarch64 tests under qemu -cpu max, the fastest kernel: $(($(date +%s) - step)) s"
for kernel in dotprod scalar; do
  step=$(date +%s)
  RURI_KERNEL="$kernel" cargo_aarch64 max test -p ruri-native --test parity -- \
    int8_matches_the_numpy_reference int8_is_within_the_quantization_error from_bytes
  echo "aarch64 parity under qemu -cpu max, RURI_KERNEL=$kernel: $(($(date +%s) - step)) s"
done

# The same vectors as x86's, bit for bit: the example prints f32s that round-trip exactly, so
# equal text is equal bits. The x86 side runs with the host's toolchain and kernel.
out="$target_dir/vectors"
mkdir -p "$out"
model="$root/testdata/tiny" reference="$root/testdata/reference/tiny.json"
(cd "$root" && cargo run -q -p ruri-native --example wasm_reference -- "$model" "$reference" "$out/x86.json")
example="$target_dir/$target/debug/examples/wasm_reference"
items() { sed 's/.*"items":\(\[.*\]\).*/\1/' "$1"; }
for kernel in i8mm dotprod scalar; do
  RURI_KERNEL="$kernel" "$qemu" -cpu max -L "$sysroot" "$example" "$model" "$reference" "$out/$kernel.json"
  grep -q "\"kernel\":\"$kernel\"" "$out/$kernel.json"
  if ! cmp -s <(items "$out/x86.json") <(items "$out/$kernel.json"); then
    echo "aarch64 $kernel: the int8 vectors differ from x86's ($out/x86.json, $out/$kernel.json)" >&2
    exit 1
  fi
  echo "aarch64 $kernel: int8 vectors bit for bit x86's ($(grep -o '"id"' "$out/x86.json" | wc -l) texts)"
done

# Detection: dotprod without i8mm, then neither. kernel_env.rs sets RURI_KERNEL to each
# available kernel and the lib tests run every available one; a kernel detected on a CPU
# without its instruction would die of SIGILL here.
for cpu in neoverse-n1 cortex-a53; do
  step=$(date +%s)
  cargo_aarch64 "$cpu" test -p ruri-native --lib --test kernel_env
  want=scalar
  [ "$cpu" = neoverse-n1 ] && want=dotprod
  for kernel in dotprod i8mm; do
    [ "$kernel" = "$want" ] && continue
    # The typed error (ruri's InvalidOption), not a crash.
    if RURI_KERNEL="$kernel" "$qemu" -cpu "$cpu" -L "$sysroot" "$example" "$model" "$reference" \
      "$out/$cpu.json" 2>"$out/$cpu.err" || ! grep -q "cannot run that int8 kernel" "$out/$cpu.err"; then
      echo "qemu -cpu $cpu: RURI_KERNEL=$kernel was not refused:" >&2
      cat "$out/$cpu.err" >&2
      exit 1
    fi
  done
  RURI_KERNEL="" "$qemu" -cpu "$cpu" -L "$sysroot" "$example" "$model" "$reference" "$out/$cpu.json"
  grep -q "\"kernel\":\"$want\"" "$out/$cpu.json" || { echo "qemu -cpu $cpu: expected $want by default" >&2; exit 1; }
  cmp -s <(items "$out/x86.json") <(items "$out/$cpu.json") || { echo "qemu -cpu $cpu: vectors differ from x86's" >&2; exit 1; }
  echo "qemu -cpu $cpu: detects $want, refuses the others, same vectors: $(($(date +%s) - step)) s"
done

echo "tools/cross/aarch64-test.sh: all passed in $(($(date +%s) - start)) s"
