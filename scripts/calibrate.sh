#!/usr/bin/env bash
# The simulator's calibration benchmark: how far the simulated engine is from the real one.
# For each tier it profiles the engine (`pacer-engine profile`, one thread) and then, on the
# same machine minutes later, serves it with one thread and drives it with `pacer-bench` at
# three open-loop (Poisson) rates; each run's requests are replayed through one simulated
# replica on that fresh profile (`pacer-operator calibrate`) and the P50/P95 TTFT and ITL are
# set side by side. Profiling next to the runs matters: on a shared machine a profile from
# another hour can be off by half.
#
#   scripts/calibrate.sh                                   # native and q8_0 at 0.5, 1, 1.5 req/s
#   TIERS="native" RATES="1 2" REQUESTS=60 scripts/calibrate.sh --out /tmp/cal
#
# Writes OUT/table.md (the table of docs/benchmarks.md), OUT/calibration.json, the fresh
# profiles and each run's per-request file. About 10 minutes on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=calibration
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "calibrate: unknown argument $1" >&2; exit 2 ;;
  esac
done
tiers=${TIERS:-"native q8_0"}
rates=${RATES:-"0.5 1 1.5"}
requests=${REQUESTS:-45}
port=${PORT:-8790}
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
model=$(scripts/fetch-model.sh)
echo "building pacer-engine, pacer-bench and pacer-operator (release)" >&2
cargo build --release --locked -q -p pacer-engine -p pacer-bench -p pacer-operator
bin="$CARGO_TARGET_DIR/release"
mkdir -p "$out"

engine_pid=
stop_engine() {
  if [ -n "$engine_pid" ]; then
    kill "$engine_pid" 2>/dev/null || true
    wait "$engine_pid" 2>/dev/null || true
    engine_pid=
  fi
}
trap stop_engine EXIT

served=$(basename "$model" .gguf)
rows=()
for tier in $tiers; do
  echo "profiling $tier on one thread" >&2
  "$bin/pacer-engine" profile --model "$model" --tier "$tier" --threads 1 --out "$out/profile-$tier.json" >&2
  # No prefix caching: the three runs send the same prompts (one seed), and the simulator
  # models no cache, so a cached second run would measure the cache, not the steps.
  "$bin/pacer-engine" serve --model "$model" --tier "$tier" --threads 1 --port "$port" \
    --prefix-caching false >"$out/engine-$tier.log" 2>&1 &
  engine_pid=$!
  # /ready, not /health: the process answers before its scheduler takes requests.
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/ready" >/dev/null && break
    sleep 0.2
  done
  runs=()
  for rate in $rates; do
    echo "$tier at $rate req/s: $requests requests" >&2
    "$bin/pacer-bench" run --base-url "http://127.0.0.1:$port" --model "$served" \
      --request-rate "$rate" --num-requests "$requests" --input-len 128 --output-len 64 \
      --ignore-eos --seed 7 --requests-jsonl "$out/$tier-$rate.jsonl" >&2
    runs+=(--requests "$out/$tier-$rate.jsonl")
  done
  stop_engine
  "$bin/pacer-operator" calibrate --profile "$out/profile-$tier.json" "${runs[@]}" \
    --json "$out/calibration-$tier.json" >"$out/table-$tier.md"
  rows+=("$out/table-$tier.md")
done
{
  head -n 2 "${rows[0]}"
  for t in "${rows[@]}"; do tail -n +3 "$t"; done
} >"$out/table.md"
cat "$out/table.md"
