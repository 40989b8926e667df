#!/usr/bin/env bash
# Builds the C programs under native/ into native/build/: kubenet-cni (the CNI forwarding binary
# the agent installs as <cniBinDir>/kubenet; also ipam/kubenet-ipam, the same program) and
# kubenet-spawner (the agent's plugin exec'er, src/cni/spawner.ts). Each is built to a temp file
# and renamed, so concurrent builds and a running copy never see a half-written binary.
#   --optional: without a C compiler, warn and succeed (the package's install step: the library
#               works without the binaries; `kubenet daemon` then refuses to start, saying why).
set -euo pipefail
cd "$(dirname "$0")/.."
optional=false
[ "${1:-}" = "--optional" ] && optional=true
if ! command -v cc >/dev/null 2>&1; then
  if $optional; then
    echo "kubenet-ts: no C compiler (cc): the CNI forwarder and plugin spawner for 'kubenet daemon' were not built; install gcc and run 'npm rebuild kubenet-ts'" >&2
    exit 0
  fi
  echo "build-native: no C compiler (cc): install gcc (hack/bootstrap.sh does)" >&2
  exit 1
fi
mkdir -p native/build/ipam
out=native/build/kubenet-cni
tmp="$out.partial.$$"
ipam=native/build/ipam/kubenet-ipam
ipam_tmp="$ipam.partial.$$"
spawner=native/build/kubenet-spawner
spawner_tmp="$spawner.partial.$$"
trap 'rm -f "$tmp" "$ipam_tmp" "$spawner_tmp"' EXIT
# The forwarder is exec'd once per CNI call (and per pod ADD as kubenet-ipam): linked statically
# it skips the dynamic loader (0.58 against 0.73 ms per exec from a shell, measured). Without a
# static C library (libc.a, Debian's libc6-dev), it is linked dynamically.
if ! cc -O2 -static -Wall -Wextra -Werror -o "$tmp" native/kubenet-cni.c 2>/dev/null; then
  cc -O2 -Wall -Wextra -Werror -o "$tmp" native/kubenet-cni.c
fi
# The same program as the IPAM plugin of the agent's bridge config (it acts on its own name), alone
# in its directory: the agent adds that directory to the bridge plugin's CNI_PATH.
ln -f "$tmp" "$ipam_tmp"
mv -f "$ipam_tmp" "$ipam"
mv -f "$tmp" "$out"
cc -O2 -Wall -Wextra -Werror -o "$spawner_tmp" native/kubenet-spawner.c
mv -f "$spawner_tmp" "$spawner"
