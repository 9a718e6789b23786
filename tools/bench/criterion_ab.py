#!/usr/bin/env python3
"""Two or more criterion bench binaries against each other, alternated.

    python3 tools/bench/criterion_ab.py FILTER ROUNDS OLD_BIN NEW_BIN [MORE_BINS…]

Builds of `cargo bench -p ruri-native --bench kernels --no-run` (copy each binary out of
target/release/deps before building the next). Each round runs every binary once on the
benches matching FILTER (a criterion regex, e.g. 'fp32_gemm/(wi|mlp_wo)$'), 1 s each after
0.5 s of warm-up; prints, per bench, the median over the rounds of criterion's median
throughput for each binary, and the last binary's over the first's. A check for kernel
changes on a shared machine, not a replacement for tools/bench/ab.sh's end-to-end rounds.
"""
import re
import statistics
import subprocess
import sys


# Criterion's throughput prefixes: decimal for elements (Kelem/s), binary for bytes (KiB/s).
SCALE = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def scale(unit: str) -> float:
    if unit[:1] not in SCALE:
        return 1.0
    if unit[1:2] == "i":
        return 1024.0 ** ("KMGT".index(unit[0]) + 1)
    return SCALE[unit[0]]


def main() -> None:
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    flt, rounds, bins = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    results: dict[str, dict[str, list[float]]] = {}
    for _ in range(rounds):
        for b in bins:
            args = [b, "--bench", flt, "--measurement-time", "1", "--warm-up-time", "0.5", "--noplot"]
            out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
            name = None
            for line in out.splitlines():
                m = re.match(r"^(\S+/\S+)", line)
                if m and not line.startswith("Benchmarking"):
                    name = m.group(1)
                # The first thrpt line after a bench's name: [low median high]; the change
                # lines that follow carry percentages.
                m = re.search(r"thrpt:\s+\[\S+ \S+ (\S+) (\S+)", line)
                if m and name and "%" not in line:
                    # Criterion picks the prefix per bench and run (Kelem/s, Melem/s, …):
                    # every figure here is in units of the base (elements or bytes) a second.
                    value = float(m.group(1)) * scale(m.group(2))
                    results.setdefault(name, {}).setdefault(b, []).append(value)
                    name = None
    unit = "million elements (or bytes) a second"
    print(f"median over {rounds} rounds ({unit}); columns: {' | '.join(bins)}")
    for name, by_bin in results.items():
        medians = [statistics.median(by_bin[b]) if b in by_bin else float("nan") for b in bins]
        cells = " ".join(f"{m / 1e6:10.4g}" for m in medians)
        print(f"{name:44s} {cells}   last/first {medians[-1] / medians[0]:.3f}")


if __name__ == "__main__":
    main()
