#!/usr/bin/env bash
# What one oversized request costs the server: a body whose parameter lists
# multiply work per choice and per token (issue #12, item 1), against a normal
# request of the same shape. Starts a fresh sim server per case so the peak
# RSS (VmHWM) belongs to that request alone; prints status, wall time and RSS.
#
#   cargo build --release -p inferscope
#   scripts/hostile-params.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/inferscope}
PORT=${PORT:-18131}
N=${N:-32}
TMP=$(mktemp -d)
trap 'kill "$SRV" 2>/dev/null || true; rm -rf "$TMP"' EXIT

python3 - "$TMP" "$N" <<'PY'
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
base = {"model": "demo", "prompt": "hello", "max_tokens": 200, "n": n, "ignore_eos": True}
json.dump(base, open(f"{d}/normal.json", "w"))
json.dump({**base, "stop_token_ids": [0] * 2_000_000}, open(f"{d}/stop_token_ids.json", "w"))
json.dump({**base, "stop": ["x" * 100_000] * 60}, open(f"{d}/stop_strings.json", "w"))
# The most the default limits accept (--max-stop-sequences 16,
# --max-stop-sequence-bytes 256, --max-stop-token-ids 256).
json.dump({**base, "stop": [f"{i:03d}" + "x" * 253 for i in range(16)],
           "stop_token_ids": [0] * 256}, open(f"{d}/at_limits.json", "w"))
PY

echo "case              body_bytes  status  seconds  server_rss_peak_mib"
for case in normal stop_token_ids stop_strings at_limits; do
  "$BIN" serve --executor sim --sim-profile tiny --port "$PORT" --host 127.0.0.1 \
    --served-model-name demo --disable-log-stats >/dev/null 2>&1 &
  SRV=$!
  for _ in $(seq 200); do curl -sf "localhost:$PORT/health" >/dev/null && break; sleep 0.05; done
  out=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' "localhost:$PORT/v1/completions" \
    -H 'content-type: application/json' --data-binary @"$TMP/$case.json")
  rss=$(awk '/VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$SRV/status")
  printf '%-17s %10d  %s  %7s  %s\n' "$case" "$(stat -c %s "$TMP/$case.json")" \
    "${out%% *}" "${out##* }" "$rss"
  kill "$SRV"; wait "$SRV" 2>/dev/null || true
done
