#!/usr/bin/env bash
# Sets up and runs Pacer's tests on a fresh machine: fetches the real model and builds the test
# cluster's binaries (kube-apiserver, controller manager, scheduler, etcd, kwok, helm from their
# upstream Go modules) and the Prometheus Operator's CRDs (controller-gen on its Go types), all
# cached outside the repository, checks formatting and lints, and runs every test tier that
# exists so far on the newest supported Kubernetes. `.ci/run` calls exactly this;
# `scripts/test-matrix.sh` runs the cluster tests on the oldest supported version.
# Each step's duration is printed at the end.
#
# Needs: Rust (rustup), Python 3 with pip, Go >= 1.26, openssl, a C/C++ compiler (nvcc's host
# compiler for the `cuda` feature's build; the CUDA toolkit itself comes from PyPI).
#
# Reuses one cargo target directory across clones (under the cache) so repeated CI runs only
# rebuild what changed; set CARGO_TARGET_DIR to override.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

# The newest Kubernetes of the version matrix (README: version matrix).
KUBERNETES_NEWEST=1.37.2

timings=()
step_name=""
step_start=$SECONDS
finish_step() {
  if [ -n "$step_name" ]; then
    timings+=("$(printf '%6ds  %s' $((SECONDS - step_start)) "$step_name")")
  fi
}
step() {
  finish_step
  step_name="$*"
  step_start=$SECONDS
  printf '\n==> %s\n' "$*"
}
report() {
  local rc=$?
  finish_step
  printf '\n==> step durations\n'
  printf '%s\n' "${timings[@]}"
  printf '%6ds  total (exit %d)\n' "$SECONDS" "$rc"
}
trap report EXIT

step "model"
PACER_MODEL=$(scripts/fetch-model.sh)
export PACER_MODEL

step "cluster binaries (Kubernetes $KUBERNETES_NEWEST)"
scripts/build-cluster-bins.sh --kubernetes "$KUBERNETES_NEWEST" >/dev/null
export PACER_KUBERNETES_VERSION="$KUBERNETES_NEWEST"
step "prometheus"; PACER_PROMETHEUS_BIN=$(scripts/build-prometheus.sh); export PACER_PROMETHEUS_BIN

step "Prometheus Operator CRDs (for the chart's server-side dry-runs)"
scripts/build-monitoring-crds.sh >/dev/null

step "format"
cargo fmt --all -- --check

step "lint"
cargo clippy --workspace --all-targets --release --locked -- -D warnings
# The operator's image builds the controller alone (operator/Dockerfile): it must compile and
# pass the lints without the `local` and `simulate` features too.
cargo clippy -p pacer-operator --no-default-features --all-targets --release --locked -- -D warnings

# Every later cargo command selects the whole workspace (`--workspace`), so features unify the
# same way each time and no dependency is rebuilt with a different feature set.
step "build the tests"
cargo test --workspace --release --locked --no-run

step "tests (unit, the engine on the real model, the operator, its Helm chart and the closed loop on a Kubernetes $KUBERNETES_NEWEST cluster)"
cargo test --workspace --release --locked

# Every kernel set runs the same real-model tests: CPUs without AVX-VNNI take the AVX2
# kernels, CPUs without AVX2 the portable ones.
# The candle backend's tests (`candle_*`) do not use these kernels; they ran above.
for kernels in avx2 scalar; do
  step "engine on the real model with the $kernels kernels"
  PACER_KERNELS=$kernels cargo test --workspace --release --locked --test model --test reference -- --skip candle_
done

step "the official openai Python client against pacer-engine serve"
scripts/test-openai-client.sh "$CARGO_TARGET_DIR/release/pacer-engine"

step "the GPU check, both halves without CUDA: packed, unpacked and run on candle's CPU device"
gpu_check=$(mktemp -d)
XZ_LEVEL=-0 scripts/gpu-check.sh --build --no-cuda --out "$gpu_check"
scripts/gpu-check.sh --run "$gpu_check" --model "$PACER_MODEL" --device candle-cpu --smoke >/dev/null
rm -rf "$gpu_check"

step "the cuda feature: built with nvcc from PyPI, linked, and run without a GPU"
scripts/check-cuda-build.sh
