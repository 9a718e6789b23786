#!/usr/bin/env bash
# Times one 8,192-token text with the attention prototype (attention-prototype.diff, applied
# to a scratch checkout and built there: see README.md): ruri-native's exact f32 attention,
# bf16 products (RURI_PROTO_BF16=1), bf16 products and the fused softmax (also
# RURI_PROTO_SOFTMAX=1), and fused_int8; ROUNDS rounds (default 7), the order rotated each
# round, each run a fresh process; prints medians [ranges] and per-round ratios.
#   ab-long-text.sh COMPARE_BINARY [ROUNDS]      (run from the repository root)
set -euo pipefail
bin="$1" rounds="${2:-7}"
out=$(mktemp)
sys=(exact bf16 fast fused)
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < 4; i++)); do
    v=${sys[$(((i + r) % 4))]}
    case $v in
      exact) env=() system=native_int8 ;;
      bf16) env=(RURI_PROTO_BF16=1) system=native_int8 ;;
      fast) env=(RURI_PROTO_BF16=1 RURI_PROTO_SOFTMAX=1) system=native_int8 ;;
      fused) env=() system=fused_int8 ;;
    esac
    s=$(env "${env[@]}" "$bin" --systems "$system" --long-text 8192 --repeats 1 2>/dev/null |
      python3 -c "import json, sys; r = json.load(sys.stdin); print(r['seconds'], r['peak_rss_mb'])")
    echo "$r $v $s" >> "$out"
  done
done
python3 - "$out" <<'PY'
import collections, statistics as st, sys
per = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, v, s, m = line.split()
    per[r][v] = (float(s), float(m))
def show(x):
    return f"{st.median(x):.3f} [{min(x):.3f}-{max(x):.3f}]"
for v in ["exact", "bf16", "fast", "fused"]:
    print(f"{v:6} s {show([per[r][v][0] for r in per])}  peak RSS MB {st.median([per[r][v][1] for r in per]):.0f}")
for a, b in [("exact", "fused"), ("bf16", "fused"), ("fast", "fused"), ("bf16", "exact"), ("fast", "exact")]:
    print(f"{a} / {b}: {show([per[r][a][0] / per[r][b][0] for r in per])}")
PY
rm -f "$out"
