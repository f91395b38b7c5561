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
# Env: ROUNDS (default 10), MODE warm|cold|restart (default warm; cold evicts FILE from the page
# cache first with posix_fadvise DONTNEED), PORT (default 18555), SERVER_ARGS (replaces the
# default flags: 2 threads, a 4096-token context, a 128 MiB f16 KV cache).
#
# Without MODE=restart every start runs with --no-packed-weights-cache (where the build has
# it): warm and cold time the load itself. MODE=restart times what issue #36 asks about: the
# first start ever (FILE evicted, an empty packed-weights cache directory; the server is stopped
# only once it has saved the panels there) and the second start right after it (the file and
# the saved panels in the page cache), and their ratio. A build without the cache starts cold,
# then warm.
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

evict() {
  python3 -c "import os,sys;fd=os.open(sys.argv[1],os.O_RDONLY);os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)" "$FILE"
}

has_cache() { "$1" serve --help | grep -q -- --packed-weights-cache-dir; }

one() { # BIN [CACHE_ARGS [WAIT_SAVED]] -> "wall user sys"
  [ "$MODE" = cold ] && evict
  local start end pid ut st cache_args=${2:-}
  if [ -z "$cache_args" ] && has_cache "$1"; then cache_args=--no-packed-weights-cache; fi
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$1" serve --executor cpu --model "$FILE" $SERVER_ARGS $cache_args --port "$PORT" \
    --disable-log-stats >"$OUT.log" 2>&1 &
  pid=$!
  until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "error: $1 exited; its log:" >&2; tail "$OUT.log" >&2; exit 1; }
    sleep 0.01
  done
  end=$(date +%s.%N)
  read -r ut st < <(awk '{print $14, $15}' "/proc/$pid/stat")
  if [ -n "${3:-}" ]; then
    until grep -q "saved the packed weights\|could not save the packed weights" "$OUT.log"; do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
  fi
  kill "$pid"; wait "$pid" 2>/dev/null || true
  python3 -c "print(f'{$end - $start:.3f} {$ut / $TCK:.2f} {$st / $TCK:.2f}')"
}

# BIN -> one round's figures: "wall user sys"; with MODE=restart the first start's, then the
# second's.
measure() {
  [ "$MODE" = restart ] || { one "$1"; return; }
  local dir args='' wait=''
  dir=$(mktemp -d)
  has_cache "$1" && args="--packed-weights-cache-dir $dir" wait=1
  evict
  # shellcheck disable=SC2086 # wait is one flag or nothing
  echo "$(one "$1" "$args" $wait) $(one "$1" "$args")"
  rm -rf "$dir"
}

for r in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    line="$bin $(measure "$bin")"
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
restart = len(next(iter(runs.values()))[0]) == 6
if restart:
    print("\n| binary | first start s median (min–max) | second start s median (min–max) | first ÷ second, median of the rounds | user s first, second | system s first, second |\n|---|---|---|---|---|---|")
else:
    print("\n| binary | wall s median (min–max) | user s median | system s median |\n|---|---|---|---|")
for b, v in runs.items():
    col = lambda i: [x[i] for x in v]
    m = lambda i: st.median(col(i))
    span = lambda i: f"{m(i):.2f} ({min(col(i)):.2f}–{max(col(i)):.2f})"
    if restart:
        ratio = st.median([x[0] / x[3] for x in v])
        print(f"| {b} | {span(0)} | {span(3)} | {ratio:.2f} | {m(1):.2f}, {m(4):.2f} | {m(2):.2f}, {m(5):.2f} |")
    else:
        print(f"| {b} | {span(0)} | {m(1):.2f} | {m(2):.2f} |")
PY
