#!/usr/bin/env bash
# Side by side against llama.cpp's C++ `llama-server` (issue #18): the same random-weight Llama
# GGUF in each format, served by inferscope (`--executor cpu`) and then by llama-server
# (continuous batching, --parallel 8), one after the other on 127.0.0.1, both driven by
# `inferscope bench serve` with the same prompts (128 tokens) and 64 output tokens
# (`--ignore-eos`), at concurrency 1 and 8. Prints a markdown table of output tok/s and TTFT
# p50 per format and concurrency, with the ratios (and with RUNS > 1 the median ratio over the
# rounds), and checks that both servers give the same greedy text. Not part of CI: it needs llama.cpp built (scripts/build-llama-server.sh).
#
#   scripts/build-llama-server.sh                 # once, minutes
#   scripts/llamacpp-compare.sh                   # all five formats, both concurrencies
#   N1=2 N8=8 FORMATS="f32 q8_0" scripts/llamacpp-compare.sh    # a quick run
#
# Env knobs:
#   INFERSCOPE_BIN  inferscope binary (default: target/release/inferscope of this checkout)
#   LLAMA_BIN_DIR   directory with llama-server and llama-quantize
#                   (default: ${XDG_CACHE_HOME:-$HOME/.cache}/inferscope/llama.cpp/bin)
#   PYTHON          a Python with `numpy` and `gguf` (tests/external's venv has both)
#   WORK            where the GGUF files and prompts are kept between runs
#                   (default: ${TMPDIR:-/tmp}/inferscope-llamacpp)
#   FORMATS         subset of "f32 f16 q8_0 q4_k_m q6_k" (the default: all) and "iq4_xs" (not in
#                   the default) for the Llama file,
#                   and/or model families at Q4_K_M (issue #35): "qwen3 gemma3 gemma2 phi3
#                   qwen3moe mixtral" (`all-families` for the six), each a random-weight file of
#                   tests/external/tiny_families.py's `bench` shape (the Llama file's sizes;
#                   the mixtures of experts 8 experts of width 512, 2 per token), in F16 and
#                   then quantized by llama-quantize
#   N1, N8          prompts at concurrency 1 and 8 (default 8 and 24)
#   RUNS            repeat the whole comparison (default 1); odd runs start each format
#                   with inferscope, even runs with llama-server
#   THREADS         compute threads of each server (default 2: RAYON_NUM_THREADS / -t, -tb)
#   LLAMA_OMP_WAIT_POLICY  OMP_WAIT_POLICY of llama-server (default PASSIVE; empty: llama.cpp's
#                   own default, spinning). On a machine shared with other work, spinning OpenMP
#                   threads lose their core and decode was 3.6x slower (197 vs 55 ms/token, F32,
#                   2 threads, load average 5); on an idle machine spinning may be faster.
#   INFERSCOPE_ARGS extra flags for `inferscope serve` (word-split), e.g. another step token
#                   budget than the cpu default of 256: "--max-num-batched-tokens 8192"
#   PORT            port of the server under test (default 18431); refused if busy
#   OUT             where results are written (default: a new directory under WORK)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
INFERSCOPE_BIN=${INFERSCOPE_BIN:-$ROOT/target/release/inferscope}
LLAMA_BIN_DIR=${LLAMA_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferscope/llama.cpp/bin}
PYTHON=${PYTHON:-python3}
WORK=${WORK:-${TMPDIR:-/tmp}/inferscope-llamacpp}
FORMATS=${FORMATS:-f32 f16 q8_0 q4_k_m q6_k}
FAMILIES="qwen3 gemma3 gemma2 phi3 qwen3moe mixtral"
FORMATS=${FORMATS//all-families/$FAMILIES}
N1=${N1:-8}
N8=${N8:-24}
RUNS=${RUNS:-1}
THREADS=${THREADS:-2}
LLAMA_OMP_WAIT_POLICY=${LLAMA_OMP_WAIT_POLICY-PASSIVE}
PORT=${PORT:-18431}
IN_LEN=128
OUT_LEN=64

die() { echo "error: $*" >&2; exit 1; }
[ -x "$INFERSCOPE_BIN" ] || die "no inferscope binary at $INFERSCOPE_BIN (cargo build --release -p inferscope, or set INFERSCOPE_BIN)"
for b in llama-server llama-quantize; do
  [ -x "$LLAMA_BIN_DIR/$b" ] || die "no $b in $LLAMA_BIN_DIR (run scripts/build-llama-server.sh, or set LLAMA_BIN_DIR)"
done
"$PYTHON" -c 'import gguf, numpy' 2>/dev/null ||
  die "$PYTHON lacks numpy/gguf: set PYTHON, e.g. PYTHON=/path/to/.venv-external/bin/python"
for f in $FORMATS; do
  case " f32 f16 q8_0 q4_k_m q6_k iq4_xs $FAMILIES " in *" $f "*) ;; *) die "unknown format '$f' in FORMATS (f32 f16 q8_0 q4_k_m q6_k iq4_xs $FAMILIES all-families)" ;; esac
done
for v in N1 N8 RUNS THREADS PORT; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"
done
command -v curl >/dev/null || die "curl is needed"

mkdir -p "$WORK"
OUT=${OUT:-$(mktemp -d "$WORK/run-XXXXXX")}
mkdir -p "$OUT"
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

# ---- the files: F32 from make-llama-gguf.py, the rest quantized from it by llama-quantize
F32="$WORK/llama-f32.gguf"
if [ ! -s "$F32" ]; then
  echo "== writing $F32"
  "$PYTHON" "$ROOT/scripts/make-llama-gguf.py" "$F32.tmp" --type f32 && mv "$F32.tmp" "$F32"
fi
is_family() { case " $FAMILIES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
gguf_of() { if is_family "$1"; then echo "$WORK/$1-q4_k_m.gguf"; else echo "$WORK/llama-$1.gguf"; fi; }
for f in $FORMATS; do
  [ "$f" = f32 ] && continue
  file=$(gguf_of "$f")
  if [ ! -s "$file" ]; then
    src=$F32 type=${f^^}
    if is_family "$f"; then
      src="$WORK/$f-f16.gguf" type=Q4_K_M
      if [ ! -s "$src" ]; then
        echo "== writing $src"
        "$PYTHON" "$ROOT/tests/external/tiny_families.py" "$f" "$src.tmp" --shape bench >/dev/null && mv "$src.tmp" "$src"
      fi
    fi
    echo "== llama-quantize $f ($type)"
    "$LLAMA_BIN_DIR/llama-quantize" "$src" "$file.tmp" "$type" "$THREADS" >"$WORK/quantize-$f.log" 2>&1 ||
      die "llama-quantize $f failed: $(tail -n 5 "$WORK/quantize-$f.log")"
    mv "$file.tmp" "$file"
  fi
done

# ---- the prompts: single-token words of the file's vocabulary ("▁abc" pieces), so the
# text is IN_LEN tokens (with BOS) for any tokenizer that reads the vocabulary right; distinct prompts per
# concurrency so no run hits a prefix cache filled by the one before.
PROMPTS="$WORK/prompts-$N1-$N8.jsonl"
if [ ! -s "$PROMPTS" ]; then
  # IN_LEN - 1 words: both servers put BOS in front.
  "$PYTHON" - "$F32" "$PROMPTS" "$((1 + N1 + N8))" "$((IN_LEN - 1))" "$OUT_LEN" <<'EOF'
import json, random, sys
import gguf
path, out, n, words, out_len = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
f = gguf.GGUFReader(path).fields["tokenizer.ggml.tokens"]
vocab = [bytes(f.parts[i]).decode() for i in f.data]
pieces = [t[1:] for t in vocab if len(t) == 4 and t[0] == "\u2581" and t[1:].isalpha() and t[1:].islower()]
if len(pieces) < 1000:
    sys.exit(f"{path}: only {len(pieces)} '\u2581abc' pieces in the vocabulary; this script expects make-llama-gguf.py's")
rng = random.Random(18)
with open(out, "w") as o:
    for _ in range(n):
        o.write(json.dumps({"prompt": " ".join(rng.choice(pieces) for _ in range(words)), "output_tokens": out_len}) + "\n")
EOF
fi
head -n 1 "$PROMPTS" >"$OUT/warm.jsonl"
sed -n "2,$((1 + N1))p" "$PROMPTS" >"$OUT/c1.jsonl"
sed -n "$((2 + N1)),$((1 + N1 + N8))p" "$PROMPTS" >"$OUT/c8.jsonl"
WARM_PROMPT=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["prompt"])' "$OUT/warm.jsonl")

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

# start_server NAME FILE LOG: starts NAME on FILE, waits until /health and /v1/models answer.
start_server() {
  local name=$1 file=$2 log=$3
  # Another server on the port would be measured instead of this one. Prompt caches are off in
  # both: bench's initial test request sends the run's first prompt once before the run.
  port_busy && die "port $PORT is in use (set PORT)"
  if [ "$name" = inferscope ]; then
    RAYON_NUM_THREADS=$THREADS "$INFERSCOPE_BIN" serve --executor cpu --model "$file" \
      --host 127.0.0.1 --port "$PORT" --disable-log-stats --no-enable-prefix-caching ${INFERSCOPE_ARGS:-} >"$log" 2>&1 &
  else
    # -c: 8 slots × (128 + 64) tokens with room; continuous batching is llama-server's default.
    env ${LLAMA_OMP_WAIT_POLICY:+OMP_WAIT_POLICY=$LLAMA_OMP_WAIT_POLICY} \
      "$LLAMA_BIN_DIR/llama-server" -m "$file" --host 127.0.0.1 --port "$PORT" \
      -t "$THREADS" -tb "$THREADS" --parallel 8 -c 4096 --cont-batching \
      --no-cache-prompt --cache-ram 0 --no-webui >"$log" 2>&1 &
  fi
  SERVER=$!
  local i
  for i in $(seq 1200); do
    kill -0 "$SERVER" 2>/dev/null || { SERVER=; die "$name exited while loading $file: $(tail -n 5 "$log")"; }
    if curl -sf "127.0.0.1:$PORT/health" >/dev/null && curl -sf "127.0.0.1:$PORT/v1/models" >/dev/null; then
      return 0
    fi
    sleep 0.25
  done
  die "$name did not get ready in 300 s: $(tail -n 5 "$log")"
}

# The served model's id (bench's own discovery would send `root`, the file's path, which
# inferscope does not accept as a model name).
model_id() {
  curl -sf "127.0.0.1:$PORT/v1/models" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])'
}

# greedy NAME FORMAT: the warm-up request (temperature 0, 8 tokens), also the sanity check.
greedy() {
  curl -sf "127.0.0.1:$PORT/v1/completions" -H 'content-type: application/json' \
    -d "$("$PYTHON" -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "max_tokens": 8, "temperature": 0}))' "$WARM_PROMPT")" \
    >"$OUT/greedy-$1-$2.json" || die "$1: the greedy request failed"
}

bench() {
  local name=$1 fmt=$2 c=$3 run=$4 n=$N1
  [ "$c" = 8 ] && n=$N8
  "$INFERSCOPE_BIN" bench serve --host 127.0.0.1 --port "$PORT" --model "$MODEL" \
    --dataset-name custom --dataset-path "$OUT/c$c.jsonl" --num-prompts "$n" --max-concurrency "$c" \
    --ignore-eos --temperature 0 --seed 7 --disable-tqdm \
    --save-result --result-dir "$OUT" --result-filename "$name-$fmt-c$c-r$run.json" \
    >"$OUT/$name-$fmt-c$c-r$run.txt" 2>&1 ||
    die "bench against $name ($fmt, concurrency $c) failed: $(tail -n 5 "$OUT/$name-$fmt-c$c-r$run.txt")"
}

echo "== results in $OUT"
echo "llama-server OMP_WAIT_POLICY: ${LLAMA_OMP_WAIT_POLICY:-(llama.cpp default)}; threads: $THREADS; prompts: $N1 at concurrency 1, $N8 at 8" | tee -a "$OUT/versions.txt"
echo "inferscope: $INFERSCOPE_BIN ${INFERSCOPE_ARGS:-} ($("$INFERSCOPE_BIN" --version 2>&1 | head -1)); llama-server: $("$LLAMA_BIN_DIR/llama-server" --version 2>&1 | grep -m1 version || echo '?')" | tee -a "$OUT/versions.txt"
for run in $(seq "$RUNS"); do
  order="inferscope llama-server"
  [ $((run % 2)) = 0 ] && order="llama-server inferscope"
  for fmt in $FORMATS; do
    file=$(gguf_of "$fmt")
    for name in $order; do
      echo "== run $run: $fmt on $name (load average $(cut -d' ' -f1-3 /proc/loadavg))"
      start_server "$name" "$file" "$OUT/$name-$fmt-r$run.log"
      MODEL=$(model_id)
      greedy "$name" "$fmt"
      for c in 1 8; do bench "$name" "$fmt" "$c" "$run"; done
      echo "$run $fmt $name $(cut -d' ' -f1 /proc/loadavg)" >>"$OUT/load.txt"
      stop_server
    done
  done
done

"$PYTHON" - "$OUT" "$FORMATS" "$RUNS" "$N1" "$N8" "$OUT_LEN" "$FAMILIES" <<'EOF' | tee "$OUT/table.md"
import json, os, statistics, sys
out, formats, runs, n1, n8, out_len = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
families = sys.argv[7].split()
def label(fmt):
    return f"{fmt} Q4_K_M" if fmt in families else fmt.upper()
names = ["inferscope", "llama-server"]
problems = []
ratios = {}  # (format, concurrency) -> [(tok/s ratio, TTFT ratio)] over the rounds
print("| format | concurrency | run | inferscope out tok/s | llama-server out tok/s | ratio | TTFT p50 inferscope / llama-server | TTFT ratio |")
print("|---|---|---|---|---|---|---|---|")
for fmt in formats:
    for c in (1, 8):
        n = n1 if c == 1 else n8
        for run in range(1, runs + 1):
            r = {}
            for name in names:
                r[name] = json.load(open(os.path.join(out, f"{name}-{fmt}-c{c}-r{run}.json")))
                got = r[name]
                if got.get("completed") != n or got.get("total_output_tokens") != n * out_len:
                    problems.append(f"{name} {fmt} c{c} run {run}: completed {got.get('completed')}/{n}, "
                                    f"output tokens {got.get('total_output_tokens')} (expected {n * out_len}, "
                                    f"counted by {got.get('output_tokens_counted_by')})")
            a, b = r["inferscope"], r["llama-server"]
            ta, tb = a["median_ttft_ms"], b["median_ttft_ms"]
            print(f"| {label(fmt)} | {c} ({n} prompts) | {run} | {a['output_throughput']:.1f} | {b['output_throughput']:.1f} | "
                  f"{a['output_throughput'] / b['output_throughput']:.2f}× | {ta:.0f} / {tb:.0f} ms | {ta / tb:.2f}× |")
            ratios.setdefault((fmt, c), []).append((a["output_throughput"] / b["output_throughput"], ta / tb))
print()
if runs > 1:
    # Runs spread by ±15 % between server processes: the median over the
    # rounds, and how many rounds met issue #18's goal.
    print(f"Over the {runs} rounds: the median ratio, and the rounds that met issue #18's goal "
          "(output tok/s ≥ 1.3×, TTFT p50 ≤ 0.8×) and issue #35's (output tok/s ≥ 1.0×):")
    print()
    print("| format | concurrency | tok/s ratio, median | rounds ≥ 1.3× | rounds ≥ 1.0× | TTFT ratio, median | rounds ≤ 0.8× |")
    print("|---|---|---|---|---|---|---|")
    for (fmt, c), v in ratios.items():
        tp, tt = [x for x, _ in v], [y for _, y in v]
        print(f"| {label(fmt)} | {c} | {statistics.median(tp):.2f}× | {sum(x >= 1.3 for x in tp)} of {runs} | {sum(x >= 1.0 for x in tp)} of {runs} | "
              f"{statistics.median(tt):.2f}× | {sum(y <= 0.8 for y in tt)} of {runs} |")
    print()
for fmt in formats:
    texts, usage = {}, {}
    for name in names:
        j = json.load(open(os.path.join(out, f"greedy-{name}-{fmt}.json")))
        texts[name] = j["choices"][0]["text"]
        u = j.get("usage") or {}
        usage[name] = (u.get("prompt_tokens"), u.get("completion_tokens"))
    same = "same" if texts["inferscope"] == texts["llama-server"] else "DIFFERENT"
    print(f"- greedy, {label(fmt)}: {same} text; " + "; ".join(
        f"{k}: {texts[k]!r} (usage: {usage[k][0]} prompt / {usage[k][1]} completion tokens)" for k in names))
for p in problems:
    print(f"- WARNING: {p}")
EOF
echo "load average after each server (run, format, server, 1-min): $(tr '\n' ';' <"$OUT/load.txt")"
