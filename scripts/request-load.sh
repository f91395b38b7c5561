# Sourced by scripts/request-path.sh and scripts/request-instructions.sh: the
# load both put on a server (non-streamed 16-token completions from wrk, the
# sim executor with a zero-time device), the binaries they measure, and the
# check that those are built. Set ROUNDS, DURATION and PORT before sourcing.
TARGET=${CARGO_TARGET_DIR:-target}
BIN=${BIN:-$TARGET/release/inferscope}
OLD_BIN=${OLD_BIN:-}
BARE=${BARE:-$TARGET/release/examples/bare_axum}
CONNS=${CONNS:-16}
CLIENT_CPU=${CLIENT_CPU:-0}
BODY='{"model":"m","prompt":"hello world","max_tokens":16}'
PROFILE=tiny,t_fixed_ms=0,t_prefill_us=0,t_weights_ms=0,t_kv_ns=0

# Exits naming the first of the measured binaries or `tools` that is missing.
require() { # tools...
  local b tool
  for b in "$BIN" "$BARE" ${OLD_BIN:+"$OLD_BIN"}; do
    [ -x "$b" ] || { echo "no executable $b (build it first, see the header)" >&2; exit 1; }
  done
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "$tool is not installed" >&2; exit 1; }
  done
}

# Writes wrk's script posting `body` to `file`.
post_script() { # file body
  cat >"$1" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '$2'
LUA
}
