#!/usr/bin/env bash
# Install Debian's `prometheus` (the real server the InferencePipeline tuner tests query)
# unless it is already on PATH. Needs root or passwordless sudo and the Debian mirror.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1; then
  exit 0
fi
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  sudo="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1 || {
  $sudo apt-get update >/dev/null
  $sudo apt-get install -y --no-install-recommends prometheus >/dev/null
}
command -v prometheus >/dev/null
