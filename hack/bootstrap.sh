#!/usr/bin/env bash
# Installs what a fresh Debian 12 node lacks for kubenet-ts, builds the pinned reference CNI plugins,
# then the npm dependencies. Idempotent and cheap when everything is there (~0.2 s: one dpkg-query,
# the plugins' build stamp, one comparison of the lockfiles), so `npm test` runs it first (pretest)
# and `npm run demo` too: packages already present are not fetched again, the plugins already built
# at their pinned version are not built again (hack/build-upstream.sh), and npm ci runs only when
# node_modules does not hold what package-lock.json pins.
set -euo pipefail
cd "$(dirname "$0")/.."

# Runtime: libnl (the agent's netlink), iproute2 (tc), iptables/ebtables, util-linux (flock), kmod.
# Tests and benches: iperf3, ping, dnsmasq (dhcp e2e), openssl (test PKI), gcc + libc6-dev (the native
# binaries, static), libseccomp-dev + pkg-config (runc), mmdebstrap (the image's Debian files).
PKGS=(libnl-3-200 libnl-route-3-200 iproute2 iptables ebtables util-linux kmod iperf3 iputils-ping dnsmasq-base openssl gcc libc6-dev libseccomp-dev pkg-config mmdebstrap)

# One dpkg-query for all of them (a package dpkg has never heard of is not listed, and makes it exit 1).
installed=" $({ dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' "${PKGS[@]}" 2>/dev/null || true; } | awk '$1 == "ii" { printf "%s ", $2 }')"
missing=()
for p in "${PKGS[@]}"; do
  [[ "$installed" == *" $p "* ]] || missing+=("$p")
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

# npm ci when node_modules does not hold exactly what package-lock.json pins: npm's own record of
# what it installed (node_modules/.package-lock.json) compared entry by entry, optional packages of
# other platforms absent there. By content, not by mtime: a checkout that rewrites package-lock.json
# unchanged costs no reinstall.
lock_matches() {
  node -e '
    const fs = require("fs");
    const want = JSON.parse(fs.readFileSync("package-lock.json", "utf8")).packages ?? {};
    const have = JSON.parse(fs.readFileSync("node_modules/.package-lock.json", "utf8")).packages ?? {};
    const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
    const ok = Object.entries(want).every(([k, v]) => k === "" || (k in have ? same(have[k], v) : v.optional === true))
      && Object.keys(have).every((k) => k in want);
    process.exit(ok ? 0 : 1);
  ' 2>/dev/null
}
if [ ! -d node_modules ] || ! lock_matches; then
  echo "bootstrap: npm ci"
  npm ci --no-audit --no-fund --loglevel=error
fi
