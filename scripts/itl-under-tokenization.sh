#!/usr/bin/env bash
# p99 inter-token latency of 32 concurrent streams while 8 other clients keep
# sending ~8k-token prompts, for one or more server binaries, interleaved.
#
# The server is the sim executor (no model compute: each step just waits its
# modelled time) serving a real byte-level BPE tokenizer (--tokenizer), with
# prefill made free (t_prefill_us=0) so that an 8k-token prompt costs the
# engine almost nothing and what it costs the other streams is the server's
# own work on it: parsing, tokenizing, detokenizing. The 32 streams are
# `inferscope bench serve` (128-token prompts, 256 output tokens each); the 8
# long-prompt clients are a Python loop (stdlib only) sending prompts of
# 8000 random single-token words with max_tokens 1.
#
#   pip install tokenizers && scripts/make-bpe-tokenizer.py /tmp/tok
#   BINS="before/inferscope after/inferscope" ROUNDS=2 \
#     TOKENIZER=/tmp/tok/tokenizer.json scripts/itl-under-tokenization.sh
#
# Prints p50/p99 ITL per run (binary, round) and the medians per binary.
# A BINS entry may carry extra serve flags after `+`, e.g.
# `after/inferscope+--validation-workers+1`.
set -euo pipefail
cd "$(dirname "$0")/.."
BINS=${BINS:-target/release/inferscope}
ROUNDS=${ROUNDS:-2}
TOKENIZER=${TOKENIZER:-/tmp/tok/tokenizer.json}
PROFILE=${PROFILE:-h100-llama3-8b,t_prefill_us=0}
NUM_PROMPTS=${NUM_PROMPTS:-320}
LONG_WORDS=${LONG_WORDS:-8000}
LONG_CLIENTS=${LONG_CLIENTS:-8}
PORT=${PORT:-18201}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
# Stop the long-prompt clients and any server still up, however the script ends.
trap 'touch "$OUT/stop"; kill $(jobs -p) 2>/dev/null || true' EXIT

hammer() {
  # $1 port, $2 stop file, $3 counts file
  python3 - "$1" "$2" "$3" "$LONG_WORDS" "$LONG_CLIENTS" <<'PY'
import http.client, json, os, random, sys, threading
port, stop, counts, nwords, nclients = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
# Words that are one token each (with their leading space) in the BPE of
# scripts/make-bpe-tokenizer.py, so a prompt of N words is N tokens.
WORDS = ("the of and to in is was for on that with as by at from they this which but not are were "
         "had have one all time new first people would there their been has more when will who also "
         "after into other two many some could them than only over most such made state light table "
         "small large long little old good right high early public family system group number part "
         "place case point work line end member car name").split()
ok = [0] * nclients
bad = [0] * nclients
def client(i):
    rng = random.Random(i)
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
    while not os.path.exists(stop):
        prompt = " " + " ".join(rng.choice(WORDS) for _ in range(nwords))
        body = json.dumps({"prompt": prompt, "max_tokens": 1, "ignore_eos": True})
        try:
            conn.request("POST", "/v1/completions", body, {"content-type": "application/json"})
            r = conn.getresponse(); r.read()
            if r.status == 200: ok[i] += 1
            else: bad[i] += 1
        except Exception:
            bad[i] += 1
            conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
threads = [threading.Thread(target=client, args=(i,)) for i in range(nclients)]
for t in threads: t.start()
for t in threads: t.join()
open(counts, "w").write(f"{sum(ok)} {sum(bad)}\n")
PY
}

run_one() {
  # $1 binary, $2 label, $3 round
  local bin=${1%%+*} label=$2 r=$3 flags=()
  [[ "$1" == *+* ]] && IFS=+ read -ra flags <<<"${1#*+}"
  "$bin" serve --executor sim --sim-profile "$PROFILE" --tokenizer "$TOKENIZER" \
    --host 127.0.0.1 --port "$PORT" --disable-log-stats "${flags[@]}" >"$OUT/server-$label-$r.log" 2>&1 &
  local server=$!
  for _ in $(seq 200); do curl -sf "127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
  rm -f "$OUT/stop"
  hammer "$PORT" "$OUT/stop" "$OUT/long-$label-$r.txt" &
  local ham=$!
  sleep 2
  "$bin" bench serve --port "$PORT" --num-prompts "$NUM_PROMPTS" --max-concurrency 32 \
    --random-input-len 128 --random-output-len 256 --ignore-eos --seed "$r" \
    --percentile-metrics itl --metric-percentiles 50,90,99 --disable-tqdm \
    --save-result --result-dir "$OUT" --result-filename "itl-$label-$r.json" >"$OUT/bench-$label-$r.log" 2>&1
  touch "$OUT/stop"; wait "$ham"
  kill "$server"; wait "$server" 2>/dev/null || true
  python3 - "$OUT/itl-$label-$r.json" "$OUT/long-$label-$r.txt" "$1" "$r" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); ok, bad = open(sys.argv[2]).read().split()
print(f"{sys.argv[3]:52} round {sys.argv[4]}  itl p50 {d['p50_itl_ms']:7.2f} ms  p90 {d.get('p90_itl_ms', float('nan')):7.2f} ms  p99 {d['p99_itl_ms']:7.2f} ms  "
      f"completed {d['completed']}  long prompts ok {ok} failed {bad}")
PY
}

read -ra bins <<<"$BINS"
for r in $(seq "$ROUNDS"); do
  for i in "${!bins[@]}"; do
    run_one "${bins[$i]}" "$i" "$r" | tee -a "$OUT/summary.txt"
  done
done
echo "medians of p99 ITL (ms):"
for i in "${!bins[@]}"; do
  python3 - "$OUT" "$i" "${bins[$i]}" <<'PY'
import glob, json, statistics, sys
v = [json.load(open(f))["p99_itl_ms"] for f in glob.glob(f"{sys.argv[1]}/itl-{sys.argv[2]}-*.json")]
p50 = [json.load(open(f))["p50_itl_ms"] for f in glob.glob(f"{sys.argv[1]}/itl-{sys.argv[2]}-*.json")]
print(f"  {sys.argv[3]:52} p99 {statistics.median(v):7.2f}  p50 {statistics.median(p50):7.2f}  ({len(v)} runs)")
PY
done
echo "results in $OUT"
