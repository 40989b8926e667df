#!/usr/bin/env bash
# Builds the C programs under native/ into native/build/: kubenet-cni (the CNI forwarding binary
# the agent installs as <cniBinDir>/kubenet) and kubenet-spawner (the agent's plugin exec'er,
# src/cni/spawner.ts). Each is built to a temp file and renamed, so concurrent builds and a
# running copy never see a half-written binary.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p native/build
out=native/build/kubenet-cni
tmp="$out.partial.$$"
spawner=native/build/kubenet-spawner
spawner_tmp="$spawner.partial.$$"
trap 'rm -f "$tmp" "$spawner_tmp"' EXIT
cc -O2 -Wall -Wextra -Werror -o "$tmp" native/kubenet-cni.c
mv -f "$tmp" "$out"
cc -O2 -Wall -Wextra -Werror -o "$spawner_tmp" native/kubenet-spawner.c
mv -f "$spawner_tmp" "$spawner"
