#!/usr/bin/env bash
# Fetches llama.cpp's own test material once into a cache and prints its
# directory: the `models/` folder of the llama-cpp-python sdist (the
# `ggml-vocab-*.gguf` vocabularies with their `.inp`/`.out` tokenizer tests,
# and `templates/*.jinja`, real models' chat templates).
#
#   export INFERSCOPE_LLAMA_CPP_MODELS="$(scripts/llama-cpp-test-data.sh)"
#
# Tests that read it skip (and say so) when the variable is unset; CI sets it.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON:-0.3.36}"
CACHE="${INFERSCOPE_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/inferscope-ci}"
DEST="$CACHE/llama.cpp-models-$VERSION"
if [ -f "$DEST/.complete" ]; then
    echo "$DEST"
    exit 0
fi
mkdir -p "$CACHE"
TMP="$(mktemp -d "$CACHE/sdist.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
# The sdist's address from the package index (PEP 503 simple page), so this
# works wherever pip does.
INDEX="${PIP_INDEX_URL:-https://pypi.org/simple}"
URL="$(python3 - "$INDEX" "$VERSION" <<'PY'
import re, sys, urllib.request
index, version = sys.argv[1].rstrip("/"), sys.argv[2]
page = urllib.request.urlopen(f"{index}/llama-cpp-python/", timeout=60).read().decode()
name = f"llama_cpp_python-{version}.tar.gz"
for href in re.findall(r'href="([^"]+)"', page):
    if href.split("#")[0].endswith(name):
        print(urllib.parse.urljoin(f"{index}/llama-cpp-python/", href))
        break
else:
    sys.exit(f"{name} not found on {index}")
PY
)"
echo "fetching ${URL%%#*}" >&2
python3 - "$URL" "$TMP/sdist.tar.gz" <<'PY'
import hashlib, sys, urllib.request
url, out = sys.argv[1], sys.argv[2]
data = urllib.request.urlopen(url, timeout=600).read()
if "#sha256=" in url and hashlib.sha256(data).hexdigest() != url.split("#sha256=")[1]:
    sys.exit("sha256 mismatch for " + url)
open(out, "wb").write(data)
PY
tar -xzf "$TMP/sdist.tar.gz" -C "$TMP" "llama_cpp_python-$VERSION/vendor/llama.cpp/models"
rm -rf "$DEST"
mv "$TMP/llama_cpp_python-$VERSION/vendor/llama.cpp/models" "$DEST"
touch "$DEST/.complete"
echo "$DEST"
