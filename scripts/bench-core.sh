#!/usr/bin/env bash
# Model-core benchmark against llama.cpp (see scripts/bench-core.py). Builds Pacer in release,
# fetches the model, builds llama.cpp and its GGUFs once (cached), then runs both side by side.
#   scripts/bench-core.sh [--tiers q4_0,native] [--threads 2] [--repeats 3] [--prefill 2048,4096,8000] [--batches 1]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
model=$("$root/scripts/fetch-model.sh")
# llama.cpp's own quantizations of the f32 weights, for every tier but the shipped one.
case " $* " in
  *" --tiers native "*) ;;
  *) [ -f "$cache/ref/SmolLM2-135M-Instruct.q4_0.gguf" ] || "$root/scripts/make-reference.sh" >&2 ;;
esac
py=$("$root/scripts/reference/setup-llama-cpp.sh")
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
(cd "$root" && cargo build --release --locked -q -p pacer-engine)
"$py" "$root/scripts/bench-core.py" --pacer "$CARGO_TARGET_DIR/release/pacer-engine" --model "$model" \
  --ref-dir "$cache/ref" "$@"
