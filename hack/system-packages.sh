#!/usr/bin/env bash
# Debian packages the tests drive as real parts, installed unless already on PATH:
# `prometheus` (the server the InferencePipeline tuner queries) and `chromium` (the
# browser the dashboard tests run). Needs root or passwordless sudo and the Debian mirror.
set -euo pipefail
missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  sudo="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
echo "installing ${missing[*]}"
$sudo apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
  $sudo apt-get update >/dev/null
  $sudo apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
}
command -v prometheus >/dev/null
command -v chromium >/dev/null
