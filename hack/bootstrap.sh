#!/usr/bin/env bash
# Installs what a fresh Debian 12 node lacks for kubenet-ts, then the npm dependencies.
# Idempotent: packages already present are not fetched again; safe to run on every CI start.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(containernetworking-plugins libnl-3-200 libnl-route-3-200 iproute2 iperf3 iputils-ping iptables ebtables util-linux dnsmasq-base kmod gcc libc6-dev golang-go golang-github-appc-cni-dev containerd runc openssl)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "bootstrap: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "bootstrap: npm ci"
  npm ci --no-audit --no-fund --loglevel=error
fi
