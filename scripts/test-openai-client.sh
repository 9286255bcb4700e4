#!/usr/bin/env bash
# Runs the official `openai` Python client against a real `pacer-engine serve` (the real
# model, a free loopback port). Needs the engine built in release; the client lives in a venv
# under Pacer's cache.
#   scripts/test-openai-client.sh [path/to/pacer-engine]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
engine="${1:-${CARGO_TARGET_DIR:-$root/target}/release/pacer-engine}"
model=$("$root/scripts/fetch-model.sh")
venv="$cache/openai-client-venv"
if ! "$venv/bin/python" -c "import openai, pytest" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "openai==3.51.0" "pytest==9.2.0"
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
"$engine" serve --model "$model" --tier q4_0 --port "$port" --served-model-name smol >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 200); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/ready', timeout=1)" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
PACER_BASE_URL="http://127.0.0.1:$port" PACER_SERVED_MODEL=smol \
  "$venv/bin/python" -m pytest -q "$root/engine/tests/python/test_openai_client.py"
