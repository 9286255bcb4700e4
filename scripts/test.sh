#!/usr/bin/env bash
# Sets up and runs Pacer's tests on a fresh machine: fetches the real model (cached outside the
# repository), checks formatting and lints, and runs every test tier that exists so far.
# `.ci/run` calls exactly this.
#
# Reuses one cargo target directory across clones (under the cache) so repeated CI runs only
# rebuild what changed; set CARGO_TARGET_DIR to override.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { printf '\n==> %s\n' "$*"; }

step "model"
PACER_MODEL=$(scripts/fetch-model.sh)
export PACER_MODEL

step "format"
cargo fmt --all -- --check

step "lint"
cargo clippy --workspace --all-targets --release --locked -- -D warnings

step "tests (unit, and the engine on the real model)"
cargo test --workspace --release --locked

# Every kernel set runs the same real-model tests: CPUs without AVX-VNNI take the AVX2
# kernels, CPUs without AVX2 the portable ones.
for kernels in avx2 scalar; do
  step "engine on the real model with the $kernels kernels"
  PACER_KERNELS=$kernels cargo test --release --locked -p pacer-engine --test model --test reference
done

step "the official openai Python client against pacer-engine serve"
scripts/test-openai-client.sh "$CARGO_TARGET_DIR/release/pacer-engine"
