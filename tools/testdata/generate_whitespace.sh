#!/usr/bin/env bash
# Whitespace references for the tiny model (see testdata/README.md and the docstring of
# make_whitespace_references.py):
#   testdata/reference/tiny_whitespace_keep.json   sentence-transformers 6.2.0 (.venv-testdata)
#   testdata/reference/tiny_whitespace_strip.json  sentence-transformers 5.3.0 (.venv-testdata-st53)
# on testdata/whitespace_inputs.json (committed; rewrite it with --write-inputs).
#
#   tools/testdata/generate_whitespace.sh [--write-inputs]
#
# Environment:
#   RURI_PYTHON=/path/to/python        instead of <repo>/.venv-testdata (requirements.txt)
#   RURI_PYTHON_ST53=/path/to/python   instead of <repo>/.venv-testdata-st53 (requirements-st53.txt)
#   RURI_TESTDATA_OUT=dir              read tiny/ and write reference/ under dir, not testdata/
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

OUT_ROOT="${RURI_TESTDATA_OUT:-testdata}"
INPUTS=testdata/whitespace_inputs.json
CMD="tools/testdata/generate_whitespace.sh"

# venv NAME REQUIREMENTS: create <repo>/NAME from REQUIREMENTS if missing.
venv() {
  if [[ ! -x "$1/bin/python" ]]; then
    python3 -m venv "$1"
    "$1/bin/pip" install --quiet --upgrade pip
    "$1/bin/pip" install --quiet -r "$2"
  fi
}
if [[ -n "${RURI_PYTHON:-}" ]]; then PY="$RURI_PYTHON"; else
  venv .venv-testdata "$here/requirements.txt"; PY=.venv-testdata/bin/python; fi
if [[ -n "${RURI_PYTHON_ST53:-}" ]]; then PY53="$RURI_PYTHON_ST53"; else
  venv .venv-testdata-st53 "$here/requirements-st53.txt"; PY53=.venv-testdata-st53/bin/python; fi

# Offline and quiet; one tokenizer thread and a fixed hash seed for reproducible runs.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
export HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
export PYTHONWARNINGS=ignore

if [[ "${1:-}" == --write-inputs ]]; then
  "$PY" "$here/make_whitespace_references.py" --write-inputs "$INPUTS"
fi

# run PYTHON BEHAVIOUR
run() {
  "$1" "$here/make_whitespace_references.py" --model-dir "$OUT_ROOT/tiny" \
    --model-dir-label testdata/tiny --inputs "$INPUTS" --behaviour "$2" \
    --out "$OUT_ROOT/reference/tiny_whitespace_$2.json" --command "$CMD"
}
run "$PY" keep
run "$PY53" strip
for py in "$PY" "$PY53"; do
  "$py" "$here/make_whitespace_references.py" --model-dir "$OUT_ROOT/tiny" --compare \
    "$OUT_ROOT/reference/tiny_whitespace_keep.json" "$OUT_ROOT/reference/tiny_whitespace_strip.json"
done
