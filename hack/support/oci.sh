# shellcheck shell=bash
# Packing a root filesystem as an OCI image-layout tarball (opencontainers/image-spec
# image-layout.md), with no registry, no Docker engine and no image tool: `oci-layout`,
# `index.json` naming the image (annotations `io.containerd.image.name`, which
# `ctr -n k8s.io images import` takes as the image's name, and `org.opencontainers.image.ref.name`,
# which skopeo's `oci-archive:FILE:REF` takes), and `blobs/sha256/<hex>` with the manifest, the
# config and one gzip layer. Reproducible: fixed mtimes, owners and order, `gzip -n`, so the digest
# changes only with the content. Sourced by hack/build-image.sh and hack/build-sandbox-image.sh.
#
#   oci_pack ROOTFS NAME CONFIG_JSON OUT
#     ROOTFS       directory whose content is the image's only layer
#     NAME         the full image name, e.g. docker.io/library/kubenet-ts:0.2.0
#     CONFIG_JSON  the image config's "config" object (Entrypoint, Cmd, Env, Labels, ...)
#     OUT          the .oci.tar to write (written to a temp file and renamed)

oci_arch() {
  case "$(uname -m)" in
    x86_64) echo amd64 ;;
    aarch64) echo arm64 ;;
    *) echo "oci: unsupported machine $(uname -m)" >&2; return 1 ;;
  esac
}

oci_pack() {
  local rootfs="$1" name="$2" config="$3" out="$4" arch work
  arch="$(oci_arch)"
  work="$(mktemp -d "${TMPDIR:-/tmp}/oci-pack.XXXXXX")"
  mkdir -p "$work/layout/blobs/sha256"
  # put FILE: stores FILE as a blob; prints "<hex> <size>".
  _oci_put() {
    local hex size
    hex="$(sha256sum "$1" | cut -d' ' -f1)"
    size="$(stat -c %s "$1")"
    cp "$1" "$work/layout/blobs/sha256/$hex"
    echo "$hex $size"
  }
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$rootfs" -cf "$work/layer.tar" .
  local diff_id layer_hex layer_size config_hex config_size manifest_hex manifest_size
  diff_id="$(sha256sum "$work/layer.tar" | cut -d' ' -f1)"
  gzip -n -6 -c "$work/layer.tar" >"$work/layer.tar.gz"
  read -r layer_hex layer_size < <(_oci_put "$work/layer.tar.gz")

  printf '%s' "{\"architecture\":\"$arch\",\"os\":\"linux\",\"config\":$config,\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$diff_id\"]},\"history\":[{\"created_by\":\"kubenet-ts hack/\"}]}" >"$work/config.json"
  read -r config_hex config_size < <(_oci_put "$work/config.json")

  printf '%s' "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:$config_hex\",\"size\":$config_size},\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":\"sha256:$layer_hex\",\"size\":$layer_size}]}" >"$work/manifest.json"
  read -r manifest_hex manifest_size < <(_oci_put "$work/manifest.json")

  printf '%s' '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"
  printf '%s' "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\"manifests\":[{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:$manifest_hex\",\"size\":$manifest_size,\"platform\":{\"architecture\":\"$arch\",\"os\":\"linux\"},\"annotations\":{\"io.containerd.image.name\":\"$name\",\"org.opencontainers.image.ref.name\":\"${name##*:}\"}}]}" >"$work/layout/index.json"

  mkdir -p "$(dirname "$out")"
  local partial="$out.partial.$$"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work/layout" -cf "$partial" oci-layout index.json blobs
  mv -f "$partial" "$out"
  OCI_LAYER_BYTES="$(stat -c %s "$work/layer.tar")"
  OCI_MANIFEST_DIGEST="sha256:$manifest_hex"
  rm -rf "$work"
}
