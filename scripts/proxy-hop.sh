#!/usr/bin/env bash
# Where `inferscope proxy` spends the time it adds, hop by hop, from packet
# times on the loopback (tcpdump: no tracer inside the processes). Per
# generation request, one at a time: the client's request → the request
# upstream (inbound hop), the upstream's response head → the client's, the
# upstream's first chunk → the client's (the first token's hop), and the
# client's request → first chunk back; and the upstream's own time from the
# request it got to its head and to its first chunk (the same behind any
# relay unless the relay competes with it for the cores). For this build's
# proxy, another build's (OLD or OLD_PROXY_BIN, optional) and socat (a hop
# with no HTTP: the floor), alternating, ROUNDS times; medians per round.
# Resolves changes of ~5 µs per hop that proxy-ttft.sh cannot (its
# per-round noise is 10-80 µs, with the machine's load).
#
#   cargo build --release -p inferscope
#   scripts/proxy-hop.sh                 # ROUNDS=2 N=300; needs tcpdump (root) and socat
#   OLD=/path/to/other/inferscope scripts/proxy-hop.sh
#   PROXY_BIN=target/release/inferscope-proxy OLD_PROXY_BIN=/path/to/other/inferscope-proxy \
#     scripts/proxy-hop.sh               # standalone proxies (take `proxy`'s flags)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/inferscope}
ROUNDS=${ROUNDS:-2}; N=${N:-300}
T=$(mktemp -d)
"$BIN" serve --executor sim --sim-profile tiny --port 18371 --host 127.0.0.1 --disable-log-stats >"$T/s.log" 2>&1 & S=$!
trap 'kill $S ${A:-} ${B:-} ${X:-} 2>/dev/null; rm -rf "$T"' EXIT
for _ in $(seq 300); do curl -sf 127.0.0.1:18371/health >/dev/null && break; sleep 0.1; done
${PROXY_BIN:-$BIN proxy} --upstream http://127.0.0.1:18371 --port 18372 --host 127.0.0.1 >"$T/a.log" 2>&1 & A=$!
targets="proxy:18372 socat:18374"
if [ -n "${OLD_PROXY_BIN:-}${OLD:-}" ]; then
  ${OLD_PROXY_BIN:-$OLD proxy} --upstream http://127.0.0.1:18371 --port 18373 --host 127.0.0.1 >"$T/b.log" 2>&1 & B=$!
  targets="proxy:18372 old:18373 socat:18374"
fi
socat TCP-LISTEN:18374,fork,reuseaddr,bind=127.0.0.1,nodelay TCP:127.0.0.1:18371,nodelay & X=$!
for port in 18372 ${B:+18373}; do
  for _ in $(seq 300); do curl -sf 127.0.0.1:$port/v1/models >/dev/null && break; sleep 0.1; done
done
for r in $(seq "$ROUNDS"); do
  for t in $targets; do
    n=${t%%:*}; p=${t##*:}
    tcpdump -i lo -n -tt -A -l -s 400 "tcp port $p or tcp port 18371" >"$T/$n.txt" 2>/dev/null & D=$!
    sleep 1
    "$BIN" bench serve --host 127.0.0.1 --port "$p" --num-prompts "$N" --max-concurrency 1 \
      --random-input-len 32 --random-output-len 16 --ignore-eos --seed 7 >/dev/null 2>&1
    sleep 0.5; kill $D; wait $D 2>/dev/null || true
    python3 - "$n" "$r" "$p" "$T/$n.txt" <<'PY'
import re, statistics, sys
name, r, port, path = sys.argv[1:]
up = "18371"
pk, cur = [], None
for line in open(path, errors="replace"):
    m = re.match(r"([\d.]+) IP [\d.]+\.(\d+) > [\d.]+\.(\d+): .* length (\d+)", line)
    if m:
        cur = [float(m[1]), m[2], m[3], int(m[4]), ""]
        pk.append(cur)
    elif cur is not None:
        cur[4] += line
pk = [p for p in pk if p[3] > 0]
hops = {k: [] for k in ("in", "head", "chunk", "total", "up_head", "up_chunk")}
for k, p in enumerate(pk):
    if p[2] != port or "POST /v1/completions" not in p[4]:
        continue
    client, t = p[1], {"A": p[0]}
    upport = None
    for q in pk[k + 1:]:
        if q[2] == port and q[1] == client and "B" not in t:
            t["A"] = q[0]  # the body's packet, when it comes apart from the head
        elif q[2] == up and "POST /v1/completions" in q[4] and "B" not in t:
            t["B"], upport = q[0], q[1]
        elif upport and q[1] == up and q[2] == upport:
            if "C" not in t and "HTTP/1.1" in q[4]:
                t["C"] = q[0]
            if "E" not in t and "data:" in q[4]:
                t["E"] = q[0]
        elif q[1] == port and q[2] == client:
            if "D" not in t and "HTTP/1.1" in q[4]:
                t["D"] = q[0]
            if "data:" in q[4]:
                t["F"] = q[0]
                break
    spans = {"in": "AB", "head": "CD", "chunk": "EF", "total": "AF", "up_head": "BC", "up_chunk": "BE"}
    for hop, (a, b) in spans.items():
        if a in t and b in t:
            hops[hop].append((t[b] - t[a]) * 1e6)
med = {h: statistics.median(v) if v else float("nan") for h, v in hops.items()}
print(f"round {r} {name}: request in -> upstream {med['in']:.1f} us, head {med['head']:.1f}, "
      f"first chunk {med['chunk']:.1f}; request -> first chunk {med['total']:.1f} "
      f"(upstream: request -> head {med['up_head']:.1f}, -> first chunk {med['up_chunk']:.1f}; "
      f"{len(hops['total'])} requests)")
PY
  done
done
