#!/usr/bin/env bash
# Sets up and runs Pacer's tests on a fresh machine: fetches the real model and builds the test
# cluster's binaries (kube-apiserver, controller manager, scheduler, etcd, kwok, helm from their
# upstream Go modules) and the Prometheus Operator's CRDs (controller-gen on its Go types), all
# cached outside the repository, checks formatting and lints, and
# runs every test tier that exists so far. `.ci/run` calls exactly this.
#
# Needs: Rust (rustup), Python 3 with pip, Go >= 1.26, openssl.
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

# The version matrix: the newest Kubernetes runs every test, the oldest the cluster tests again.
KUBERNETES_NEWEST=1.37.2
KUBERNETES_OLDEST=1.34.4
step "cluster binaries (Kubernetes $KUBERNETES_NEWEST and $KUBERNETES_OLDEST)"
scripts/build-cluster-bins.sh --kubernetes "$KUBERNETES_NEWEST" >/dev/null
scripts/build-cluster-bins.sh --kubernetes "$KUBERNETES_OLDEST" >/dev/null
export PACER_KUBERNETES_VERSION="$KUBERNETES_NEWEST"

step "Prometheus Operator CRDs (for the chart's server-side dry-runs)"
scripts/build-monitoring-crds.sh >/dev/null

step "format"
cargo fmt --all -- --check

step "lint"
cargo clippy --workspace --all-targets --release --locked -- -D warnings

step "tests (unit, the engine on the real model, the operator and its Helm chart on a Kubernetes $KUBERNETES_NEWEST cluster)"
cargo test --workspace --release --locked

# Every kernel set runs the same real-model tests: CPUs without AVX-VNNI take the AVX2
# kernels, CPUs without AVX2 the portable ones.
for kernels in avx2 scalar; do
  step "engine on the real model with the $kernels kernels"
  PACER_KERNELS=$kernels cargo test --release --locked -p pacer-engine --test model --test reference
done

step "the operator on a Kubernetes $KUBERNETES_OLDEST cluster"
PACER_KUBERNETES_VERSION="$KUBERNETES_OLDEST" cargo test --release --locked -p pacer-operator \
  --test validation --test reconcile

step "the official openai Python client against pacer-engine serve"
scripts/test-openai-client.sh "$CARGO_TARGET_DIR/release/pacer-engine"
