#!/usr/bin/env bash
# Builds the binaries of Pacer's test cluster from their upstream Go modules, pinned, into a cache
# outside the repository, and prints the directory that holds them:
#
#   kube-apiserver, kube-controller-manager,  k8s.io/kubernetes (default v1.37.2)
#   kube-scheduler
#   etcd                                      go.etcd.io/etcd/server/v3
#   kwok                                      sigs.k8s.io/kwok (fake nodes: pods go Ready without a kubelet)
#   helm                                      helm.sh/helm/v4
#
#   scripts/build-cluster-bins.sh                       # newest supported Kubernetes
#   scripts/build-cluster-bins.sh --kubernetes 1.34.4   # oldest in the version matrix
#   PACER_CACHE=/data/pacer scripts/build-cluster-bins.sh
#
# Layout: $PACER_CACHE/bin/kubernetes-<v>/{kube-apiserver,kube-controller-manager},
# $PACER_CACHE/bin/etcd-<v>/etcd, .../kwok-<v>/kwok, .../helm-<v>/helm; the printed directory
# ($PACER_CACHE/bin/cluster-<k8s v>) holds symlinks to one consistent set. A binary already built
# is reused, so a warm run takes a second. Nothing built here belongs in the repository.
#
# k8s.io/kubernetes requires its ~30 staging modules (k8s.io/api, k8s.io/apiserver, ...) at
# v0.0.0 and replaces them with ./staging paths that its module zip does not carry, so a
# throwaway consumer module replaces each with the published v0.<minor>.<patch> of the same
# release, read from that version's own go.mod.
set -euo pipefail

KUBERNETES_VERSION="1.37.2"
ETCD_VERSION="3.7.3"
KWOK_VERSION="0.8.0"
HELM_VERSION="4.3.2"

while [ $# -gt 0 ]; do
  case "$1" in
    --kubernetes) KUBERNETES_VERSION="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-cluster-bins: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
bin="$cache/bin"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export CGO_ENABLED=0

log() { printf 'build-cluster-bins: %s\n' "$*" >&2; }
command -v go >/dev/null || { log "go is required (https://go.dev/doc/install)"; exit 1; }

# build_in_module MODULE_DIR VERSION OUT_DIR LDFLAGS PACKAGE...
# Builds each PACKAGE (a `main` package path, named after its last element) of the module that
# MODULE_DIR's go.mod requires, at VERSION, into OUT_DIR. `go get PACKAGE@VERSION` pins the
# version (a bare `go get PACKAGE` would upgrade it to the newest release).
build_in_module() {
  local dir="$1" version="$2" out="$3" ldflags="$4"
  shift 4
  (
    cd "$dir"
    for pkg in "$@"; do
      local name="${pkg##*/}"
      case "$pkg" in go.etcd.io/etcd/server/v3) name=etcd ;; esac
      log "go build $pkg@v$version"
      go get "$pkg@v$version" >&2
      go build -trimpath -ldflags="-s -w $ldflags" -o "$out/.$name.tmp" "$pkg"
      mv "$out/.$name.tmp" "$out/$name"
    done
  )
}

# A module directory with go.mod requiring MODULE@VERSION (plus optional extra lines).
make_module() {
  local module="$1" version="$2" extra="${3:-}"
  local dir
  dir=$(mktemp -d)
  {
    printf 'module pacer.dev/cluster-bins\n\ngo 1.26\n\nrequire %s v%s\n' "$module" "$version"
    printf '%s\n' "$extra"
  } >"$dir/go.mod"
  echo "$dir"
}

k8s_dir="$bin/kubernetes-$KUBERNETES_VERSION"
if [ ! -x "$k8s_dir/kube-apiserver" ] || [ ! -x "$k8s_dir/kube-controller-manager" ] \
  || [ ! -x "$k8s_dir/kube-scheduler" ]; then
  mkdir -p "$k8s_dir"
  log "fetching k8s.io/kubernetes v$KUBERNETES_VERSION"
  upstream_mod=$(go mod download -json "k8s.io/kubernetes@v$KUBERNETES_VERSION" \
    | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
  staging_version="v0.${KUBERNETES_VERSION#1.}"
  replaces=$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$upstream_mod" \
    | while read -r m; do printf 'replace %s => %s %s\n' "$m" "$m" "$staging_version"; done)
  mod=$(make_module k8s.io/kubernetes "$KUBERNETES_VERSION" "$replaces")
  log "building kube-apiserver, kube-controller-manager and kube-scheduler (minutes on a cold cache)"
  # The version the binaries report (/version, and what helm's kubeVersion checks compare).
  v="k8s.io/component-base/version"
  minor="${KUBERNETES_VERSION#1.}"; minor="${minor%%.*}"
  ldflags="-X $v.gitVersion=v$KUBERNETES_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
  build_in_module "$mod" "$KUBERNETES_VERSION" "$k8s_dir" "$ldflags" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler
  rm -rf "$mod"
fi

etcd_dir="$bin/etcd-$ETCD_VERSION"
if [ ! -x "$etcd_dir/etcd" ]; then
  mkdir -p "$etcd_dir"
  mod=$(make_module go.etcd.io/etcd/server/v3 "$ETCD_VERSION")
  build_in_module "$mod" "$ETCD_VERSION" "$etcd_dir" "" go.etcd.io/etcd/server/v3
  rm -rf "$mod"
fi

kwok_dir="$bin/kwok-$KWOK_VERSION"
if [ ! -x "$kwok_dir/kwok" ]; then
  mkdir -p "$kwok_dir"
  mod=$(make_module sigs.k8s.io/kwok "$KWOK_VERSION")
  build_in_module "$mod" "$KWOK_VERSION" "$kwok_dir" "-X sigs.k8s.io/kwok/pkg/consts.Version=v$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
  rm -rf "$mod"
fi

helm_dir="$bin/helm-$HELM_VERSION"
if [ ! -x "$helm_dir/helm" ]; then
  mkdir -p "$helm_dir"
  mod=$(make_module helm.sh/helm/v4 "$HELM_VERSION")
  build_in_module "$mod" "$HELM_VERSION" "$helm_dir" "-X helm.sh/helm/v4/internal/version.version=v$HELM_VERSION" helm.sh/helm/v4/cmd/helm
  rm -rf "$mod"
fi

set_dir="$bin/cluster-$KUBERNETES_VERSION"
mkdir -p "$set_dir"
ln -sfn "$k8s_dir/kube-apiserver" "$set_dir/kube-apiserver"
ln -sfn "$k8s_dir/kube-controller-manager" "$set_dir/kube-controller-manager"
ln -sfn "$k8s_dir/kube-scheduler" "$set_dir/kube-scheduler"
ln -sfn "$etcd_dir/etcd" "$set_dir/etcd"
ln -sfn "$kwok_dir/kwok" "$set_dir/kwok"
ln -sfn "$helm_dir/helm" "$set_dir/helm"
log "ready: $set_dir"
echo "$set_dir"
