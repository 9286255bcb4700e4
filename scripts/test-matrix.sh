#!/usr/bin/env bash
# The rest of the version matrix (docs/testing.md: version matrix): builds the oldest supported
# Kubernetes (once; cached like the newest) and runs the cluster tests against it. `.ci/run`
# tests the newest version only, to stay within CI's time; run this before a release or after
# changing the CRD, the RBAC or the children the operator writes.
#
#   scripts/test-matrix.sh                 # Kubernetes 1.34.4
#   scripts/test-matrix.sh --kubernetes 1.35.3
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

version=1.34.4
while [ $# -gt 0 ]; do
  case "$1" in
    --kubernetes) version="$2"; shift 2 ;;
    *) echo "usage: $0 [--kubernetes VERSION]" >&2; exit 2 ;;
  esac
done

start=$SECONDS
printf '==> cluster binaries (Kubernetes %s)\n' "$version"
scripts/build-cluster-bins.sh --kubernetes "$version" >/dev/null
built=$SECONDS
printf '\n==> the operator on a Kubernetes %s cluster\n' "$version"
PACER_KUBERNETES_VERSION="$version" cargo test --workspace --release --locked \
  --test integration -- validation:: reconcile:: podmonitor::
printf '\n==> durations: binaries %ds, tests %ds\n' $((built - start)) $((SECONDS - built))
