#!/usr/bin/env bash
# How many aarch64 instructions one text's int13 attention executes, per variant of its
# products (`portable`, `neon`), counted under qemu-user: there is no ARM machine here, so
# this counts work, not time (an instruction count says nothing of a core's issue width or
# latencies). Deterministic: the same build gives the same counts on any x86 machine.
#
#   tools/cross/aarch64-count.sh [LENGTHS]      (default "12 23": tokens of the text)
#
# The criterion bench `kernels` of ruri-native is cross-built in release (the toolchain of
# tools/cross/aarch64-test.sh, which installs it), and each `attention/text_<len>_int13_<variant>`
# runs once (criterion's --test) under `qemu-aarch64 -cpu max -one-insn-per-tb` (7.2:
# `-singlestep`) with every executed instruction logged (`-d nochain,exec`) but only inside
# the attention's own functions (`-dfilter`: attend_head, int13's and bf16's kernels and the
# NEON tiles; not libc's memcpy/memset, nor the bench's setup). Prints each function's count.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
lengths="${1:-12 23}"
target=aarch64-unknown-linux-gnu
target_dir="${RURI_AARCH64_TARGET_DIR:-$root/target/aarch64}"
qemu="${RURI_QEMU_AARCH64:-/usr/bin/qemu-aarch64}"
sysroot=/usr/aarch64-linux-gnu
[ -x "$qemu" ] && command -v aarch64-linux-gnu-nm >/dev/null || {
  echo "needs the toolchain of tools/cross/aarch64-test.sh (run it once)" >&2
  exit 1
}

build_log="$(mktemp)"
(cd "$root" && env PATH="/usr/bin:/bin" RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 CARGO_INCREMENTAL=0 \
  CARGO_TARGET_DIR="$target_dir" \
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
  /usr/bin/cargo bench -Zbuild-std --target "$target" -p ruri-native --bench kernels --no-run \
  2>"$build_log") || { cat "$build_log" >&2; exit 1; }
# cargo names the executable relative to the workspace when the target folder is inside it.
bench="$(grep -oE "[^ (]*/$target/release/deps/kernels-[0-9a-f]+" "$build_log" | tail -1 || true)"
rm -f "$build_log"
[[ "$bench" == /* ]] || bench="$root/$bench"
[ -x "$bench" ] || { echo "no bench executable found" >&2; exit 1; }

# The attention's functions and their addresses (qemu-user loads a PIE at 0x5500000000).
symbols="$(mktemp)"
aarch64-linux-gnu-nm -C -S "$bench" | grep -E "^[0-9a-f]+ [0-9a-f]+ [tT] (<ruri_native::kernels::(int13|bf16)::Products>::|ruri_native::kernels::(int13|bf16|aarch64_int13)::|ruri_native::attention::|<ruri_native::bench::Attention>::run)" >"$symbols"
filter="$(python3 -c '
import sys
print(",".join("0x%x+0x%x" % (0x5500000000 + int(l.split()[0], 16), int(l.split()[1], 16)) for l in open(sys.argv[1])))
' "$symbols")"

for len in $lengths; do
  for variant in portable neon; do
    echo "== text of $len tokens, 4 heads of 64, int13 products: $variant"
    "$qemu" -cpu max -L "$sysroot" -singlestep -d nochain,exec -dfilter "$filter" -D /dev/stdout \
      "$bench" --test "attention/text_${len}_int13_${variant}\$" 2>/dev/null |
      python3 -c '
import collections, sys
symbols = []
for line in open(sys.argv[1]):
    address, size, _, name = line.rstrip("\n").split(" ", 3)
    symbols.append((0x5500000000 + int(address, 16), int(size, 16), name))
counts = collections.Counter()
for line in sys.stdin:
    if line.startswith("Trace"):
        pc = int(line.split("/")[1], 16)
        counts[next((n for a, s, n in symbols if a <= pc < a + s), "?")] += 1
total = sum(counts.values())
for name, n in counts.most_common():
    print(f"{n:>10,} {100 * n / total:5.1f} %  {name[:100]}")
print(f"{total:>10,}          in all")
' "$symbols"
  done
done
rm -f "$symbols"
