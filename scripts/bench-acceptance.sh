#!/usr/bin/env bash
# pacer-bench vs NVIDIA AIPerf vs the server's own histograms (see scripts/bench-acceptance.py).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
model=$("$root/scripts/fetch-model.sh")
venv="$cache/aiperf-venv"
"$venv/bin/aiperf" --version >/dev/null 2>&1 || {
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "aiperf==0.13.0"
}
(cd "$root" && cargo build --release -q -p pacer-engine -p pacer-bench)
tok="$cache/tokenizer-smollm2"
"$root/target/release/pacer-engine" info --model "$model" --export-tokenizer "$tok" >/dev/null
python3 "$root/scripts/bench-acceptance.py" --engine "$root/target/release/pacer-engine" \
  --bench "$root/target/release/pacer-bench" --aiperf "$venv/bin/aiperf" --model "$model" \
  --tokenizer-dir "$tok" "$@"
