#!/usr/bin/env bash
# Build the pinned local-control-plane binaries into a versioned cache.
#
# Why a wrapper module: k8s.io/kubernetes' own go.mod replaces its ~30 staging
# modules with ./staging paths, so `go install k8s.io/kubernetes/cmd/...@v`
# fails. We generate a tiny module that requires k8s.io/kubernetes and replaces
# every staging module (read from the downloaded go.mod, never typed by hand)
# with its published v0.X.Y twin -- the technique scheduler-plugins uses.
#
# Layout: $CHRONOTOPE_CACHE_DIR/bin/<component>-<version>/<binary>
# A warm run finds every binary and builds nothing.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.33.13}"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
HELM_VERSION="${HELM_VERSION:-v3.18.6}"
ETCD_VERSION="${ETCD_VERSION:-v3.5.21}"
CACHE="${CHRONOTOPE_CACHE_DIR:-$HOME/.cache/chronotope}"
export GOFLAGS="-buildvcs=false"
export CGO_ENABLED=0

log() { printf '[build-binaries] %s\n' "$*" >&2; }

if ! command -v go >/dev/null 2>&1; then
  log "error: Go is not installed (need Go >= 1.24 to build the local control plane)."
  log "       Install Go, or set CHRONOTOPE_BIN_DIR to a folder holding kube-apiserver,"
  log "       kube-controller-manager, kube-scheduler, etcd, kwok and helm."
  exit 3
fi

staging_minor="v0.${K8S_VERSION#v1.}"   # v1.33.13 -> v0.33.13
k8s_minor="$(echo "$K8S_VERSION" | cut -d. -f2)"

build_k8s() {
  local out="$CACHE/bin/kubernetes-$K8S_VERSION"
  if [[ -x "$out/kube-apiserver" && -x "$out/kube-controller-manager" && -x "$out/kube-scheduler" ]]; then
    log "kubernetes $K8S_VERSION: cached"
    return
  fi
  local src="$CACHE/src/kubernetes-$K8S_VERSION"
  rm -rf "$src"; mkdir -p "$src"
  log "kubernetes $K8S_VERSION: generating wrapper module in $src"
  (
    cd "$src"
    go mod init chronotope.dev/k8s-build >/dev/null 2>&1
    local gomod
    gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
    # every "k8s.io/x => ./staging/src/k8s.io/x" line becomes a replace to the published twin
    local n=0
    while read -r mod; do
      go mod edit -replace="$mod=$mod@$staging_minor"
      n=$((n + 1))
    done < <(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' "$gomod")
    log "kubernetes $K8S_VERSION: replaced $n staging modules with $staging_minor"
    go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
    go mod edit -go="$(sed -n 's/^go //p' "$gomod")"
    cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
    go mod tidy
    local ld="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld="$ld -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor -X $pkg.gitTreeState=clean"
    done
    mkdir -p "$out.tmp"
    for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
      log "kubernetes $K8S_VERSION: building $cmd"
      go build -trimpath -ldflags "$ld" -o "$out.tmp/$cmd" "k8s.io/kubernetes/cmd/$cmd"
    done
  )
  rm -rf "$out"; mv "$out.tmp" "$out"
}

build_etcd() {
  local out="$CACHE/bin/etcd-$ETCD_VERSION"
  if [[ -x "$out/etcd" ]]; then log "etcd $ETCD_VERSION: cached"; return; fi
  local src="$CACHE/src/etcd-$ETCD_VERSION"
  rm -rf "$src"; mkdir -p "$src"
  (
    cd "$src"
    go mod init chronotope.dev/etcd-build >/dev/null 2>&1
    cat > main.go <<'GO'
// Package main wraps etcdmain so etcd builds from its published module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    go mod tidy
    log "etcd $ETCD_VERSION: building"
    mkdir -p "$out.tmp"
    go build -trimpath -ldflags "-s -w" -o "$out.tmp/etcd" .
  )
  rm -rf "$out"; mv "$out.tmp" "$out"
}

go_install() {  # name module version binary
  local name="$1" mod="$2" ver="$3" bin="$4"
  local out="$CACHE/bin/$name-$ver"
  if [[ -x "$out/$bin" ]]; then log "$name $ver: cached"; return; fi
  log "$name $ver: go install $mod@$ver"
  mkdir -p "$out.tmp"
  GOBIN="$out.tmp" go install -trimpath -ldflags "-s -w" "$mod@$ver"
  rm -rf "$out"; mv "$out.tmp" "$out"
}

main() {
  mkdir -p "$CACHE/bin"
  # Serialise concurrent builds (a test run and the demo may both ask): the
  # second waits, then finds everything cached.
  exec 9>"$CACHE/.build.lock"
  if ! flock -n 9; then
    log "another build is running; waiting for it"
    flock 9
  fi
  local only="${1:-all}"
  local start=$SECONDS
  case "$only" in
    all|kubernetes) build_k8s ;;&
    all|etcd) build_etcd ;;&
    all|kwok) go_install kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION" kwok ;;&
    all|helm) go_install helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" helm ;;&
    *) ;;
  esac
  log "done in $((SECONDS - start))s; binaries under $CACHE/bin"
}

main "$@"
