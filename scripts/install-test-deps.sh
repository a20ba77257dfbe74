#!/usr/bin/env bash
# Installs what building and the test suite need on a fresh Debian machine, only when it is missing:
# protoc (etcd-client generates its gRPC code at build time), kubectl, and etcd (the etcd backend's tests).
set -euo pipefail
need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
[ "${1:-}" = "--build-only" ] || {
  command -v kubectl >/dev/null 2>&1 || need+=(kubernetes-client)
  command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
}
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
# Debian's etcd-server package starts a system etcd on 2379; the tests start their own on free ports.
[ "${1:-}" = "--build-only" ] || {
  kubectl version --client 2>/dev/null | head -1 || true
  etcd --version 2>/dev/null | head -1 || true
}
