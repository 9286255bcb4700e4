#!/usr/bin/env bash
# Builds llama.cpp's own C++ tools (llama-server, llama-bench, llama-batched-bench, llama-quantize)
# into Pacer's cache and prints the folder that holds them. The source is the llama.cpp that the
# PyPI sdist of llama-cpp-python vendors (the same version scripts/reference/setup-llama-cpp.sh builds), so the
# serving and model-core comparisons run one llama.cpp. The sdist comes from PyPI through pip, its
# SHA-256 checked. Used only for benchmarks; CI never needs it.
#
# On CPUs with AMX, llama.cpp's AMX quantized matmul crashes, so AMX code generation is off.
set -euo pipefail
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
version="0.3.36"
sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
out="$cache/ref/llama.cpp-$version"
tools="llama-server llama-bench llama-batched-bench llama-quantize"
if [ -x "$out/bin/llama-server" ] && [ -x "$out/bin/llama-bench" ] && [ -x "$out/bin/llama-batched-bench" ] &&
  [ -x "$out/bin/llama-quantize" ]; then
  echo "$out/bin"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "fetching llama-cpp-python $version's sdist through pip (it vendors llama.cpp)" >&2
# The source distribution only, not a wheel and not its dependencies. pip reads the sdist's
# metadata with its build backend in an isolated environment, which it fetches the same way.
python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
  --dest "$work/dist" "llama-cpp-python==$version" >&2
sdists=("$work"/dist/llama[_-]cpp[_-]python-"$version".tar.gz)
if [ ! -f "${sdists[0]}" ]; then
  echo "pip did not leave llama-cpp-python $version's sdist in $work/dist" >&2
  exit 1
fi
echo "$sha256  ${sdists[0]}" | sha256sum -c --quiet
mkdir -p "$work/src"
tar -xzf "${sdists[0]}" -C "$work/src"
srcs=("$work"/src/*/vendor/llama.cpp)
if [ ! -f "${srcs[0]}/CMakeLists.txt" ]; then
  echo "no vendored llama.cpp in llama-cpp-python $version's sdist" >&2
  exit 1
fi
src="${srcs[0]}"
echo "building $tools (about 10 minutes on 2 cores)" >&2
no_amx="-mno-amx-int8 -mno-amx-tile -mno-amx-bf16"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON \
  -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF \
  -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" >&2
# shellcheck disable=SC2086
cmake --build "$work/build" -j "$(nproc)" --target $tools >&2
mkdir -p "$out/bin"
for t in $tools; do cp "$work/build/bin/$t" "$out/bin/"; done
echo "$out/bin"
