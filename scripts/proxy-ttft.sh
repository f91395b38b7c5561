#!/usr/bin/env bash
# What `inferscope proxy` adds to TTFT, one request at a time: p50 TTFT
# straight at a sim server (`tiny` profile: sub-millisecond TTFT), through a
# byte relay (socat: the cost of the extra hop alone) and through the proxy,
# alternating in each round so drift hits all three alike; then the medians.
#
#   cargo build --release -p inferscope
#   scripts/proxy-ttft.sh                 # ROUNDS=5 N=200 by default; needs socat
#   OLD=/path/to/other/inferscope scripts/proxy-ttft.sh   # adds that binary's proxy
#   PROXY_BIN=target/release/inferscope-proxy scripts/proxy-ttft.sh
#     # the proxy from that binary (takes `proxy`'s flags, no subcommand)
#   OLD_PROXY_BIN=/path/to/other/inferscope-proxy ...   # the other side, standalone
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/inferscope}
ROUNDS=${ROUNDS:-5}; N=${N:-200}
T=$(mktemp -d)
"$BIN" serve --executor sim --sim-profile tiny --port 18301 --host 127.0.0.1 --disable-log-stats >"$T/s.log" 2>&1 & S=$!
trap 'kill $S ${P:-} ${X:-} ${O:-} 2>/dev/null; rm -rf "$T"' EXIT
for _ in $(seq 300); do curl -sf 127.0.0.1:18301/health >/dev/null && break; sleep 0.1; done
${PROXY_BIN:-$BIN proxy} --upstream http://127.0.0.1:18301 --port 18302 --host 127.0.0.1 >"$T/p.log" 2>&1 & P=$!
targets="direct:18301 socat:18305 proxy:18302"
if [ -n "${OLD_PROXY_BIN:-}${OLD:-}" ]; then
  ${OLD_PROXY_BIN:-$OLD proxy} --upstream http://127.0.0.1:18301 --port 18306 --host 127.0.0.1 >"$T/o.log" 2>&1 & O=$!
  targets+=" old:18306"
fi
socat TCP-LISTEN:18305,fork,reuseaddr,bind=127.0.0.1,nodelay TCP:127.0.0.1:18301,nodelay & X=$!
for port in 18302 ${O:+18306}; do
  for _ in $(seq 300); do curl -sf 127.0.0.1:$port/v1/models >/dev/null && break; sleep 0.1; done
done
run() { # port name → p50 TTFT in µs
  "$BIN" bench serve --host 127.0.0.1 --port "$1" --num-prompts "$N" --max-concurrency 1 \
    --random-input-len 32 --random-output-len 16 --ignore-eos --seed 7 \
    --save-result --result-dir "$T" --result-filename "$2.json" >/dev/null 2>&1
  python3 -c 'import json,sys; print("%.1f" % (json.load(open(sys.argv[1]))["median_ttft_ms"] * 1000))' "$T/$2.json"
}
declare -A all
for r in $(seq "$ROUNDS"); do
  line="round $r:"
  for name in $targets; do
    n=${name%%:*}; p=${name##*:}; v=$(run "$p" "$n$r"); all[$n]+="$v "; line+=" $n=${v}us"
  done
  echo "$line"
done
for t in $targets; do n=${t%%:*}
  echo "$n: median p50 TTFT $(printf '%s\n' ${all[$n]} | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') us"
done
