#!/usr/bin/env bash
# Server CPU time per request: tracing off, on at ratio 0, on at ratio 1.
#
# Three servers (sim executor) run side by side; the traced ones export to a
# local OTLP/HTTP sink (python3, answers 200 to every POST). The same bench
# load goes to each in turn, ROUNDS times, in a rotating order, so drift on
# a noisy machine hits all alike. CPU time is utime + stime of the server
# process from /proc/PID/stat, read before and after each run. Prints each
# round and the medians.
#
#   cargo build --release -p inferscope
#   scripts/tracing-overhead.sh            # ROUNDS=5 N=2000 by default
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/inferscope}
ROUNDS=${ROUNDS:-5}
N=${N:-2000}
PROFILE=${PROFILE:-h100-llama3-8b,t_weights_ms=1,t_prefill_us=2}
TICK=$(getconf CLK_TCK)
SINK_PORT=18110

python3 - "$SINK_PORT" <<'PY' &
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
SINK=$!
serve() {
  "$BIN" serve --executor sim --sim-profile "$PROFILE" --port "$1" --host 127.0.0.1 --disable-log-stats "${@:2}" >/dev/null 2>&1 &
}
serve 18111; OFF=$!
serve 18112 --otlp-traces-endpoint "http://127.0.0.1:$SINK_PORT" --otlp-traces-sample-ratio 0; R0=$!
serve 18113 --otlp-traces-endpoint "http://127.0.0.1:$SINK_PORT" --otlp-traces-sample-ratio 1; R1=$!
trap 'kill $OFF $R0 $R1 $SINK 2>/dev/null || true' EXIT
for p in 18111 18112 18113; do
  for _ in $(seq 100); do curl -sf "localhost:$p/health" >/dev/null && break; sleep 0.1; done
done

cpu() { awk -v t="$TICK" '{printf "%.4f", ($14 + $15) / t}' "/proc/$1/stat"; }
load() {
  "$BIN" bench serve --port "$1" --num-prompts "$N" --max-concurrency 64 \
    --random-input-len 64 --random-output-len 32 --ignore-eos --seed "$2" >/dev/null 2>&1
}
ms() { awk -v a="$1" -v b="$2" -v n="$N" 'BEGIN {printf "%.4f", (b - a) * 1000 / n}'; }

echo "round  off ms/req  ratio-0 ms/req  ratio-1 ms/req"
off_all=(); r0_all=(); r1_all=()
servers=("$OFF:18111" "$R0:18112" "$R1:18113")
for r in $(seq "$ROUNDS"); do
  declare -A got=()
  for k in 0 1 2; do
    pp=${servers[$(( (k + r) % 3 ))]}
    pid=${pp%%:*}; port=${pp##*:}
    c0=$(cpu "$pid"); load "$port" "$r"; c1=$(cpu "$pid")
    got[$pid]=$(ms "$c0" "$c1")
  done
  off_all+=("${got[$OFF]}"); r0_all+=("${got[$R0]}"); r1_all+=("${got[$R1]}")
  echo "$r      ${got[$OFF]}      ${got[$R0]}          ${got[$R1]}"
  unset got
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
m_off=$(median "${off_all[@]}"); m_r0=$(median "${r0_all[@]}"); m_r1=$(median "${r1_all[@]}")
awk -v o="$m_off" -v a="$m_r0" -v b="$m_r1" 'BEGIN {
  printf "median  off %.4f, ratio 0 %.4f (%+.1f%%), ratio 1 %.4f (%+.1f%%) ms/req\n", o, a, (a / o - 1) * 100, b, (b / o - 1) * 100 }'
dropped=$(curl -sf localhost:18113/metrics | grep '^inferscope_trace_spans_dropped_total' || true)
echo "ratio-1 server: ${dropped:-no drop series}"
