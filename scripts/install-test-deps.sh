#!/usr/bin/env bash
# Installs what building and the test suite need on a fresh Debian machine, only when it is missing (and checks
# that Go 1.26 or newer is there, for the real cluster's binaries: `make kube`):
# protoc (etcd-client generates its gRPC code at build time), kubectl, etcd (the etcd backend's tests), Prometheus
# (promtool and a real server for the alert tests, tests/monitoring.rs), jq (a documented hand-over), and the Python
# `kubernetes` client (an independent client in the tests), from PyPI into a venv at $PYTHON_VENV when python3 lacks it.
set -euo pipefail
need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
[ "${1:-}" = "--build-only" ] || {
  command -v kubectl >/dev/null 2>&1 || need+=(kubernetes-client)
  command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
  command -v promtool >/dev/null 2>&1 || need+=(prometheus)
  command -v python3 >/dev/null 2>&1 || need+=(python3)
  # docs/install/handover.md's carry-over from kube-storage-version-migrator, run as written by tests/cluster_install_guard.rs.
  command -v jq >/dev/null 2>&1 || need+=(jq)
  # The real cluster (scripts/cluster.sh): its certificates, and the health checks of its processes.
  command -v openssl >/dev/null 2>&1 || need+=(openssl)
  command -v curl >/dev/null 2>&1 || need+=(curl)
}
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
  # Debian's prometheus package starts a system Prometheus on :9090 scraping localhost; the tests start their own
  # on free ports with their own config and data, so the system one is only in the way.
  if [[ " ${need[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null 2>&1; then
    $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi
if [ "${1:-}" != "--build-only" ] && [ -n "${PYTHON_VENV:-}" ] \
    && ! "$PYTHON_VENV/bin/python" -c 'import kubernetes' >/dev/null 2>&1; then
  rm -rf "$PYTHON_VENV"
  if python3 -c 'import kubernetes' >/dev/null 2>&1; then
    # python3 already has it: the venv sees the system's packages.
    python3 -m venv --system-site-packages "$PYTHON_VENV"
  else
    # Debian's python3 makes venvs (with pip) only with python3-venv.
    if ! python3 -m venv "$PYTHON_VENV" >/dev/null 2>&1; then
      SUDO=""
      [ "$(id -u)" -eq 0 ] || SUDO="sudo"
      $SUDO apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv
      rm -rf "$PYTHON_VENV"
      python3 -m venv "$PYTHON_VENV"
    fi
    "$PYTHON_VENV/bin/pip" install -q kubernetes
  fi
fi
# Debian's etcd-server package starts a system etcd on 2379; the tests start their own on free ports.
[ "${1:-}" = "--build-only" ] || {
  bash "$(dirname "$0")/check-go.sh"
  kubectl version --client 2>/dev/null | head -1 || true
  etcd --version 2>/dev/null | head -1 || true
  promtool --version 2>/dev/null | head -1 || true
}
