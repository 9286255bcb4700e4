#!/usr/bin/env bash
# Builds `pacer-engine --features cuda` with the CUDA toolkit from PyPI (scripts/setup-cuda.sh)
# and smoke-runs the binary on a machine without a GPU, against the toolkit's libraries and
# the driver stub, as on a GPU node with no GPU assigned:
#   - the code behind the feature passes clippy;
#   - it links the CUDA libraries candle uses (driver, cuBLAS, cuRAND, runtime);
#   - `--device cuda` fails with a clear error, not a crash;
#   - `--device candle-cpu` (the candle backend) answers a chat on the real model;
#   - `--device auto` falls back to the CPU kernels.
# The candle backend's own tests (engine/tests/candle.rs, reference.rs) run in the normal test
# build on candle's CPU device. On a GPU machine, `PACER_TEST_DEVICE=cuda` runs them on CUDA.
#
#   scripts/check-cuda-build.sh                 # needs PACER_MODEL or the cached model
#   CUDA_COMPUTE_CAP=90 scripts/check-cuda-build.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
# Kernels for Ampere (sm_80) with PTX, which newer GPUs JIT-compile: the build needs no GPU.
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-80}"
log() { printf 'check-cuda-build: %s\n' "$*" >&2; }

model="${PACER_MODEL:-$(scripts/fetch-model.sh)}"
CUDA_HOME=$(scripts/setup-cuda.sh)
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"

# A profile of its own (Cargo.toml: cuda-check), so this binary never replaces the release one.
# The code behind the feature (the fused ops' CUDA launches) gets the lints the rest gets.
cargo clippy --profile cuda-check --locked -p pacer-engine --features cuda -- -D warnings
cargo build --profile cuda-check --locked -p pacer-engine --features cuda
bin="$CARGO_TARGET_DIR/cuda-check/pacer-engine"
export LD_LIBRARY_PATH="$CUDA_HOME/lib/stubs:$CUDA_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

fail() { log "FAILED: $*"; exit 1; }

linked=$(ldd "$bin")
for lib in libcuda.so.1 libcublas.so.13 libcurand.so.10 libcudart.so.13; do
  grep -q "$lib => $CUDA_HOME" <<<"$linked" || fail "$lib is not linked: $linked"
done
log "links the CUDA libraries"

out=$(RUST_BACKTRACE=0 "$bin" generate --model "$model" --device cuda --prompt hi --max-tokens 2 2>&1) \
  && fail "--device cuda succeeded without a GPU: $out"
grep -q "CUDA device 0 is not usable" <<<"$out" || fail "unclear error for --device cuda: $out"
log "--device cuda without a GPU: $(grep -m1 'not usable' <<<"$out")"

ask=(generate --model "$model" --chat --prompt "What is the capital of France?" --max-tokens 24)
out=$(PACER_LOG_FORMAT=json "$bin" "${ask[@]}" --device candle-cpu --tier f32 2>&1) || fail "candle-cpu: $out"
grep -q "Paris" <<<"$out" || fail "candle-cpu did not answer: $out"
grep -q '"device":"candle-cpu"' <<<"$out" || fail "candle-cpu was not the device: $out"
log "--device candle-cpu answers: $(grep -m1 Paris <<<"$out")"

out=$(PACER_LOG_FORMAT=json "$bin" "${ask[@]}" --tier f32 2>&1) || fail "auto: $out"
grep -q '"device":"cpu"' <<<"$out" || fail "--device auto did not fall back to the CPU kernels: $out"
grep -q "Paris" <<<"$out" || fail "auto did not answer: $out"
log "--device auto without a GPU runs the CPU kernels"
log "ok: the cuda build links and runs"
