#!/usr/bin/env bash
# The full request path against the HTTP ceiling, on one pinned core.
#
# The server (sim executor, a zero-time device) runs pinned to one core, wrk
# to another; wrk POSTs non-streamed 16-token completions
# ({"model":"m","prompt":"hello world","max_tokens":16}) over 16 connections.
# The same load goes to a bare axum handler that answers a canned completion
# (crates/inferscope-server/examples/bare_axum.rs) on the same core, in the
# same run, so the figure that matters is the ratio: requests/s of the server
# over requests/s of the bare handler. With OLD_BIN set, a second server binary
# is measured beside the first (before/after a change). Every target is
# measured once per round, the order rotating each round, so drift on a noisy
# machine hits them alike; the medians over the rounds are printed last.
#
#   cargo build --release -p inferscope -p inferscope-server --example bare_axum
#   scripts/request-path.sh                      # ROUNDS=5 DURATION=6 by default
#   OLD_BIN=/tmp/inferscope-before scripts/request-path.sh
#
# STREAM=1 measures the streamed path instead: the same request with
# "stream": true, answered as SSE (16 chunks and [DONE], chunked encoding);
# wrk counts completed responses. The bare handler still answers its canned
# JSON, so the ratio is to the same ceiling.
#
# Besides requests/s, each run reports the server's CPU time per request
# (user + system time of the whole process, all threads, from /proc, over the
# requests wrk completed) and its ratio to the bare handler's. On a machine
# where other work competes for the server's core, requests/s falls with the
# share of the core the server gets, while CPU time per request barely moves:
# that ratio is the one to quote there. It also reports the process's
# context switches per request (all threads, from /proc): on the one core,
# each is a hand-over between the server's threads or to wrk, a cost the
# bare handler barely pays, and a count the machine's load does not inflate.
#
#   STREAM=1 OLD_BIN=/tmp/inferscope-before scripts/request-path.sh
#
# Needs wrk and taskset. SERVER_CPU and CLIENT_CPU pick the cores (1 and 0).
# Extra server flags: SERVER_ARGS (e.g. "--validation-workers 1"); OLD_ARGS
# adds flags to the second server only, so one binary can be measured against
# itself with a feature off:
#
#   OLD_BIN=target/release/inferscope OLD_ARGS=--disable-console scripts/request-path.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-6}
PORT=${PORT:-18300}
# shellcheck source=scripts/request-load.sh
. scripts/request-load.sh
SERVER_CPU=${SERVER_CPU:-1}
SERVER_ARGS=${SERVER_ARGS:-}
OLD_ARGS=${OLD_ARGS:-}
STREAM=${STREAM:-0}
[ "$STREAM" = 1 ] && BODY='{"model":"m","prompt":"hello world","max_tokens":16,"stream":true}'
require wrk taskset

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
post_script "$tmp/post.lua" "$BODY"

# name:port pairs, in the order first measured; each one's process id.
targets=()
declare -A pid_of
start() { # name port command...
  local name=$1 port=$2
  shift 2
  taskset -c "$SERVER_CPU" "$@" >"$tmp/$name.log" 2>&1 &
  pids+=($!)
  pid_of[$name]=$!
  for _ in $(seq 200); do
    if curl -sf -o /dev/null -X POST -H 'content-type: application/json' \
      -d '{"model":"m","prompt":"hello world","max_tokens":16}' "127.0.0.1:$port/v1/completions"; then
      targets+=("$name:$port")
      return
    fi
    sleep 0.1
  done
  echo "$name did not answer on port $port; its log:" >&2
  cat "$tmp/$name.log" >&2
  exit 1
}
serve() { # name port binary [flags...]
  local name=$1 port=$2 bin=$3
  shift 3
  # shellcheck disable=SC2086 # SERVER_ARGS is a list of flags
  start "$name" "$port" "$bin" serve --executor sim --sim-profile "$PROFILE" --served-model-name m \
    --host 127.0.0.1 --port "$port" --disable-log-stats $SERVER_ARGS "$@"
}
start bare "$PORT" "$BARE" "$PORT"
serve new $((PORT + 1)) "$BIN"
# shellcheck disable=SC2086 # OLD_ARGS is a list of flags
[ -n "$OLD_BIN" ] && serve old $((PORT + 2)) "$OLD_BIN" $OLD_ARGS

# CPU time (user + system, all threads) a process has used, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)
# Context switches (voluntary and not, all threads) a process has made: on
# one shared core each is a hand-over between its threads (or to wrk), and
# unlike CPU time the count does not grow with the machine's load.
switches() { cat /proc/"$1"/task/*/status | awk '/^(non)?voluntary_ctxt_switches/ {n += $2} END {print n}'; }

# "requests/s µs-of-CPU-per-request switches-per-request" of one wrk run; a
# run with errors or non-2xx answers fails.
measure() { # name port seconds
  local out before after sw_before sw_after
  before=$(cpu_ticks "${pid_of[$1]}")
  sw_before=$(switches "${pid_of[$1]}")
  out=$(taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNS" -d"$3"s -s "$tmp/post.lua" \
    "http://127.0.0.1:$2/v1/completions")
  after=$(cpu_ticks "${pid_of[$1]}")
  sw_after=$(switches "${pid_of[$1]}")
  if grep -qE 'Non-2xx|Socket errors' <<<"$out"; then
    echo "errors in the run on port $2:" >&2
    echo "$out" >&2
    exit 1
  fi
  awk -v ticks=$((after - before)) -v tick="$TICK" -v sw=$((sw_after - sw_before)) '
    /requests in/ {n = $1}
    /^Requests\/sec:/ {rps = $2}
    END {printf "%.0f %.2f %.3f\n", rps, ticks / tick * 1e6 / n, sw / n}' <<<"$out"
}
for t in "${targets[@]}"; do measure "${t%%:*}" "${t##*:}" 1 >/dev/null; done # warm-up

names=()
for t in "${targets[@]}"; do names+=("${t%%:*}"); done
declare -A all cpu csw
printf 'round'
for n in "${names[@]}"; do printf '  %9s' "$n req/s"; done
for n in "${names[@]}"; do [ "$n" = bare ] || printf '  %9s' "$n/bare"; done
for n in "${names[@]}"; do printf '  %10s' "$n µs/req"; done
for n in "${names[@]}"; do [ "$n" = bare ] || printf '  %12s' "bare/$n cpu"; done
for n in "${names[@]}"; do printf '  %10s' "$n cs/req"; done
echo
for r in $(seq "$ROUNDS"); do
  k=${#targets[@]}
  declare -A got=() gotcpu=() gotcs=()
  for i in $(seq 0 $((k - 1))); do
    t=${targets[$(((i + r) % k))]}
    read -r rps us cs < <(measure "${t%%:*}" "${t##*:}" "$DURATION")
    got[${t%%:*}]=$rps
    gotcpu[${t%%:*}]=$us
    gotcs[${t%%:*}]=$cs
  done
  printf '%5d' "$r"
  for n in "${names[@]}"; do
    printf '  %9s' "${got[$n]}"
    all[$n]="${all[$n]:-} ${got[$n]}"
    cpu[$n]="${cpu[$n]:-} ${gotcpu[$n]}"
    csw[$n]="${csw[$n]:-} ${gotcs[$n]}"
  done
  for n in "${names[@]}"; do
    [ "$n" = bare ] || awk -v a="${got[$n]}" -v b="${got[bare]}" 'BEGIN {printf "  %9.3f", a / b}'
  done
  for n in "${names[@]}"; do printf '  %10s' "${gotcpu[$n]}"; done
  for n in "${names[@]}"; do
    [ "$n" = bare ] || awk -v a="${gotcpu[$n]}" -v b="${gotcpu[bare]}" 'BEGIN {printf "  %12.3f", b / a}'
  done
  for n in "${names[@]}"; do printf '  %10s' "${gotcs[$n]}"; done
  echo
  unset got gotcpu gotcs
done

median() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
printf 'median'
for n in "${names[@]}"; do printf ' %9s ' "$(median "${all[$n]}")"; done
for n in "${names[@]}"; do
  [ "$n" = bare ] || awk -v a="$(median "${all[$n]}")" -v b="$(median "${all[bare]}")" 'BEGIN {printf "  %9.3f", a / b}'
done
for n in "${names[@]}"; do printf '  %10s' "$(median "${cpu[$n]}")"; done
for n in "${names[@]}"; do
  [ "$n" = bare ] || awk -v a="$(median "${cpu[$n]}")" -v b="$(median "${cpu[bare]}")" 'BEGIN {printf "  %12.3f", b / a}'
done
for n in "${names[@]}"; do printf '  %10s' "$(median "${csw[$n]}")"; done
echo
[ "$STREAM" = 1 ] && mode="streamed" || mode="non-streamed"
echo "($mode, $CONNS connections, ${DURATION}s runs, server on cpu $SERVER_CPU, wrk on cpu $CLIENT_CPU;" \
  "new: $BIN${OLD_BIN:+, old: $OLD_BIN}; ratios are req/s over the bare handler's," \
  "and the bare handler's CPU time per request over the server's)"
