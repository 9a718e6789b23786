#!/usr/bin/env bash
# Search recall of binary and int8 indexes (sentence-transformers' quantize_embeddings, as
# `ruri embed --quantize` writes them) against exact float32 search, on the benchmark workload:
# the 30m shape's documents and queries (tools/bench/make_workload.py), embedded by the native
# engine (fp32) with the document and query prompts. Prints tools/bench/quantized_recall.py's
# table. A random-weight model: this measures how well the quantized index keeps float32's
# ranking of these vectors, not retrieval quality.
#
#   tools/bench/quantized_recall.sh [MODEL_DIR] [WORKLOAD_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
model="${1:-$root/testdata/generated/ruri-v3-30m-shape}"
workload="${2:-$root/testdata/generated/bench}"
python="${PYTHON:-$root/.venv-testdata/bin/python}"
out="${RECALL_DIR:-$(mktemp -d)}"
[[ -n "${RECALL_DIR:-}" ]] || trap 'rm -rf "$out"' EXIT
cargo build --quiet --release --manifest-path "$root/Cargo.toml" -p ruri-cli --bin ruri
ruri="$root/target/release/ruri"
common=(--model "$model" --backend native --precision fp32 --quiet)
"$ruri" embed "${common[@]}" --task document --input "$workload/documents.jsonl" --output "$out/docs.npy"
"$ruri" embed "${common[@]}" --task document --input "$workload/documents.jsonl" --output "$out/docs-ubinary.npy" --quantize ubinary
"$ruri" embed "${common[@]}" --task document --input "$workload/documents.jsonl" --output "$out/docs-int8.npy" --quantize int8
"$ruri" embed "${common[@]}" --task query --input "$workload/queries.jsonl" --output "$out/queries.npy"
"$ruri" embed "${common[@]}" --task query --input "$workload/queries.jsonl" --output "$out/queries-ubinary.npy" --quantize ubinary
"$python" "$root/tools/bench/quantized_recall.py" "$out"
