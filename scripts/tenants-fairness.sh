#!/usr/bin/env bash
# Issue #39's fairness scenario on the sim executor: tenant `b` sends one
# request a second for DURATION seconds (gamma gaps of shape 1000: nearly
# regular) and its TTFT p99 is measured three times, all in one run:
#   1. alone (fair admission, nothing else on the server);
#   2. while tenant `a` keeps INFLIGHT requests in flight, fair admission;
#   3. the same flood under --scheduling-policy fcfs.
# Same shapes for both tenants (IN prompt tokens, OUT generated, ignore_eos).
# With the default `h100-llama3-8b` profile and --max-num-seqs 256, 400 in
# flight leave ~144 waiting: the server is saturated (the script prints the
# waiting gauge during each flooded run, and fails if it is 0).
#
#   cargo build --release -p inferscope
#   scripts/tenants-fairness.sh              # DURATION=30 INFLIGHT=400 IN=512 OUT=128
#   DURATION=10 scripts/tenants-fairness.sh  # a shorter look
#   SERVE_ARGS="--enable-request-log /tmp/r.jsonl" scripts/tenants-fairness.sh
#     # extra `serve` flags (here: each request's queue and prefill times)
# Exits 1 unless b's p99 under the fair flood is at most 2x alone or at most
# a quarter of fcfs (the issue's acceptance). FAIR_POLICY=fcfs runs the
# "fair" leg under fcfs: the check must then fail (a planted bug).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/inferscope}
DURATION=${DURATION:-30}
INFLIGHT=${INFLIGHT:-400}
IN=${IN:-512}
OUT=${OUT:-128}
PROFILE=${PROFILE:-h100-llama3-8b}
# Seconds the flood runs before b starts, so the waiting queue is full.
WARM=${WARM:-5}
PORT=${PORT:-18391}
T=$(mktemp -d)
S=""; A=""
trap 'kill $S $A 2>/dev/null || true; rm -rf "$T"' EXIT
cat >"$T/keys.json" <<'EOF'
{"tenants": [{"name": "a", "key": "key-a"}, {"name": "b", "key": "key-b"}]}
EOF
# The model is named, so no run depends on /v1/models (MODEL= to change it).
common=(--model "${MODEL:-demo}" --host 127.0.0.1 --port "$PORT" --random-input-len "$IN" --random-output-len "$OUT" --ignore-eos)

serve() { # policy
  "$BIN" serve --executor sim --sim-profile "$PROFILE" --api-key-file "$T/keys.json" \
    --scheduling-policy "$1" --host 127.0.0.1 --port "$PORT" --disable-log-stats ${SERVE_ARGS:-} \
    >"$T/serve-$1.log" 2>&1 &
  S=$!
  for _ in $(seq 300); do curl -sf "127.0.0.1:$PORT/health" >/dev/null && return; sleep 0.1; done
  echo "server did not start:"; cat "$T/serve-$1.log"; exit 1
}
unserve() { kill "$S"; wait "$S" 2>/dev/null || true; S=""; }
waiting() { # the waiting gauge now
  curl -sf -H 'Authorization: Bearer key-a' "127.0.0.1:$PORT/metrics" |
    awk '/^inferscope[:_]num_requests_waiting[{]/ {s += $NF} END {print s + 0}'
}
flood() { # a keeps INFLIGHT requests in flight until killed
  OPENAI_API_KEY=key-a "$BIN" bench serve "${common[@]}" --num-prompts $((INFLIGHT * 20)) \
    --max-concurrency "$INFLIGHT" --seed 3 >"$T/a.log" 2>&1 &
  A=$!
  sleep "$WARM"
}
unflood() { kill "$A" 2>/dev/null || true; wait "$A" 2>/dev/null || true; A=""; }
b() { # name → b's TTFT p99 in ms
  OPENAI_API_KEY=key-b "$BIN" bench serve "${common[@]}" --num-prompts "$DURATION" \
    --request-rate 1 --burstiness 1000 --seed 11 \
    --save-result --result-dir "$T" --result-filename "b-$1.json" >"$T/b-$1.log" 2>&1 ||
    { cat "$T/b-$1.log"; exit 1; }
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%.1f" % r["p99_ttft_ms"], "(p50 %.1f, %d ok)" % (r["median_ttft_ms"], r["completed"]))' "$T/b-$1.json"
}
flooded() { # policy → b's TTFT p99 under the flood
  flood
  # Sampled halfway through b's run, in the background.
  (sleep $((DURATION / 2)); echo "$(waiting)" >"$T/waiting-$1") &
  local w=$!
  b "$1"
  wait "$w"
  unflood
}

serve "${FAIR_POLICY:-fair}"
alone=$(b alone)
fair=$(flooded fair)
unserve
serve fcfs
fcfs=$(flooded fcfs)
unserve
echo "tenant b's TTFT p99 (ms), ${DURATION} requests at 1/s, ${IN} in / ${OUT} out, sim ${PROFILE}:"
echo "  alone:                         $alone"
echo "  with a's ${INFLIGHT} in flight, fair: $fair   (waiting mid-run: $(cat "$T/waiting-fair"))"
echo "  with a's ${INFLIGHT} in flight, fcfs: $fcfs   (waiting mid-run: $(cat "$T/waiting-fcfs"))"
for p in fair fcfs; do
  [ "$(cat "$T/waiting-$p")" -gt 0 ] || { echo "not saturated under $p"; exit 1; }
done
python3 - "${alone%% *}" "${fair%% *}" "${fcfs%% *}" <<'EOF'
import sys
alone, fair, fcfs = map(float, sys.argv[1:])
ok = fair <= 2 * alone or fair <= fcfs / 4
print(f"fair/alone {fair / alone:.2f} (<= 2?), fair/fcfs {fair / fcfs:.3f} (<= 0.25?): "
      + ("PASS" if ok else "FAIL"))
sys.exit(0 if ok else 1)
EOF
