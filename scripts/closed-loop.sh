#!/usr/bin/env bash
# Runs the closed loop in a test cluster and keeps its timeline: a kube-apiserver, etcd, the
# controller manager and the scheduler built from their upstream modules; Prometheus built from
# its module with config/prometheus/prometheus.yaml; the operator installed by `helm install` of
# charts/pacer; engine pods serving the default model as processes under the test node agent
# (tests/src/agent.rs, for tests only). The load steps up, holds and steps down; then a tier
# rollout under light load; then an engine process is killed. About 5 minutes on 2 cores.
#
#   scripts/closed-loop.sh [OUT]      # OUT defaults to ./closed-loop
#
# Writes OUT/closed-loop.svg and .png (the timeline) and OUT/closed-loop.json (the InferenceService's
# status every 2 s, kubectl's printer columns, the Events, the clients' P95s per 10 s).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
out=$(mkdir -p "${1:-closed-loop}" && cd "${1:-closed-loop}" && pwd)
PACER_MODEL=$(scripts/fetch-model.sh); export PACER_MODEL
export PACER_KUBERNETES_VERSION="${PACER_KUBERNETES_VERSION:-1.37.2}"
scripts/build-cluster-bins.sh --kubernetes "$PACER_KUBERNETES_VERSION" >/dev/null
PACER_PROMETHEUS_BIN=$(scripts/build-prometheus.sh); export PACER_PROMETHEUS_BIN
cargo build --release --locked -q -p pacer-engine -p pacer-operator
PACER_CLOSED_LOOP_OUT="$out" cargo test --release --locked -p pacer-operator --test closed_loop -- --nocapture
echo "timeline: $out/closed-loop.svg (.png) and $out/closed-loop.json" >&2
