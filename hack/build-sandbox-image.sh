#!/usr/bin/env bash
# Builds the sandbox ("pause") image of the containerd e2e: test/image/pause.c compiled static and
# packed as an OCI image-layout tarball (no registry is reachable, so containerd gets its
# sandbox_image from `ctr -n k8s.io images import` of this file).
#
#   hack/build-sandbox-image.sh [OUT]     OUT defaults to native/build/sandbox-image.oci.tar
#
# Packed by hack/support/oci.sh (one layer with /pause). Only bash, gcc, coreutils, tar and gzip.
# Idempotent: nothing is rebuilt when OUT is newer than this script, oci.sh and pause.c. Safe to run
# concurrently: OUT is written to a temp file and renamed.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${1:-native/build/sandbox-image.oci.tar}"
SRC=test/image/pause.c
# The image name containerd is configured with (test/kit/containerd.ts SANDBOX_IMAGE).
NAME="${SANDBOX_IMAGE_NAME:-kubenet-ts.local/sandbox:1}"

die() { echo "build-sandbox-image: $*" >&2; exit 1; }

if [ -f "$OUT" ] && [ "$OUT" -nt "$SRC" ] && [ "$OUT" -nt "$0" ] && [ "$OUT" -nt hack/support/oci.sh ]; then
  echo "$OUT"
  exit 0
fi

command -v gcc >/dev/null 2>&1 || die "gcc not found (run hack/bootstrap.sh)"
. hack/support/oci.sh

tmp="$(mktemp -d "${TMPDIR:-/tmp}/sandbox-image-build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/rootfs"
gcc -static -Os -s -Wall -Wextra -Werror -o "$tmp/rootfs/pause" "$SRC" || die "gcc -static failed (static libc comes with libc6-dev)"
oci_pack "$tmp/rootfs" "$NAME" '{"Entrypoint":["/pause"],"WorkingDir":"/"}' "$OUT"
echo "$OUT"
