#!/usr/bin/env bash
# Fails with a clear message unless Go 1.26 or newer is on the PATH: the real cluster's binaries (tools/kube,
# k8s.io/kubernetes v1.37.2, which declares go 1.26.0) are built from source.
set -euo pipefail
if ! command -v go >/dev/null 2>&1; then
  echo "Go 1.26 or newer is needed to build the real cluster (make kube), and no 'go' is on the PATH:" >&2
  echo "install it from https://go.dev/dl/ (Debian's golang package is older)." >&2
  exit 1
fi
version=$(go env GOVERSION)
v=${version#go}
major=${v%%.*}
rest=${v#*.}
minor=${rest%%[^0-9]*}
if [ "$major" -lt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -lt 26 ]; }; then
  echo "Go 1.26 or newer is needed to build the real cluster (make kube); $(command -v go) is $version." >&2
  exit 1
fi
