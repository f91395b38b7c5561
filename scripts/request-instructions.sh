#!/usr/bin/env bash
# Instructions per request of the full request path, under callgrind: a
# figure that resolves changes of 1 % where requests/s (scripts/request-path.sh)
# cannot on a noisy machine.
#
# Each server binary (sim executor, a zero-time device, as in
# scripts/request-path.sh) runs under `valgrind --tool=callgrind`; after a
# warm-up the counters are zeroed, wrk POSTs non-streamed 16-token
# completions over 16 connections for DURATION seconds, and the counters are
# dumped: user-space instructions (all threads) over the requests wrk
# completed. The bare axum handler is measured the same way. Targets are
# measured in turn, ROUNDS times; the medians are printed last.
#
#   cargo build --release -p inferscope -p inferscope-server --example bare_axum
#   scripts/request-instructions.sh                          # ROUNDS=2 DURATION=4
#   OLD_BIN=/tmp/inferscope-before scripts/request-instructions.sh
#
# What it does not count: the kernel's work (the TCP path, wake-ups) and the
# cost of an instruction (cache misses, a syscall's time): it is a measure of
# the work the binary does, to be read beside request-path.sh's times. The
# count moves a little with how the load batches (how many tokens a woken
# task finds queued): two runs of one binary differ by up to about 1.5 %.
#
# Needs valgrind (Debian package) and wrk.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-4}
PORT=${PORT:-18320}
# shellcheck source=scripts/request-load.sh
. scripts/request-load.sh
require valgrind callgrind_control wrk taskset

tmp=$(mktemp -d)
vpid=
cleanup() {
  [ -n "$vpid" ] && kill "$vpid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
post_script "$tmp/post.lua" "$BODY"

# "requests instructions-per-request" of one target.
measure() { # name command...
  local name=$1 out n ir
  shift
  valgrind --tool=callgrind --callgrind-out-file="$tmp/$name.cg" "$@" >"$tmp/$name.log" 2>&1 &
  vpid=$!
  for _ in $(seq 300); do
    curl -sf -o /dev/null -X POST -H 'content-type: application/json' -d "$BODY" \
      "127.0.0.1:$PORT/v1/completions" && break
    sleep 0.2
  done
  taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNS" -d2s -s "$tmp/post.lua" \
    "http://127.0.0.1:$PORT/v1/completions" >/dev/null
  callgrind_control -z "$vpid" >/dev/null 2>&1
  out=$(taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNS" -d"$DURATION"s -s "$tmp/post.lua" \
    "http://127.0.0.1:$PORT/v1/completions")
  callgrind_control -d "$vpid" >/dev/null 2>&1
  kill "$vpid"
  wait "$vpid" 2>/dev/null || true
  vpid=
  if grep -qE 'Non-2xx|Socket errors' <<<"$out"; then
    echo "errors in the run of $name:" >&2
    echo "$out" >&2
    exit 1
  fi
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  # The explicit dump is the file with the suffix .1; the one written at
  # exit holds only what ran after it.
  ir=$(awk '/^summary:/ {s += $2} END {print s}' "$tmp/$name.cg.1")
  rm -f "$tmp/$name".cg*
  awk -v n="$n" -v ir="$ir" 'BEGIN {printf "%d %.0f\n", n, ir / n}'
}
serve() { # binary
  echo "$1" serve --executor sim --sim-profile "$PROFILE" --served-model-name m \
    --host 127.0.0.1 --port "$PORT" --disable-log-stats
}

names=(bare new)
declare -A cmd=([bare]="$BARE $PORT" [new]="$(serve "$BIN")")
if [ -n "$OLD_BIN" ]; then
  names+=(old)
  cmd[old]="$(serve "$OLD_BIN")"
fi
declare -A all
printf 'round'
for n in "${names[@]}"; do printf '  %14s' "$n instr/req"; done
echo
for r in $(seq "$ROUNDS"); do
  printf '%5d' "$r"
  for n in "${names[@]}"; do
    # shellcheck disable=SC2086 # the command is a list of words
    read -r _ per < <(measure "$n" ${cmd[$n]})
    all[$n]="${all[$n]:-} $per"
    printf '  %14s' "$per"
  done
  echo
done
median() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
printf 'median'
for n in "${names[@]}"; do printf ' %14s' "$(median "${all[$n]}")"; done
echo
if [ -n "$OLD_BIN" ]; then
  awk -v a="$(median "${all[new]}")" -v b="$(median "${all[old]}")" \
    'BEGIN {printf "new/old: %.3f (%+.1f %%)\n", a / b, (a / b - 1) * 100}'
fi
echo "(user-space instructions per request under callgrind, non-streamed, $CONNS connections," \
  "${DURATION}s runs, wrk on cpu $CLIENT_CPU; new: $BIN${OLD_BIN:+, old: $OLD_BIN})"
