#!/usr/bin/env bash
# Builds the CNI forwarding binary native/kubenet-cni.c into native/build/kubenet-cni (what the
# agent installs as <cniBinDir>/kubenet). Built to a temp file and renamed, so concurrent builds
# and a running copy never see a half-written binary.
#   --optional: without a C compiler, warn and succeed (the package's install step: the library
#               works without the binary; `kubenet daemon` then refuses to start, saying why).
set -euo pipefail
cd "$(dirname "$0")/.."
optional=false
[ "${1:-}" = "--optional" ] && optional=true
cc="${CC:-cc}"
if ! command -v "$cc" >/dev/null 2>&1; then
  if $optional; then
    echo "kubenet-ts: no C compiler ($cc): the CNI forwarder for 'kubenet daemon' was not built; install gcc and run 'npm rebuild kubenet-ts'" >&2
    exit 0
  fi
  echo "build-native: no C compiler ($cc): install gcc (hack/bootstrap.sh does)" >&2
  exit 1
fi
mkdir -p native/build
out=native/build/kubenet-cni
tmp="$out.partial.$$"
trap 'rm -f "$tmp"' EXIT
"$cc" -O2 -Wall -Wextra -Werror -o "$tmp" native/kubenet-cni.c
mv -f "$tmp" "$out"
