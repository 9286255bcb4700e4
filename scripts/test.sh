#!/usr/bin/env bash
# Sets up and runs Pacer's tests on a fresh machine: fetches the real model and builds the test
# cluster's binaries (kube-apiserver, controller manager, scheduler, etcd, kwok, helm from their
# upstream Go modules) and the Prometheus Operator's CRDs (controller-gen on its Go types), all
# cached outside the repository, checks formatting and lints, and runs every test tier that
# exists so far on the newest supported Kubernetes. `.ci/run` calls exactly this;
# `scripts/test-matrix.sh` runs the cluster tests on the oldest supported version.
# Each step's duration is printed at the end.
#
# The builds run side by side (the Go builds, the `cuda` feature's check, the Rust lint and
# build); the tests run after them, one tier at a time, on an otherwise quiet machine.
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

# The newest Kubernetes of the version matrix (docs/testing.md: version matrix).
KUBERNETES_NEWEST=1.37.2

timings=()
background=()
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
kill_tree() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
  kill -TERM "$1" 2>/dev/null || true
}
report() {
  local rc=$?
  # A failure ends the builds still running beside it, with every process they started.
  for pid in "${background[@]}"; do kill_tree "$pid"; done
  [ -n "${beside_logs:-}" ] && rm -rf "$beside_logs"
  finish_step
  printf '\n==> step durations\n'
  printf '%s\n' "${timings[@]}"
  printf '%6ds  total (exit %d)\n' "$SECONDS" "$rc"
}
trap report EXIT

step "model"
PACER_MODEL=$(scripts/fetch-model.sh)
export PACER_MODEL

# Three builds run side by side: the Go builds (the control plane, Prometheus, the monitoring
# CRDs), the `cuda` feature's check (nvcc from PyPI) and the Rust lint and test build. On a cold
# machine each waits on downloads and on single-threaded links and nvcc runs that the others
# fill; on a warm one the first two take seconds. The tests start once all three are done, on a
# quiet machine: the real-time tiers time real engines, and share the CPU with nothing.
# beside KEY TITLE CMD...: runs CMD in the background, its output in a log shown by `await KEY`.
beside_logs=$(mktemp -d)
declare -A beside_pid beside_title
beside() {
  local key="$1" title="$2"
  shift 2
  (
    t=$SECONDS
    rc=0
    "$@" >"$beside_logs/$key.log" 2>&1 || rc=$?
    printf '%6ds  %s (beside the lint and build)\n' $((SECONDS - t)) "$title" >"$beside_logs/$key.time"
    exit "$rc"
  ) &
  beside_pid[$key]=$!
  beside_title[$key]=$title
  background+=("$!")
}
# await KEY: waits for that job, shows its log and records its time; a failure ends the run.
await() {
  local key="$1" rc=0
  wait "${beside_pid[$key]}" || rc=$?
  printf '\n==> %s (ran beside the lint and build)\n' "${beside_title[$key]}"
  cat "$beside_logs/$key.log"
  [ -f "$beside_logs/$key.time" ] && timings+=("$(cat "$beside_logs/$key.time")")
  if [ "$rc" -ne 0 ]; then
    echo "${beside_title[$key]} failed (exit $rc): its log is above" >&2
    exit 1
  fi
}
go_builds() (
  set -e
  scripts/build-cluster-bins.sh --kubernetes "$KUBERNETES_NEWEST" >/dev/null
  scripts/build-prometheus.sh >"$beside_logs/prometheus-bin"
  scripts/build-monitoring-crds.sh >/dev/null
)
beside go "the Go builds: cluster binaries (Kubernetes $KUBERNETES_NEWEST), Prometheus, the Prometheus Operator's CRDs" go_builds
beside cuda "the cuda feature: built with nvcc from PyPI, linked, and run without a GPU" scripts/check-cuda-build.sh
export PACER_KUBERNETES_VERSION="$KUBERNETES_NEWEST"

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

step "the builds beside it, if still running"
await go
await cuda
PACER_PROMETHEUS_BIN=$(cat "$beside_logs/prometheus-bin")
export PACER_PROMETHEUS_BIN

step "tests (unit, the engine on the real model, the operator, its Helm chart and the closed loop on a Kubernetes $KUBERNETES_NEWEST cluster)"
cargo test --workspace --release --locked

# Every kernel set runs the same real-model tests: CPUs with AMX-INT8 run the tiles above and
# AVX-VNNI alone here (`vnni`; elsewhere it is the default again), CPUs without AVX-VNNI take
# the AVX2 kernels, CPUs without AVX2 the portable ones.
# The candle backend's tests (`candle_*`) do not use these kernels; they ran above.
for kernels in vnni avx2 scalar; do
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
