#!/usr/bin/env bash
# The engine's ITL budget (`--max-step-ms`) side by side: one `pacer-engine serve` per budget
# (otherwise its default flags: q4_0, 2 threads), each driven by the same pacer-bench load of
# mixed prompt lengths, so long prompts arrive while short streams decode. Prints one markdown
# row per budget. About 2 minutes per budget on 2 cores; run it on an otherwise idle machine.
#   scripts/bench-step-budget.sh [--budgets 0,100] [--concurrency 16] [--requests 48]
#                                [--input-len uniform:32:1500] [--seed 1]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
budgets=0,100 concurrency=16 requests=48 input=uniform:32:1500 seed=1
while [ $# -gt 0 ]; do
  case "$1" in
    --budgets) budgets=$2; shift 2 ;;
    --concurrency) concurrency=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    --input-len) input=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    -h|--help) sed -n 2,7p "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
model=$("$root/scripts/fetch-model.sh")
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
(cd "$root" && cargo build --release --locked -q -p pacer-engine -p pacer-bench)
bin="$CARGO_TARGET_DIR/release"
out=$(mktemp -d)
trap 'kill "${engine_pid:-}" 2>/dev/null || true; rm -rf "$out"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

echo "| --max-step-ms | output tok/s | P50 TTFT ms | P95 TTFT ms | P50 ITL ms | P95 ITL ms | P95 / P50 ITL |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
for budget in ${budgets//,/ }; do
  "$bin/pacer-engine" serve --model "$model" --tier q4_0 --threads 2 --port "$port" \
    --served-model-name smol --max-step-ms "$budget" >"$out/engine-$budget.log" 2>&1 &
  engine_pid=$!
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/ready" >/dev/null && break
    sleep 0.2
  done
  "$bin/pacer-bench" run --base-url "http://127.0.0.1:$port" --model smol --endpoint chat \
    --num-requests "$requests" --concurrency "$concurrency" --warmup 1 --input-len "$input" \
    --output-len 64 --ignore-eos --seed "$seed" --json "$out/run-$budget.json" >/dev/null 2>&1
  kill "$engine_pid"
  wait "$engine_pid" 2>/dev/null || true
  python3 - "$out/run-$budget.json" "$budget" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
f = lambda k: r[k]
print(f"| {sys.argv[2]} | {f('output_throughput'):.1f} | {f('p50_ttft_ms'):.0f} | {f('p95_ttft_ms'):.0f} | "
      f"{f('p50_itl_ms'):.1f} | {f('p95_itl_ms'):.1f} | {f('p95_itl_ms') / f('p50_itl_ms'):.2f}× |")
EOF
done
