#!/usr/bin/env bash
# Installs what a fresh Debian 12 node lacks for kubenet-ts, builds the pinned reference CNI plugins,
# then the npm dependencies. Idempotent: packages already present are not fetched again, and the
# plugins already built at their pinned version are not built again (hack/build-upstream.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# Runtime: libnl (the agent's netlink), iproute2 (tc), iptables/ebtables, util-linux (flock), kmod.
# Tests and benches: iperf3, ping, dnsmasq (dhcp e2e), openssl (test PKI), gcc + libc6-dev (the native
# binaries, static), libseccomp-dev + pkg-config (runc), mmdebstrap (the image's Debian files).
PKGS=(libnl-3-200 libnl-route-3-200 iproute2 iptables ebtables util-linux kmod iperf3 iputils-ping dnsmasq-base openssl gcc libc6-dev libseccomp-dev pkg-config mmdebstrap)

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

# The reference CNI plugins at their pinned version (cached by version); containerd and runc, which
# only the tests run, are built by `npm test` (build:test-tools).
bash hack/build-upstream.sh cni-plugins >/dev/null

if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "bootstrap: npm ci"
  npm ci --no-audit --no-fund --loglevel=error
fi
