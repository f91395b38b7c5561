#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` and `llama-quantize` (nothing else) for the side-by-side
# benchmark in scripts/llamacpp-compare.sh (issue #18). Not part of CI: it compiles llama.cpp.
#
#   scripts/build-llama-server.sh [CACHE_DIR]
#
# CACHE_DIR defaults to ${XDG_CACHE_HOME:-$HOME/.cache}/inferscope/llama.cpp. The binaries land in
# CACHE_DIR/bin; a second run with both present does nothing. The source is the llama.cpp that
# the llama-cpp-python sdist vendors (version LLAMA_CPP_PYTHON_VERSION, default 0.3.36, the one
# tests/external's venv has), fetched with pip unless CACHE_DIR/src already holds the sdist.
# CMake comes from the system, else from the `cmake` PyPI package in a venv under CACHE_DIR.
#
# Env: JOBS (default 2), PYTHON (default python3), LLAMA_CPP_PYTHON_VERSION.
set -euo pipefail

CACHE_DIR=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/inferscope/llama.cpp}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
JOBS=${JOBS:-2}
PYTHON=${PYTHON:-python3}
BIN="$CACHE_DIR/bin"

if [ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-quantize" ]; then
  echo "llama.cpp already built: $BIN/llama-server, $BIN/llama-quantize"
  exit 0
fi

mkdir -p "$CACHE_DIR/src" "$BIN"
SDIST="$CACHE_DIR/src/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  echo "== fetching the llama-cpp-python $VERSION sdist"
  # --no-binary for this package only: `:all:` would also build its build backend's
  # dependencies (cmake itself) from source.
  "$PYTHON" -m pip download --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$VERSION" -d "$CACHE_DIR/src"
fi
[ -f "$SDIST" ] || { echo "error: pip did not leave $SDIST" >&2; exit 1; }

SRC="$CACHE_DIR/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  echo "== extracting vendor/llama.cpp"
  tar -xzf "$SDIST" -C "$CACHE_DIR/src" "llama_cpp_python-$VERSION/vendor/llama.cpp"
fi

CMAKE=$(command -v cmake || true)
if [ -z "$CMAKE" ]; then
  CMAKE="$CACHE_DIR/cmake-venv/bin/cmake"
  if [ ! -x "$CMAKE" ]; then
    echo "== no cmake on PATH: installing the cmake PyPI package in $CACHE_DIR/cmake-venv"
    "$PYTHON" -m venv "$CACHE_DIR/cmake-venv"
    "$CACHE_DIR/cmake-venv/bin/pip" install --quiet cmake
  fi
fi
echo "== cmake: $("$CMAKE" --version | head -1)"

BUILD="$CACHE_DIR/build"
# Static libraries so the two binaries are self-contained in $BIN. The UI options keep the
# build offline (no npm, no download of the web UI); OpenSSL is off (127.0.0.1 only).
"$CMAKE" -S "$SRC" -B "$BUILD" \
  -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON \
  -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_OPENSSL=OFF
"$CMAKE" --build "$BUILD" --config Release -j "$JOBS" --target llama-server llama-quantize

for b in llama-server llama-quantize; do
  found=$(find "$BUILD/bin" "$BUILD" -maxdepth 2 -type f -name "$b" -perm -u+x 2>/dev/null | head -1)
  [ -n "$found" ] || { echo "error: $b not built under $BUILD" >&2; exit 1; }
  cp "$found" "$BIN/$b"
done
echo "built: $BIN/llama-server, $BIN/llama-quantize"
"$BIN/llama-server" --version 2>&1 | head -2 || true
