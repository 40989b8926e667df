#!/usr/bin/env bash
# Builds the C programs under native/ into native/build/: kubenet-cni (the CNI forwarding binary
# the agent installs as <cniBinDir>/kubenet) and kubenet-spawner (the agent's plugin exec'er,
# src/cni/spawner.ts). Each is built to a temp file and renamed, so concurrent builds and a
# running copy never see a half-written binary.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p native/build
tmps=()
trap 'rm -f "${tmps[@]}"' EXIT
for name in kubenet-cni kubenet-spawner; do
  out="native/build/$name"
  tmp="$out.partial.$$"
  tmps+=("$tmp")
  cc -O2 -Wall -Wextra -Werror -o "$tmp" "native/$name.c"
  mv -f "$tmp" "$out"
done
