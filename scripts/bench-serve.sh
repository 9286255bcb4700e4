#!/usr/bin/env bash
# Serving benchmark against llama.cpp's server (see scripts/bench-serve.py).
#   scripts/bench-serve.sh [--concurrency 1,4,8,16] [--max-tokens 64] [--json-out FILE]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
model=$("$root/scripts/fetch-model.sh")
[ -f "$cache/ref/SmolLM2-135M-Instruct.q4_0.gguf" ] || "$root/scripts/make-reference.sh" >&2
py=$("$root/scripts/reference/setup-llama-cpp.sh")
"$py" -c "import llama_cpp.server, httpx" 2>/dev/null ||
  "$(dirname "$py")/pip" install --quiet "llama-cpp-python[server]==0.3.36" "httpx==0.28.1" >&2
(cd "$root" && cargo build --release -q -p pacer-engine)
"$py" "$root/scripts/bench-serve.py" --pacer "$root/target/release/pacer-engine" --model "$model" \
  --llama-model "$cache/ref/SmolLM2-135M-Instruct.q4_0.gguf" "$@"
