#!/usr/bin/env bash
# Start-up time of `inferscope serve --executor cpu` on one GGUF file, for one or more builds
# side by side: each round starts every binary once (in turn, so drift on a noisy machine hits
# them alike) and times it from the start until /health answers; the medians over the rounds
# come last. CPU time is the server's user and system time until then (/proc/PID/stat): user
# is the repacking itself, system mostly the kernel's faulting-in of fresh pages, which on a
# VM swings with the host's memory.
#
#   scripts/load-time.sh FILE.gguf BIN [BIN...]
#
# Env: ROUNDS (default 10), MODE warm|cold (default warm; cold evicts FILE from the page cache
# first with posix_fadvise DONTNEED), PORT (default 18555), SERVER_ARGS (replaces the default
# flags: 2 threads, a 4096-token context, a 128 MiB f16 KV cache).
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,13p "$0"; exit 2; }
FILE=$1; shift
ROUNDS=${ROUNDS:-10}; MODE=${MODE:-warm}; PORT=${PORT:-18555}
SERVER_ARGS=${SERVER_ARGS:---threads 2 --max-model-len 4096 --kv-cache-dtype float16 --kv-cache-memory 128MiB --no-enable-prefix-caching}
command -v curl >/dev/null || { echo "error: needs curl" >&2; exit 1; }
if curl -s "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
  echo "error: port $PORT is busy" >&2; exit 1
fi
TCK=$(getconf CLK_TCK)
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT

one() { # BIN -> "wall user sys"
  if [ "$MODE" = cold ]; then
    python3 -c "import os,sys;fd=os.open(sys.argv[1],os.O_RDONLY);os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)" "$FILE"
  fi
  local start end pid ut st
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$1" serve --executor cpu --model "$FILE" $SERVER_ARGS --port "$PORT" --disable-log-stats \
    >"$OUT.log" 2>&1 &
  pid=$!
  until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "error: $1 exited; its log:" >&2; tail "$OUT.log" >&2; exit 1; }
    sleep 0.01
  done
  end=$(date +%s.%N)
  read -r ut st < <(awk '{print $14, $15}' "/proc/$pid/stat")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  python3 -c "print(f'{$end - $start:.3f} {$ut / $TCK:.2f} {$st / $TCK:.2f}')"
}

for r in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    line="$bin $(one "$bin")"
    echo "round $r: $line"
    echo "$line" >>"$OUT"
  done
done
python3 - "$OUT" <<'PY'
import collections, statistics as st, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    b, *v = line.split()
    runs[b].append([float(x) for x in v])
print("\n| binary | wall s median (min–max) | user s median | system s median |\n|---|---|---|---|")
for b, v in runs.items():
    col = lambda i: [x[i] for x in v]
    print(f"| {b} | {st.median(col(0)):.2f} ({min(col(0)):.2f}–{max(col(0)):.2f}) | {st.median(col(1)):.2f} | {st.median(col(2)):.2f} |")
PY
