#!/usr/bin/env bash
# Builds llama.cpp's Python binding (llama-cpp-python, compiled from source by pip) into a venv
# in Pacer's cache, and prints the venv's python. Used only to regenerate reference vectors and
# to benchmark against llama.cpp; CI never needs it.
#
# On CPUs with AMX, llama.cpp's AMX quantized matmul crashes, so AMX code generation is off.
set -euo pipefail
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
venv="$cache/ref/venv"
version="0.3.36"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import llama_cpp, gguf, numpy; assert llama_cpp.__version__ == '$version'" 2>/dev/null; then
  echo "$venv/bin/python"
  exit 0
fi
mkdir -p "$cache/ref"
python3 -m venv "$venv"
echo "building llama-cpp-python $version from source (about 10 minutes on 2 cores)" >&2
no_amx="-mno-amx-int8 -mno-amx-tile -mno-amx-bf16"
CMAKE_ARGS="-DGGML_NATIVE=ON" CFLAGS="$no_amx" CXXFLAGS="$no_amx" \
  "$venv/bin/pip" install --no-cache-dir --progress-bar on "llama-cpp-python[server]==$version" "gguf==0.19.0" numpy jinja2 "httpx==0.28.1" >&2
echo "$venv/bin/python"
