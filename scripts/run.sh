#!/usr/bin/env bash
# Sets up and runs Pacer's main job on this machine: fetches the default model, builds the
# engine, and streams a chat answer with prefill/decode timings. Extra arguments go to
# `pacer-engine generate` in place of the default chat prompt, e.g.
#   scripts/run.sh --prompt "Once upon a time" --max-tokens 64 --tier f32
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
model=$(scripts/fetch-model.sh)
cargo build --release --locked -q -p pacer-engine
if [ $# -eq 0 ]; then
  set -- --chat --max-tokens 96 --prompt "Explain in two sentences why latency SLAs matter for LLM serving."
fi
exec target/release/pacer-engine generate --model "$model" "$@"
