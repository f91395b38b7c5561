#!/usr/bin/env bash
# Server CPU time per request with metrics on versus --disable-metrics.
#
# Two servers (sim executor) run side by side; the same bench load is sent
# to each in turn, ROUNDS times, interleaved, so drift on a noisy machine hits
# both alike. CPU time is utime + stime of the server process from
# /proc/PID/stat, read before and after each run. Prints each round and the
# medians.
#
#   cargo build --release -p inferscope
#   scripts/metrics-overhead.sh            # ROUNDS=5 N=2000 by default
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/inferscope}
ROUNDS=${ROUNDS:-5}
N=${N:-2000}
PROFILE=${PROFILE:-h100-llama3-8b,t_weights_ms=1,t_prefill_us=2}
TICK=$(getconf CLK_TCK)

"$BIN" serve --executor sim --sim-profile "$PROFILE" --port 18101 --host 127.0.0.1 --disable-log-stats >/dev/null 2>&1 &
ON=$!
"$BIN" serve --executor sim --sim-profile "$PROFILE" --port 18102 --host 127.0.0.1 --disable-log-stats --disable-metrics >/dev/null 2>&1 &
OFF=$!
trap 'kill $ON $OFF 2>/dev/null || true' EXIT
for p in 18101 18102; do
  for _ in $(seq 100); do curl -sf "localhost:$p/health" >/dev/null && break; sleep 0.1; done
done

cpu() { awk -v t="$TICK" '{printf "%.4f", ($14 + $15) / t}' "/proc/$1/stat"; }
load() {
  "$BIN" bench serve --port "$1" --num-prompts "$N" --max-concurrency 64 \
    --random-input-len 64 --random-output-len 32 --ignore-eos --seed "$2" >/dev/null 2>&1
}

echo "round  metrics-on ms/req  metrics-off ms/req"
on_all=(); off_all=()
for r in $(seq "$ROUNDS"); do
  # Alternate which server goes first.
  if (( r % 2 )); then order="$ON:18101 $OFF:18102"; else order="$OFF:18102 $ON:18101"; fi
  for pp in $order; do
    pid=${pp%%:*}; port=${pp##*:}
    c0=$(cpu "$pid"); load "$port" "$r"; c1=$(cpu "$pid")
    v=$(awk -v a="$c0" -v b="$c1" -v n="$N" 'BEGIN {printf "%.4f", (b - a) * 1000 / n}')
    if [ "$pid" = "$ON" ]; then on_r=$v; on_all+=("$v"); else off_r=$v; off_all+=("$v"); fi
  done
  echo "$r      $on_r              $off_r"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
m_on=$(median "${on_all[@]}"); m_off=$(median "${off_all[@]}")
awk -v a="$m_on" -v b="$m_off" 'BEGIN {printf "median  %.4f ms/req on, %.4f ms/req off: metrics cost %+.1f%%\n", a, b, (a / b - 1) * 100}'
