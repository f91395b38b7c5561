#!/usr/bin/env bash
# The proxy's inbound hop alone: per generation request, the time from the
# read of the client's request to the `writev` of it upstream, under strace,
# for this build's proxy and another's (OLD), alternating, one request at a
# time. Resolves a change of ~30 µs on the way in, which proxy-ttft.sh cannot
# on a loaded machine (its per-round noise is ~90 µs). strace inflates every
# syscall alike in both: compare the two, not the absolute figures.
#
#   cargo build --release -p inferscope            # or: -p inferscope-proxy --bin inferscope-proxy
#   OLD=/path/to/other/inferscope scripts/proxy-hop.sh    # ROUNDS=3 N=60; needs strace
#   PROXY_BIN=target/release/inferscope-proxy OLD=... scripts/proxy-hop.sh
#   OLD_PROXY_BIN=/path/to/other/inferscope-proxy ...   # the other side, standalone
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/inferscope}
OLD_PROXY=${OLD_PROXY_BIN:-${OLD:?set OLD (or OLD_PROXY_BIN) to the build to compare with} proxy}
ROUNDS=${ROUNDS:-3}; N=${N:-60}
T=$(mktemp -d)
"$BIN" serve --executor sim --sim-profile tiny --port 18371 --host 127.0.0.1 --disable-log-stats >"$T/s.log" 2>&1 & S=$!
trap 'kill $S ${A:-} ${B:-} 2>/dev/null; rm -rf "$T"' EXIT
for _ in $(seq 300); do curl -sf 127.0.0.1:18371/health >/dev/null && break; sleep 0.1; done
${PROXY_BIN:-$BIN proxy} --upstream http://127.0.0.1:18371 --port 18372 --host 127.0.0.1 --threads 1 >"$T/a.log" 2>&1 & A=$!
$OLD_PROXY --upstream http://127.0.0.1:18371 --port 18373 --host 127.0.0.1 --threads 1 >"$T/b.log" 2>&1 & B=$!
for port in 18372 18373; do
  for _ in $(seq 300); do curl -sf 127.0.0.1:$port/v1/models >/dev/null && break; sleep 0.1; done
done
for r in $(seq "$ROUNDS"); do
  for x in "proxy:18372:$A" "old:18373:$B"; do
    IFS=: read -r n p pid <<<"$x"
    strace -f -ttt -s 24 -e trace=recvfrom,read,writev -p "$pid" -o "$T/$n.txt" 2>/dev/null & tr=$!
    sleep 0.5
    "$BIN" bench serve --host 127.0.0.1 --port "$p" --num-prompts "$N" --max-concurrency 1 \
      --random-input-len 32 --random-output-len 16 --ignore-eos --seed 7 >/dev/null 2>&1
    kill -INT $tr; wait $tr 2>/dev/null || true
    python3 - "$n" "$r" "$T/$n.txt" <<'PY'
import re, statistics, sys
name, r, path = sys.argv[1:]
read_at, hops = None, []
for line in open(path):
    m = re.match(r'\s*\d+\s+([\d.]+) (\w+)\(\d+, (?:\[\{iov_base=)?"(.{0,30})', line)
    if not m or not m[3].startswith("POST /v1/completions"):
        continue
    if m[2] in ("recvfrom", "read"):
        read_at = float(m[1])
    elif m[2] == "writev" and read_at is not None:
        hops.append((float(m[1]) - read_at) * 1e6)
        read_at = None
print(f"round {r} {name}: request read -> upstream writev median {statistics.median(hops):.0f} us ({len(hops)} requests)")
PY
  done
done
