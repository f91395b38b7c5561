#!/usr/bin/env bash
# Device busy fraction of the sim executor with every sequence constrained (issue #37: ≥ 0.95).
#
# The server runs the sim executor with the `h100-llama3-8b` profile and 256 sequences; the
# bench client sends 768 prompts (64 tokens in, up to 128 out, 256 at a time, ignore_eos), each
# constrained by `{"guided_regex": "[a-z ]{120}"}` (MODES=regex), and/or unconstrained
# (MODES=free). A fresh server per run. Per run it prints the bench report's device utilisation
# and, from /metrics deltas over the run, the engine thread's time per step in each phase
# (schedule, execute, postprocess), the device time per step (the part of execute the device
# was busy) and the grammar masks' wall time per constrained step. With
# OLD_BIN, each round runs OLD_BIN then BIN (same order every round), and the medians come last.
#
#   cargo build --release -p inferscope
#   scripts/constrained-busy.sh                          # ROUNDS=4 MODES="free regex"
#   OLD_BIN=/tmp/inferscope-before ROUNDS=8 MODES=regex scripts/constrained-busy.sh
#
# Env: BIN (default target/release/inferscope), OLD_BIN, ROUNDS, MODES, PORT (default 8011),
# SERVER_ARGS (extra server flags). The client runs on the same machine: on a small one it
# competes with the server for the cores, so compare binaries in one run.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/target/release/inferscope}
OLD_BIN=${OLD_BIN:-}
ROUNDS=${ROUNDS:-4}
MODES=${MODES:-free regex}
PORT=${PORT:-8011}
SERVER_ARGS=${SERVER_ARGS:-}

die() { echo "error: $*" >&2; exit 1; }
for b in "$BIN" ${OLD_BIN:+"$OLD_BIN"}; do [ -x "$b" ] || die "no binary at $b"; done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer, got '$ROUNDS'"
for m in $MODES; do [ "$m" = free ] || [ "$m" = regex ] || die "MODES: unknown mode '$m' (free, regex)"; done
command -v curl >/dev/null || die "curl is needed"
! curl -s -o /dev/null "http://127.0.0.1:$PORT/health" || die "port $PORT is in use (set PORT)"

tmp=$(mktemp -d /tmp/constrained-busy-XXXXXX)
SERVER=
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

# run NAME BIN MODE: one server, one bench run; appends a line to $tmp/runs.
run() {
  local name=$1 bin=$2 mode=$3 extra=()
  # shellcheck disable=SC2086
  "$bin" serve --executor sim --sim-profile h100-llama3-8b --max-num-seqs 256 --port "$PORT" \
    --disable-log-stats $SERVER_ARGS >"$tmp/server.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 200); do curl -sf -o /dev/null "http://127.0.0.1:$PORT/health" && break; sleep 0.05; done
  [ "$mode" = regex ] && extra=(--extra-body '{"guided_regex": "[a-z ]{120}"}')
  curl -s "http://127.0.0.1:$PORT/metrics" >"$tmp/before"
  "$bin" bench serve --port "$PORT" --num-prompts 768 --max-concurrency 256 --random-input-len 64 \
    --random-output-len 128 --ignore-eos --scrape-metrics "${extra[@]}" >"$tmp/bench.txt" 2>&1
  curl -s "http://127.0.0.1:$PORT/metrics" >"$tmp/after"
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=
  local busy
  busy=$(awk '/Device utilisation/ {print $NF}' "$tmp/bench.txt")
  [ -n "$busy" ] || { cat "$tmp/bench.txt" >&2; die "the bench run reported no device utilisation"; }
  python3 - "$tmp/before" "$tmp/after" "$name" "$mode" "$busy" <<'PY' | tee -a "$tmp/runs"
import re, sys
def parse(path):
    d = {}
    for line in open(path):
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            d[key] = float(value)
        except ValueError:
            pass
    return d
a, b = parse(sys.argv[1]), parse(sys.argv[2])
def delta(pattern):
    return sum(v - a.get(k, 0.0) for k, v in b.items() if re.search(pattern, k))
def per(name, label=""):
    s = delta(rf"{name}_sum\{{[^}}]*{label}")
    c = delta(rf"{name}_count\{{[^}}]*{label}")
    return 1000 * s / c if c else 0.0, c
phases = [per("engine_step_duration_seconds", f'phase="{p}"')[0] for p in ("schedule", "execute", "postprocess")]
mask, masked = per("grammar_mask_duration_seconds")
steps = delta(r'engine_step_duration_seconds_count\{[^}]*phase="execute"')
device = 1000 * delta(r"device_busy_seconds_total\{") / steps if steps else 0.0
print(sys.argv[3], sys.argv[4], sys.argv[5], *(f"{x:.3f}" for x in phases), f"{device:.3f}",
      f"{mask:.3f}", int(masked))
PY
}

echo "binary mode busy% schedule_ms execute_ms postprocess_ms device_ms mask_ms constrained_steps"
for r in $(seq "$ROUNDS"); do
  for m in $MODES; do
    [ -n "$OLD_BIN" ] && run old "$OLD_BIN" "$m"
    run new "$BIN" "$m"
  done
done
echo
echo "medians over $ROUNDS rounds (load average now $(cut -d' ' -f1-3 /proc/loadavg)):"
python3 - "$tmp/runs" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    runs.setdefault((f[0], f[1]), []).append([float(x) for x in f[2:8]])
print("| binary | mode | busy % (runs) | busy % median | schedule ms | execute ms | postprocess ms "
      "| device ms | mask ms |")
print("|---|---|---|---|---|---|---|---|---|")
for (name, mode), rows in runs.items():
    med = [statistics.median(r[i] for r in rows) for i in range(6)]
    print(f"| {name} | {mode} | {', '.join(f'{r[0]:.1f}' for r in rows)} | **{med[0]:.1f}** | "
          + " | ".join(f"{x:.3f}" for x in med[1:]) + " |")
PY
