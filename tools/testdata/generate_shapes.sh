#!/usr/bin/env bash
# Regenerates the Ruri v3 shape recipes and their reference vectors (tools/testdata/shapes.py;
# see testdata/shapes/README.md).
#
#   tools/testdata/generate_shapes.sh            4-layer (CI) recipes, committed:
#                                                testdata/shapes/<size>/, testdata/reference/shapes/
#   tools/testdata/generate_shapes.sh --full     full depth (10/13/19/25 layers), not committed:
#                                                testdata/generated/shapes-full/
#   ... [--sizes 30m,310m]                       only some sizes
#
# Environment:
#   RURI_PYTHON=/path/to/python   use this interpreter instead of <repo>/.venv-testdata
#                                 (made by tools/testdata/generate.sh from requirements.txt)
#   RURI_SHAPES_KEEP_WORK=1       keep the scratch folders with the weights
#                                 (testdata/generated/shapes-work/)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

full=0
sizes=30m,70m,130m,310m
while [[ $# -gt 0 ]]; do
  case "$1" in
    --full) full=1; shift ;;
    --sizes) sizes="$2"; shift 2 ;;
    *) echo "usage: $0 [--full] [--sizes 30m,70m,130m,310m]" >&2; exit 2 ;;
  esac
done

PY="${RURI_PYTHON:-.venv-testdata/bin/python}"
if [[ ! -x "$PY" ]]; then
  echo "$0: no $PY; run tools/testdata/generate.sh once (it makes .venv-testdata) or set RURI_PYTHON" >&2
  exit 1
fi

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
export HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
export PYTHONWARNINGS=ignore

tokenizer=testdata/shapes/tokenizer
if [[ "$full" == 1 ]]; then
  out=testdata/generated/shapes-full
  args=(--full --out-root "$out" --ref-root "$out/reference"
        --command "tools/testdata/generate_shapes.sh --full")
  mkdir -p "$out/tokenizer"
  cp "$tokenizer"/tokenizer.json "$tokenizer"/tokenizer_config.json \
     "$tokenizer"/special_tokens_map.json "$out/tokenizer/"
  work=testdata/generated/shapes-work/full
else
  args=(--out-root testdata/shapes --ref-root testdata/reference/shapes
        --command "tools/testdata/generate_shapes.sh")
  work=testdata/generated/shapes-work/ci
fi
keep=()
[[ -n "${RURI_SHAPES_KEEP_WORK:-}" ]] && keep=(--keep-work)

start=$SECONDS
"$PY" "$here/shapes.py" "${args[@]}" --sizes "$sizes" --work-root "$work" "${keep[@]}" \
  --tokenizer "$tokenizer" --inputs testdata/inputs.json
echo "== shapes done in $((SECONDS - start)) s"
