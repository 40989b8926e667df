#!/usr/bin/env bash
# Builds the CNI forwarding binary native/kubenet-cni.c into native/build/kubenet-cni (what the
# agent installs as <cniBinDir>/kubenet). Built to a temp file and renamed, so concurrent builds
# and a running copy never see a half-written binary.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p native/build
out=native/build/kubenet-cni
tmp="$out.partial.$$"
trap 'rm -f "$tmp"' EXIT
cc -O2 -Wall -Wextra -Werror -o "$tmp" native/kubenet-cni.c
mv -f "$tmp" "$out"
