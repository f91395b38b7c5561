#!/usr/bin/env bash
# What `inferscope proxy` adds: `inferscope bench serve` straight at a sim
# server and through a proxy in front of the same server, alternating,
# ROUNDS times each, so drift on a noisy machine hits both alike. Prints each
# run's p50 TTFT and output throughput, then the medians and the differences.
#
# The default load streams about 1,000 tokens/s: 10 requests/s (Poisson),
# 100 output tokens each, 64-token prompts.
#
#   cargo build --release -p inferscope
#   scripts/proxy-overhead.sh            # ROUNDS=5 N=300 RATE=10 by default
#   PROXY_BIN=target/release/inferscope-proxy scripts/proxy-overhead.sh
#     # the proxy from that binary (takes `proxy`'s flags, no subcommand)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/inferscope}
ROUNDS=${ROUNDS:-5}
N=${N:-300}
RATE=${RATE:-10}
OUT_LEN=${OUT_LEN:-100}
PROFILE=${PROFILE:-h100-llama3-8b}
SERVER_PORT=${SERVER_PORT:-18201}
PROXY_PORT=${PROXY_PORT:-18202}
TMP=$(mktemp -d)

"$BIN" serve --executor sim --sim-profile "$PROFILE" --port "$SERVER_PORT" --host 127.0.0.1 --disable-log-stats >"$TMP/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER ${PROXY:-} 2>/dev/null || true; rm -rf "$TMP"' EXIT
for _ in $(seq 300); do curl -sf "127.0.0.1:$SERVER_PORT/health" >/dev/null && break; sleep 0.1; done
${PROXY_BIN:-$BIN proxy} --upstream "http://127.0.0.1:$SERVER_PORT" --port "$PROXY_PORT" --host 127.0.0.1 >"$TMP/proxy.log" 2>&1 &
PROXY=$!
for _ in $(seq 300); do curl -sf "127.0.0.1:$PROXY_PORT/v1/models" >/dev/null && break; sleep 0.1; done

run() { # port seed name → "p50_ttft_ms output_tok_per_s"
  "$BIN" bench serve --host 127.0.0.1 --port "$1" --num-prompts "$N" --request-rate "$RATE" \
    --random-input-len 64 --random-output-len "$OUT_LEN" --ignore-eos --seed "$2" \
    --save-result --result-dir "$TMP" --result-filename "$3.json" >/dev/null 2>&1
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%.3f %.1f" % (r["median_ttft_ms"], r["output_throughput"]))' "$TMP/$3.json"
}

echo "round  direct p50 TTFT ms  tok/s    proxy p50 TTFT ms  tok/s"
d_ttft=(); d_tput=(); p_ttft=(); p_tput=()
for r in $(seq "$ROUNDS"); do
  # Alternate which goes first; the same seed (same prompts and arrivals) for both.
  if (( r % 2 )); then order="direct proxy"; else order="proxy direct"; fi
  for which in $order; do
    if [ "$which" = direct ]; then read -r t x < <(run "$SERVER_PORT" "$r" "d$r"); d_ttft+=("$t"); d_tput+=("$x"); dr="$t $x"
    else read -r t x < <(run "$PROXY_PORT" "$r" "p$r"); p_ttft+=("$t"); p_tput+=("$x"); pr="$t $x"; fi
  done
  echo "$r      $dr          $pr"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
mdt=$(median "${d_ttft[@]}"); mdx=$(median "${d_tput[@]}"); mpt=$(median "${p_ttft[@]}"); mpx=$(median "${p_tput[@]}")
awk -v dt="$mdt" -v dx="$mdx" -v pt="$mpt" -v px="$mpx" 'BEGIN {
  printf "median  direct: p50 TTFT %.3f ms, %.1f tok/s   proxy: p50 TTFT %.3f ms, %.1f tok/s\n", dt, dx, pt, px
  printf "proxy adds %+.0f us to p50 TTFT and changes output throughput by %+.2f%%\n", (pt - dt) * 1000, (px / dx - 1) * 100 }'
