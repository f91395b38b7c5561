#!/usr/bin/env bash
# Memory and restart time against llama.cpp's C++ `llama-server` (issue #36): the same GGUF file
# served by `inferscope serve --executor cpu` and by llama-server with the same context length
# and KV-cache type (f16), one after the other on 127.0.0.1. For each server it reports:
#   - load time from process start to a ready /health, first with the file evicted from the page
#     cache (posix_fadvise DONTNEED: "cold"), then again right after ("warm", the page cache full),
#     their ratio, and the CPU seconds (user + system, all threads) each start used until ready;
#   - resident memory after load and after one request with a PROMPT_TOKENS-token prompt
#     (/proc/PID/status: VmRSS, and its RssAnon and RssFile parts; VmHWM, the peak).
# The load times are one start each: for a cold/warm ratio to quote, use
# scripts/load-time.sh (alternated rounds, medians); single cold starts here have read
# 1.4-1.9 s where load-time's median was 0.94 s on the same machine and file.
# Not part of CI: it needs llama.cpp built (scripts/build-llama-server.sh).
#
#   scripts/memory-compare.sh FILE.gguf
#
# Env knobs:
#   INFERSCOPE_BIN  inferscope binary (default: target/release/inferscope of this checkout)
#   LLAMA_BIN_DIR   directory with llama-server
#                   (default: ${XDG_CACHE_HOME:-$HOME/.cache}/inferscope/llama.cpp/bin)
#   PYTHON          a Python with `gguf` (tests/external's venv has it)
#   CTX             context length of both servers, tokens (default 4096): llama-server's `-c`
#                   with one slot; inferscope's --max-model-len, and a KV cache of exactly
#                   that many tokens (--kv-cache-memory from the file's layer, head and
#                   head-size counts)
#   PROMPT_TOKENS   words in the long prompt, one token each (default 2000)
#   THREADS         compute threads of each server (default 2)
#   PORT            port of the server under test (default 18432); refused if busy
#   SERVERS         which to run, in order (default "inferscope llama-server"; e.g. "inferscope"
#                   to compare two inferscope builds through INFERSCOPE_BIN)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
INFERSCOPE_BIN=${INFERSCOPE_BIN:-$ROOT/target/release/inferscope}
LLAMA_BIN_DIR=${LLAMA_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferscope/llama.cpp/bin}
PYTHON=${PYTHON:-python3}
CTX=${CTX:-4096}
PROMPT_TOKENS=${PROMPT_TOKENS:-2000}
THREADS=${THREADS:-2}
PORT=${PORT:-18432}
SERVERS=${SERVERS:-inferscope llama-server}

die() { echo "error: $*" >&2; exit 1; }
FILE=${1:-}
[ -n "$FILE" ] && [ -s "$FILE" ] || die "usage: $0 FILE.gguf (a GGUF both servers load)"
[ -x "$INFERSCOPE_BIN" ] || die "no inferscope binary at $INFERSCOPE_BIN (cargo build --release -p inferscope, or set INFERSCOPE_BIN)"
for name in $SERVERS; do
  [ "$name" = inferscope ] || [ "$name" = llama-server ] || die "SERVERS: unknown server '$name' (inferscope, llama-server)"
done
[[ " $SERVERS " != *" llama-server "* ]] || [ -x "$LLAMA_BIN_DIR/llama-server" ] || die "no llama-server in $LLAMA_BIN_DIR (run scripts/build-llama-server.sh, or set LLAMA_BIN_DIR)"
"$PYTHON" -c 'import gguf' 2>/dev/null || die "$PYTHON lacks gguf: set PYTHON, e.g. PYTHON=/path/to/venv/bin/python"
for v in CTX PROMPT_TOKENS THREADS PORT; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"
done
command -v curl >/dev/null || die "curl is needed"

# KV bytes per token in f16 (K and V, every layer), and the long prompt: PROMPT_TOKENS words
# that are one piece each in the file's vocabulary ("▁abc" pieces, as llamacpp-compare.sh).
read -r KV_PER_TOKEN PROMPT_JSON < <("$PYTHON" - "$FILE" "$PROMPT_TOKENS" <<'EOF'
import json, random, sys
import gguf
r = gguf.GGUFReader(sys.argv[1])
def field(key):
    f = r.fields[key]
    return f.parts[f.data[0]][0]
arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
layers = int(field(f"{arch}.block_count"))
heads = int(field(f"{arch}.attention.head_count"))
kv_heads = int(field(f"{arch}.attention.head_count_kv"))
hidden = int(field(f"{arch}.embedding_length"))
key = f"{arch}.attention.key_length"
head_dim = int(field(key)) if key in r.fields else hidden // heads
tok = r.fields["tokenizer.ggml.tokens"]
vocab = [bytes(tok.parts[i]).decode() for i in tok.data]
pieces = [t[1:] for t in vocab if len(t) == 4 and t[0] == "\u2581" and t[1:].isalpha() and t[1:].islower()]
if len(pieces) < 1000:
    sys.exit(f"{sys.argv[1]}: only {len(pieces)} '\u2581abc' pieces; use make-llama-gguf.py's vocabulary")
rng = random.Random(36)
prompt = " ".join(rng.choice(pieces) for _ in range(int(sys.argv[2])))
print(2 * layers * kv_heads * head_dim * 2, json.dumps({"prompt": prompt, "max_tokens": 16, "temperature": 0}))
EOF
)
[ -n "$KV_PER_TOKEN" ] || die "could not read $FILE's shape"
OUT=$(mktemp -d "${TMPDIR:-/tmp}/memory-compare-XXXXXX")
printf '%s' "$PROMPT_JSON" >"$OUT/long.json"

SERVER=
stop_server() {
  if [ -n "$SERVER" ]; then
    kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
    SERVER=
  fi
}
trap stop_server EXIT
trap 'stop_server; exit 130' INT TERM
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

evict() {
  "$PYTHON" -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$FILE"
}

# start NAME LOG: starts NAME on FILE; sets LOAD_S to the seconds until /health answered 200.
LOAD_S=
start() {
  local name=$1 log=$2 t0
  port_busy && die "port $PORT is in use (set PORT)"
  t0=$(date +%s.%N)
  if [ "$name" = inferscope ]; then
    # shellcheck disable=SC2086 # CACHE_ARGS is a flag and its value, or nothing
    "$INFERSCOPE_BIN" serve --executor cpu --model "$FILE" --host 127.0.0.1 --port "$PORT" \
      --threads "$THREADS" --max-model-len "$CTX" --max-num-seqs 1 --kv-cache-dtype float16 \
      --kv-cache-memory "$((KV_PER_TOKEN * CTX))" --no-enable-prefix-caching --disable-log-stats \
      $CACHE_ARGS >"$log" 2>&1 &
  else
    "$LLAMA_BIN_DIR/llama-server" -m "$FILE" --host 127.0.0.1 --port "$PORT" -t "$THREADS" -tb "$THREADS" \
      -c "$CTX" --parallel 1 -ctk f16 -ctv f16 --no-cache-prompt --cache-ram 0 --no-webui >"$log" 2>&1 &
  fi
  SERVER=$!
  local i
  for i in $(seq 6000); do
    kill -0 "$SERVER" 2>/dev/null || { SERVER=; die "$name exited while loading: $(tail -n 5 "$log")"; }
    if curl -sf "127.0.0.1:$PORT/health" >/dev/null; then
      LOAD_S=$(echo "$(date +%s.%N) $t0" | awk '{printf "%.2f", $1 - $2}')
      return 0
    fi
    sleep 0.05
  done
  die "$name did not get ready in 300 s: $(tail -n 5 "$log")"
}

# cpu: CPU seconds (user + system) the server has used so far.
cpu() {
  awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$SERVER/stat"
}

# mem: "VmRSS RssAnon RssFile VmHWM" of the server, MiB.
mem() {
  awk '/^(VmRSS|RssAnon|RssFile|VmHWM):/ {v[$1] = $2 / 1024} END {printf "%.0f %.0f %.0f %.0f\n", v["VmRSS:"], v["RssAnon:"], v["RssFile:"], v["VmHWM:"]}' "/proc/$SERVER/status"
}

echo "file: $FILE ($(du -m "$FILE" | cut -f1) MiB); context $CTX tokens, f16 KV ($((KV_PER_TOKEN * CTX / 1048576)) MiB); prompt $PROMPT_TOKENS words; threads $THREADS"
echo "inferscope: $INFERSCOPE_BIN ($("$INFERSCOPE_BIN" --version 2>&1 | head -1)); llama-server: $("$LLAMA_BIN_DIR/llama-server" --version 2>&1 | grep -m1 version || echo '?'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
# A build with the packed-weights cache saves its panels to a directory of this run: the cold
# start is the first ever (it repacks), the warm one maps what it saved.
CACHE_ARGS=
if "$INFERSCOPE_BIN" serve --help | grep -q -- --packed-weights-cache-dir; then
  CACHE_ARGS="--packed-weights-cache-dir $OUT/packed"
fi
echo "| server | load cold s | load warm s | cold / warm | CPU s of the cold, warm load | RSS after load MiB (anon + file) | RSS after the long request MiB (anon + file) | peak RSS MiB | warm start: RSS after load, after the long request MiB (anon + file) | prompt tokens |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for name in $SERVERS; do
  evict
  start "$name" "$OUT/$name-cold.log"
  cold=$LOAD_S
  cold_cpu=$(cpu)
  read -r rss anon file _ < <(mem)
  curl -sf "127.0.0.1:$PORT/v1/completions" -H 'content-type: application/json' -d @"$OUT/long.json" >"$OUT/$name-long.json" ||
    die "$name: the long request failed"
  read -r rss2 anon2 file2 hwm < <(mem)
  used=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens"])' "$OUT/$name-long.json")
  if [ "$name" = inferscope ] && [ -n "$CACHE_ARGS" ]; then
    # Stopped only once the panels are saved for the warm start.
    for _ in $(seq 600); do
      grep -q "saved the packed weights\|could not save the packed weights" "$OUT/$name-cold.log" && break
      sleep 0.1
    done
  fi
  stop_server
  start "$name" "$OUT/$name-warm.log"
  warm=$LOAD_S
  warm_cpu=$(cpu)
  read -r wrss wanon wfile _ < <(mem)
  curl -sf "127.0.0.1:$PORT/v1/completions" -H 'content-type: application/json' -d @"$OUT/long.json" >"$OUT/$name-long-warm.json" ||
    die "$name: the long request to the warm start failed"
  read -r wrss2 wanon2 wfile2 _ < <(mem)
  stop_server
  ratio=$(echo "$cold $warm" | awk '{printf "%.2f", $1 / $2}')
  echo "| $name | $cold | $warm | $ratio | $cold_cpu, $warm_cpu | $rss ($anon + $file) | $rss2 ($anon2 + $file2) | $hwm | $wrss ($wanon + $wfile), $wrss2 ($wanon2 + $wfile2) | $used |"
done
echo
echo "logs and responses: $OUT"
