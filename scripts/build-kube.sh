#!/usr/bin/env bash
# `make kube`: builds the real cluster's binaries from their Go modules into $KUBE_BIN_DIR (target/kube/v1.37.2):
# kube-apiserver, kube-controller-manager and kubectl from tools/kube (k8s.io/kubernetes v1.37.2), etcd and etcdctl
# from tools/etcd (go.etcd.io/etcd v3.6). Binaries already there and newer than their module's files are reused, so
# a second `make kube` takes seconds. Needs Go 1.26 or newer and the Go module proxy (the first build downloads
# about 1 GiB of modules into Go's module cache).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
KUBE_BIN_DIR=${KUBE_BIN_DIR:-$root/target/kube/$KUBE_VERSION}

bash "$root/scripts/check-go.sh"

if [ "$KUBE_VERSION" != "v1.37.2" ]; then
  echo "tools/kube pins k8s.io/kubernetes v1.37.2; KUBE_VERSION=$KUBE_VERSION needs a module of its own" >&2
  exit 1
fi
minor=${KUBE_VERSION#v1.}
minor=${minor%%.*}
mkdir -p "$KUBE_BIN_DIR"

# Whether every binary of a module exists and is newer than each file of the module.
fresh() {
  local module=$1
  shift
  local bin
  for bin in "$@"; do
    [ -x "$KUBE_BIN_DIR/$bin" ] || return 1
    if [ -n "$(find "$root/tools/$module" -newer "$KUBE_BIN_DIR/$bin" -type f -print -quit)" ]; then return 1; fi
  done
}

# -trimpath and -s -w as a release builds them: smaller binaries, no local paths. The -X stamps make /version answer
# as a release does (deploy-check and kubectl read it).
build() {
  local module=$1 ldflags=$2
  shift 2
  echo "building $* ($module) into $KUBE_BIN_DIR"
  (cd "$root/tools/$module" && go build -trimpath -ldflags "$ldflags" -o "$KUBE_BIN_DIR/" "${@/#/./cmd/}")
}

if ! fresh kube kube-apiserver kube-controller-manager kubectl; then
  stamp=k8s.io/component-base/version
  build kube "-s -w -X $stamp.gitVersion=$KUBE_VERSION -X $stamp.gitMajor=1 -X $stamp.gitMinor=$minor \
-X $stamp.gitTreeState=clean -X $stamp.buildDate=1970-01-01T00:00:00Z" \
    kube-apiserver kube-controller-manager kubectl
fi
if ! fresh etcd etcd etcdctl; then
  build etcd "-s -w" etcd etcdctl
fi
# Whole, not through `head`: under pipefail, etcd writing to a closed pipe would fail the build (SIGPIPE, 141).
"$KUBE_BIN_DIR/kube-apiserver" --version
"$KUBE_BIN_DIR/etcd" --version
