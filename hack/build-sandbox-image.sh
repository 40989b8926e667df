#!/usr/bin/env bash
# Builds the sandbox ("pause") image of the containerd e2e: test/image/pause.c compiled static and
# packed as an OCI image-layout tarball (no registry is reachable, so containerd gets its
# sandbox_image from `ctr -n k8s.io images import` of this file).
#
#   hack/build-sandbox-image.sh [OUT]     OUT defaults to native/build/sandbox-image.oci.tar
#
# The layout (opencontainers/image-spec image-layout.md): `oci-layout`, `index.json` naming the
# image (annotations `org.opencontainers.image.ref.name` and containerd's `io.containerd.image.name`),
# and `blobs/sha256/<hex>` holding the manifest, the config and one gzip layer with /pause.
# Only bash, gcc, coreutils, tar and gzip. Reproducible (fixed mtimes, owners, order; gzip -n), so
# the digest only changes with the program. Idempotent: nothing is rebuilt when OUT is newer than
# this script and pause.c. Safe to run concurrently: OUT is written to a temp file and renamed.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${1:-native/build/sandbox-image.oci.tar}"
SRC=test/image/pause.c
# The image name containerd is configured with (test/helpers/containerd.ts SANDBOX_IMAGE).
NAME="${SANDBOX_IMAGE_NAME:-kubenet-ts.local/sandbox:1}"

die() { echo "build-sandbox-image: $*" >&2; exit 1; }

if [ -f "$OUT" ] && [ "$OUT" -nt "$SRC" ] && [ "$OUT" -nt "$0" ]; then
  echo "$OUT"
  exit 0
fi

command -v gcc >/dev/null 2>&1 || die "gcc not found (run hack/bootstrap.sh)"
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) die "unsupported machine $(uname -m)" ;;
esac

tmp="$(mktemp -d "${TMPDIR:-/tmp}/sandbox-image-build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/rootfs" "$tmp/layout/blobs/sha256"

gcc -static -Os -s -Wall -Wextra -Werror -o "$tmp/rootfs/pause" "$SRC" || die "gcc -static failed (static libc comes with libc6-dev)"

# put FILE: stores FILE as a blob; prints "<hex> <size>".
put() {
  local hex size
  hex="$(sha256sum "$1" | cut -d' ' -f1)"
  size="$(stat -c %s "$1")"
  cp "$1" "$tmp/layout/blobs/sha256/$hex"
  echo "$hex $size"
}

tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -C "$tmp/rootfs" -cf "$tmp/layer.tar" pause
diff_id="$(sha256sum "$tmp/layer.tar" | cut -d' ' -f1)"
gzip -n -9 -c "$tmp/layer.tar" >"$tmp/layer.tar.gz"
read -r layer_hex layer_size < <(put "$tmp/layer.tar.gz")

printf '%s' "{\"architecture\":\"$arch\",\"os\":\"linux\",\"config\":{\"Entrypoint\":[\"/pause\"],\"WorkingDir\":\"/\"},\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$diff_id\"]},\"history\":[{\"created_by\":\"hack/build-sandbox-image.sh\"}]}" >"$tmp/config.json"
read -r config_hex config_size < <(put "$tmp/config.json")

printf '%s' "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:$config_hex\",\"size\":$config_size},\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":\"sha256:$layer_hex\",\"size\":$layer_size}]}" >"$tmp/manifest.json"
read -r manifest_hex manifest_size < <(put "$tmp/manifest.json")

printf '%s' '{"imageLayoutVersion":"1.0.0"}' >"$tmp/layout/oci-layout"
printf '%s' "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\"manifests\":[{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:$manifest_hex\",\"size\":$manifest_size,\"platform\":{\"architecture\":\"$arch\",\"os\":\"linux\"},\"annotations\":{\"io.containerd.image.name\":\"$NAME\",\"org.opencontainers.image.ref.name\":\"${NAME##*:}\"}}]}" >"$tmp/layout/index.json"

mkdir -p "$(dirname "$OUT")"
partial="$OUT.partial.$$"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$tmp/layout" -cf "$partial" oci-layout index.json blobs
mv -f "$partial" "$OUT"
echo "$OUT"
