#!/usr/bin/env bash
# Regenerates ruri's test models and reference vectors. See testdata/README.md.
#
#   tools/testdata/generate.sh [tiny|30m|all]      (default: tiny)
#
# Environment:
#   RURI_PYTHON=/path/to/python   use this interpreter instead of <repo>/.venv-testdata
#   RURI_TESTDATA_OUT=dir         write tiny/, onnx_variants/ and reference/tiny*.json under dir
#                                 instead of testdata/ (used to check that generation is
#                                 reproducible)
set -euo pipefail

target="${1:-tiny}"
case "$target" in tiny|30m|all) ;; *) echo "usage: $0 [tiny|30m|all]" >&2; exit 2 ;; esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

# One seed for everything random: sentencepiece, the weights, dummy export inputs.
SEED=20241130
GEN=testdata/generated
OUT_ROOT="${RURI_TESTDATA_OUT:-testdata}"

if [[ -n "${RURI_PYTHON:-}" ]]; then
  PY="$RURI_PYTHON"
else
  if [[ ! -x .venv-testdata/bin/python ]]; then
    python3 -m venv .venv-testdata
    .venv-testdata/bin/pip install --quiet --upgrade pip
    .venv-testdata/bin/pip install --quiet -r "$here/requirements.txt"
  fi
  PY=.venv-testdata/bin/python
fi

# Offline and quiet; one tokenizer thread and a fixed hash seed for reproducible runs.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
export HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
export PYTHONWARNINGS=ignore

corpus="$GEN/corpus/corpus.txt"
if [[ ! -s "$corpus" ]]; then
  start=$SECONDS
  "$PY" "$here/build_corpus.py" --cache "$GEN/debcache" --out "$corpus"
  echo "corpus built in $((SECONDS - start)) s"
fi

# build NAME SHAPE VOCAB MODEL_DIR REFERENCE_JSON MODEL_DIR_LABEL [VARIANTS_DIR]
build() {
  local name="$1" shape="$2" vocab="$3" dir="$4" ref="$5" label="$6" variants="${7:-}"
  local start=$SECONDS
  local -a variant_args=()
  echo "== $name: $dir"
  rm -rf "$dir"
  mkdir -p "$dir"
  "$PY" "$here/train_tokenizer.py" --corpus "$corpus" --work-dir "$GEN/tokenizer-$name" \
    --out-dir "$dir" --vocab-size "$vocab" --seed "$SEED" \
    --inputs testdata/inputs.json testdata/hostile_inputs.json
  if [[ -n "$variants" ]]; then
    rm -rf "$variants"
    variant_args=(--variants-dir "$variants")
  fi
  "$PY" "$here/build_model.py" --shape "$shape" --out-dir "$dir" --seed "$SEED" \
    --inputs testdata/inputs.json "${variant_args[@]}"
  if [[ -n "$variants" ]]; then
    variant_args=(--onnx-variants "$variants")
  fi
  "$PY" "$here/make_references.py" --model-dir "$dir" --model-dir-label "$label" \
    --inputs testdata/inputs.json --out "$ref" --seed "$SEED" \
    --command "tools/testdata/generate.sh $name" "${variant_args[@]}"
  echo "== $name done in $((SECONDS - start)) s"
}

if [[ "$target" == tiny || "$target" == all ]]; then
  # tiny also gets testdata/onnx_variants/ (tiny_fp16.onnx, tiny_normalized_opset14.onnx).
  build tiny tiny 8000 "$OUT_ROOT/tiny" "$OUT_ROOT/reference/tiny.json" testdata/tiny \
    "$OUT_ROOT/onnx_variants"
  # The hostile inputs (NUL bytes, controls, lone combining marks, …): docs/hostile-inputs.md.
  "$PY" "$here/make_references.py" --model-dir "$OUT_ROOT/tiny" --model-dir-label testdata/tiny \
    --inputs testdata/hostile_inputs.json --out "$OUT_ROOT/reference/tiny_hostile.json" \
    --seed "$SEED" --command "tools/testdata/generate.sh tiny"
  # What text-embeddings-inference's /tokenize answers (Python's tokenizers), for ruri-server.
  "$PY" "$here/make_token_references.py" --model-dir "$OUT_ROOT/tiny" \
    --model-dir-label testdata/tiny --inputs testdata/inputs.json testdata/hostile_inputs.json \
    --max-chars 300 --out "$OUT_ROOT/reference/tiny_tokens.json"
fi
if [[ "$target" == 30m || "$target" == all ]]; then
  build 30m 30m 102400 "$GEN/ruri-v3-30m-shape" "$GEN/reference/ruri-v3-30m-shape.json" \
    testdata/generated/ruri-v3-30m-shape
fi
