#!/usr/bin/env bash
# Cold start and memory of ruri-server (ruri-server/), as a serverless platform
# sees them: time from exec to the first `GET /ready` 200, then a few requests, then the
# process's resident memory (VmRSS now, VmHWM peak) from /proc.
#
#   tools/bench/serve_cold_start.sh            # 30m-shape model, ort int8
#   MODEL=testdata/tiny PRECISION=fp32 tools/bench/serve_cold_start.sh
#
# Needs the 30m-shape model (tools/testdata/generate.sh 30m), curl, and Linux /proc. The page
# cache is warm after the first run: the figure is exec → ready with the files in memory,
# which is what a platform restarting a container on the same host sees.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

MODEL=${MODEL:-testdata/generated/ruri-v3-30m-shape}
PRECISION=${PRECISION:-int8}
BACKEND=${BACKEND:-ort}
PORT=${PORT:-18733}
URL="http://127.0.0.1:$PORT"

if [[ ! -d $MODEL ]]; then
    echo "no model at $MODEL (make it with: tools/testdata/generate.sh 30m)" >&2
    exit 1
fi
tools/fetch-onnxruntime.sh >/dev/null
cargo build --release --quiet -p ruri-server --bin ruri-server
BIN=target/release/ruri-server

LOG=$(mktemp)
trap 'kill -TERM "${PID:-}" 2>/dev/null || true; rm -f "$LOG"' EXIT

start_ns=$(date +%s%N)
"$BIN" --addr "127.0.0.1:$PORT" --model "$MODEL" --backend "$BACKEND" --precision "$PRECISION" \
    2>"$LOG" &
PID=$!
until [[ $(curl -s -o /dev/null -w '%{http_code}' "$URL/ready" || true) == 200 ]]; do
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "the server exited:" >&2
        cat "$LOG" >&2
        exit 1
    fi
    sleep 0.005
done
ready_ns=$(date +%s%N)
echo "exec -> /ready 200: $(((ready_ns - start_ns) / 1000000)) ms ($BACKEND $PRECISION, $MODEL)"
grep -E 'model ready' "$LOG" | sed 's/^/  server: /'

memory() {
    awk -v what="$1" '/^VmRSS/ {rss = $2} /^VmHWM/ {hwm = $2}
        END {printf "  %s: VmRSS %.1f MB, VmHWM %.1f MB\n", what, rss / 1024, hwm / 1024}' \
        "/proc/$PID/status"
}
memory "after ready"

request() {
    local path=$1 body=$2 what=$3
    curl -s -o /dev/null -w "  $what: HTTP %{http_code} in %{time_total} s\n" \
        -H 'content-type: application/json' -d "$body" "$URL$path"
}
docs=""
for i in $(seq 1 32); do
    docs+="\"検索文書の例その$i: 瑠璃色の石は古くから装飾品に使われてきました。\","
done
request /v1/embeddings '{"input": "瑠璃色はどんな色？", "prompt_name": "query"}' "1 query (OpenAI)"
request /v1/embeddings '{"input": "瑠璃色はどんな色？", "prompt_name": "query"}' "1 query again"
request /embed "{\"inputs\": [${docs%,}], \"prompt_name\": \"document\"}" "32 documents (TEI)"
clients=()
for i in 1 2 3 4 5 6 7 8; do
    request /embed "{\"inputs\": \"今日は晴れです。その$i\"}" "1 short text, 8 at once" &
    clients+=($!)
done
wait "${clients[@]}"
memory "after requests"

kill -TERM "$PID"
wait "$PID" || true
