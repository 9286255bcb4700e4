#!/usr/bin/env bash
# Model-core benchmark against llama.cpp (see scripts/bench-core.py). Builds Pacer in release,
# fetches the model, builds llama.cpp and its GGUFs once (cached), then runs both side by side.
#   scripts/bench-core.sh [--tiers q4_0,native] [--threads 2] [--repeats 3]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
model=$("$root/scripts/fetch-model.sh")
[ -f "$cache/ref/SmolLM2-135M-Instruct.q4_0.gguf" ] || "$root/scripts/make-reference.sh" >&2
py=$("$root/scripts/reference/setup-llama-cpp.sh")
(cd "$root" && cargo build --release -q -p pacer-engine)
"$py" "$root/scripts/bench-core.py" --pacer "$root/target/release/pacer-engine" --model "$model" \
  --ref-dir "$cache/ref" "$@"
