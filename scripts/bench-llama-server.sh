#!/usr/bin/env bash
# Serving benchmark against llama.cpp's C++ llama-server (see scripts/bench-llama-server.py):
# builds Pacer and pacer-bench in release, fetches the model, builds llama-server once (cached),
# then drives both with pacer-bench. About 35 minutes on 2 cores with the defaults.
#   scripts/bench-llama-server.sh [--rounds 3] [--concurrency 1,4,8,16,32] [--settings on,off]
#                                 [--workloads distinct,shared,mixed,varied] [--llama-parallel N] [--pacer-hold-ms N]
#                                 [--pacer-kernels vnni|vnni512|avx2] [--pacer-max-batch N]
#                                 [--json-out FILE]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
model=$("$root/scripts/fetch-model.sh")
llama=$("$root/scripts/reference/build-llama-server.sh")
# llama.cpp's own q4_0 quantization of the weights (its repacked AVX2 kernels need q4_0), made
# as scripts/reference/make_reference.py makes it: the shipped file to f32, then f32 to q4_0.
ref="$cache/ref/SmolLM2-135M-Instruct.q4_0.gguf"
if [ ! -f "$ref" ]; then
  f32=$(mktemp --suffix .gguf)
  "$llama/llama-quantize" --allow-requantize "$model" "$f32" F32 >&2
  "$llama/llama-quantize" "$f32" "$ref.part" Q4_0 >&2
  rm -f "$f32"
  mv "$ref.part" "$ref"
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
(cd "$root" && cargo build --release --locked -q -p pacer-engine -p pacer-bench)
python3 "$root/scripts/bench-llama-server.py" --pacer "$CARGO_TARGET_DIR/release/pacer-engine" \
  --bench "$CARGO_TARGET_DIR/release/pacer-bench" --llama-bin "$llama" --model "$model" \
  --llama-model "$ref" "$@"
