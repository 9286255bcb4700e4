#!/usr/bin/env bash
# Generates the Prometheus Operator's CustomResourceDefinitions (ServiceMonitor, PodMonitor,
# PrometheusRule, ...) from their Go types with controller-gen, both pinned Go modules, into a
# cache outside the repository, and prints the directory that holds the YAML:
#
#   scripts/build-monitoring-crds.sh
#   PACER_CACHE=/data/pacer scripts/build-monitoring-crds.sh
#
# The chart tests install them into the test apiserver so that the chart's ServiceMonitor and
# PrometheusRule (and the PodMonitors the operator writes) are checked against their real
# schemas. This is how the Prometheus Operator builds its own CRDs; a warm run takes a second.
set -euo pipefail

MONITORING_VERSION="0.95.2"      # github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring
CONTROLLER_TOOLS_VERSION="0.23.0" # sigs.k8s.io/controller-tools (controller-gen)

while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-monitoring-crds: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
out="$cache/crds/prometheus-operator-$MONITORING_VERSION"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export CGO_ENABLED=0

log() { printf 'build-monitoring-crds: %s\n' "$*" >&2; }

if [ ! -s "$out/monitoring.coreos.com_prometheusrules.yaml" ]; then
  command -v go >/dev/null || { log "go is required (https://go.dev/doc/install)"; exit 1; }
  mod=$(mktemp -d)
  trap 'rm -rf "$mod"' EXIT
  printf 'module pacer.dev/monitoring-crds\n\ngo 1.26\n' >"$mod/go.mod"
  (
    cd "$mod"
    api=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring
    gen=sigs.k8s.io/controller-tools/cmd/controller-gen
    log "go build $gen@v$CONTROLLER_TOOLS_VERSION (minutes on a cold cache)"
    go get "$api@v$MONITORING_VERSION" "$gen@v$CONTROLLER_TOOLS_VERSION" >&2
    go build -o "$mod/controller-gen" "$gen"
    mkdir -p "$out.tmp"
    # The options the Prometheus Operator's own Makefile uses for its CRDs.
    "$mod/controller-gen" crd:crdVersions=v1,maxDescLen=0,allowDangerousTypes=true \
      paths="$api/v1" output:crd:dir="$out.tmp"
    rm -rf "$out"
    mv "$out.tmp" "$out"
  )
fi
log "ready: $out"
echo "$out"
