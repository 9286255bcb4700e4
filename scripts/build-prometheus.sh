#!/usr/bin/env bash
# Builds `prometheus` and `promtool` from the Go module github.com/prometheus/prometheus, pinned,
# into a cache outside the repository, and prints the directory that holds them:
#
#   scripts/build-prometheus.sh                     # v0.316.0 (= Prometheus 3.16.0)
#   PACER_CACHE=/data/pacer scripts/build-prometheus.sh
#
# Layout: $PACER_CACHE/bin/prometheus-<v>/{prometheus,promtool}. A binary already built is
# reused, so a warm run takes a second. The web UI's assets are not built in (the tests use the
# HTTP API only); nothing built here belongs in the repository.
#
# The Go module's versions are v0.<minor*100+...>: v0.316.0 is the release tagged v3.16.0.
set -euo pipefail

PROMETHEUS_MODULE_VERSION="0.316.0"
PROMETHEUS_VERSION="3.16.0"

while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-prometheus: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
out="$cache/bin/prometheus-$PROMETHEUS_VERSION"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export CGO_ENABLED=0

log() { printf 'build-prometheus: %s\n' "$*" >&2; }

if [ ! -x "$out/prometheus" ] || [ ! -x "$out/promtool" ]; then
  command -v go >/dev/null || { log "go is required (https://go.dev/doc/install)"; exit 1; }
  mkdir -p "$out"
  mod=$(mktemp -d)
  trap 'rm -rf "$mod"' EXIT
  printf 'module pacer.dev/prometheus-bin\n\ngo 1.26\n\nrequire github.com/prometheus/prometheus v%s\n' \
    "$PROMETHEUS_MODULE_VERSION" >"$mod/go.mod"
  # What `prometheus --version` and the build-info API report.
  v="github.com/prometheus/common/version"
  ldflags="-s -w -X $v.Version=$PROMETHEUS_VERSION -X $v.Branch=release -X $v.BuildUser=pacer"
  (
    cd "$mod"
    for pkg in github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool; do
      name="${pkg##*/}"
      log "go build $pkg@v$PROMETHEUS_MODULE_VERSION (minutes on a cold cache)"
      # `go get PKG@VERSION` pins the version (a bare `go get PKG` would take the newest).
      go get "$pkg@v$PROMETHEUS_MODULE_VERSION" >&2
      go build -trimpath -ldflags="$ldflags" -o "$out/.$name.tmp" "$pkg"
      mv "$out/.$name.tmp" "$out/$name"
    done
  )
fi
log "ready: $out"
echo "$out"
