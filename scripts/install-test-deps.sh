#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine, only when it is missing.
set -euo pipefail
need=()
command -v kubectl >/dev/null 2>&1 || need+=(kubernetes-client)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
kubectl version --client 2>/dev/null | head -1 || true
