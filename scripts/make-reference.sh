#!/usr/bin/env bash
# Regenerates the llama.cpp reference vectors under engine/tests/data/ (committed; CI uses them
# and never builds llama.cpp). Builds llama-cpp-python once and caches it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=$("$root/scripts/fetch-model.sh")
py=$("$root/scripts/reference/setup-llama-cpp.sh")
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
mkdir -p "$cache/ref"
"$py" "$root/scripts/reference/make_reference.py" --model "$model" --workdir "$cache/ref" --out "$root/engine/tests/data"
