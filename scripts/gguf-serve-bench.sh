#!/usr/bin/env bash
# End-to-end throughput of the cpu executor on one GGUF file, for each
# binary given, one after the other (never at the same time): serve the
# file, drive it with `bench serve` (random dataset, 128 prompt / 64 output
# tokens, --ignore-eos) at concurrency 1 and 8, print output tok/s and p50
# TTFT per run. Compare builds (e.g. main's and a branch's) on the same file:
#
#   scripts/make-llama-gguf.py /tmp/m.gguf --type q8_0     # tests/external venv
#   scripts/gguf-serve-bench.sh /tmp/m.gguf base=/path/to/old/inferscope new=target/release/inferscope
#
# N (prompts at concurrency 1; default 24), N8 (at 8; default 3×N) and PORT are
# environment variables. Not run in CI (it takes minutes).
set -euo pipefail
GGUF=$1; shift
N=${N:-24}; N8=${N8:-$((3 * N))}; PORT=${PORT:-18411}
T=$(mktemp -d)
S=
trap 'if [ -n "$S" ]; then kill "$S" 2>/dev/null || true; fi; rm -rf "$T"' EXIT
for spec in "$@"; do
  name=${spec%%=*}; bin=${spec#*=}
  # Another server on the port would be measured instead of this one.
  if curl -sf "127.0.0.1:$PORT/health" >/dev/null; then echo "port $PORT is in use" >&2; exit 1; fi
  "$bin" serve --executor cpu --model "$GGUF" --port "$PORT" --host 127.0.0.1 \
    --disable-log-stats >"$T/$name.log" 2>&1 & S=$!
  for _ in $(seq 600); do curl -sf "127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
  for c in 1 8; do
    n=$N; [ "$c" = 8 ] && n=$N8
    "$bin" bench serve --host 127.0.0.1 --port "$PORT" --model "$(basename "$GGUF")" --num-prompts "$n" --max-concurrency "$c" \
      --dataset-name random --random-input-len 128 --random-output-len 64 --ignore-eos --seed 7 \
      --save-result --result-dir "$T" --result-filename "$name-c$c.json" >"$T/$name-c$c.txt" 2>&1
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%-6s concurrency %s: %d ok, output %.1f tok/s, TTFT p50 %.0f ms, TPOT p50 %.1f ms" % (sys.argv[2], sys.argv[3], r["completed"], r["output_throughput"], r["median_ttft_ms"], r["median_tpot_ms"]))' \
      "$T/$name-c$c.json" "$name" "$c"
  done
  kill "$S" 2>/dev/null || echo "$name: the server had exited: $(tail -n 3 "$T/$name.log")"; wait "$S" 2>/dev/null || true; S=
done
