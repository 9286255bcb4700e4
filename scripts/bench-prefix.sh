#!/usr/bin/env bash
# The prefix cache's benchmark: one engine (one thread) with `--prefix-caching true` and then
# `false`, two rounds, alternating, on two workloads driven by pacer-bench (4 in flight, 32
# output tokens, --ignore-eos):
#   shared: 40 prompts of 320 words whose first 256 are the same (a shared system prompt);
#   turns:  10 chats of 4 turns (prompts of 128 words; each turn resends the history).
# Prints pacer-bench's throughput, TTFT and ITL lines and the engine's prefix-cache counters
# for each run. About 6 minutes on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
model=$(scripts/fetch-model.sh)
cargo build --release --locked -q -p pacer-engine -p pacer-bench
bin="$CARGO_TARGET_DIR/release"
port=${PORT:-8791}
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null || true' EXIT
for round in 1 2; do
  for workload in shared turns; do
    case "$workload" in
      shared) load=(--shared-prefix 256 --input-len 320 --num-requests 40) ;;
      turns) load=(--turns 4 --input-len 128 --num-requests 10) ;;
    esac
    for caching in true false; do
      "$bin/pacer-engine" serve --model "$model" --threads 1 --port "$port" --prefix-caching "$caching" \
        >/dev/null 2>&1 &
      pid=$!
      for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
      echo "== round $round, $workload, --prefix-caching $caching"
      "$bin/pacer-bench" run --base-url "http://127.0.0.1:$port" --model "$(basename "$model" .gguf)" \
        "${load[@]}" --output-len 32 --ignore-eos --concurrency 4 --seed 3 2>&1 \
        | grep -E "^(requests:|throughput:|ttft |itl )"
      curl -s "http://127.0.0.1:$port/metrics" | grep -E "^vllm:prefix_cache_(hits|queries)_total" || true
      kill "$pid"; wait "$pid" 2>/dev/null || true
      pid=
    done
  done
done
