#!/usr/bin/env bash
# Builds the images of the local cluster's add-ons from the pinned upstream parts
# (hack/build-upstream.sh), as OCI archives that `ctr -n k8s.io images import` takes (no registry):
#
#   hack/build-addon-images.sh [ADDON...]        ADDON: coredns prometheus (default: both)
#   hack/build-addon-images.sh --print-name ADDON  the image's full name (the part must be built)
#
#   coredns     kubenet-ts.local/coredns:v<release>     -> native/build/coredns-image.oci.tar
#   prometheus  kubenet-ts.local/prometheus:v<release>  -> native/build/prometheus-image.oci.tar
#
# <release> is what the binary itself reports (`coredns -version`, `prometheus --version`), so the
# tag follows the go.mod pin. Each image is one layer, packed by hack/support/oci.sh: the static Go
# binary at /bin/<name>, an /etc/passwd and /etc/group with root and nobody (Prometheus: an empty
# /prometheus for its data, as upstream's image has), nothing else; it runs as
# nobody (65534). CoreDNS binds port 53 as nobody only where the pod allows unprivileged ports
# (hack/cluster/coredns.yaml: the namespaced sysctl net.ipv4.ip_unprivileged_port_start=53);
# Prometheus wants a writable --storage.tsdb.path (an emptyDir) and a --config.file.
# Idempotent: an archive is rebuilt only when its stamp (the binary's cache stamp, this script,
# oci.sh) changes; written to a temp file and renamed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

die() { echo "build-addon-images: $*" >&2; exit 1; }

# release ADDON: the release the built binary reports ("v1.15.0", "v3.16.0").
release() {
  local b="native/build/upstream/$1/$1" v
  [ -x "$b" ] || die "$b is not built (bash hack/build-upstream.sh $1)"
  case "$1" in
    coredns) v="$("$b" -version | sed -n 's/^CoreDNS-\([0-9][0-9.]*\)$/\1/p')" ;;
    prometheus) v="$("$b" --version | sed -n 's/^prometheus, version \([0-9][0-9.]*\) .*/\1/p')" ;;
  esac
  [ -n "$v" ] || die "$1: no version in what $b reports"
  echo "v$v"
}
name() { echo "kubenet-ts.local/$1:$(release "$1")"; }

if [ "${1:-}" = --print-name ]; then
  case "${2:-}" in coredns | prometheus) name "$2"; exit 0 ;; *) die "--print-name coredns|prometheus" ;; esac
fi

addons=("$@")
[ ${#addons[@]} -eq 0 ] && addons=(coredns prometheus)
for a in "${addons[@]}"; do case "$a" in coredns | prometheus) ;; *) die "unknown add-on '$a' (coredns prometheus)" ;; esac; done
bash hack/build-upstream.sh "${addons[@]}" >/dev/null
. hack/support/oci.sh

for a in "${addons[@]}"; do
  out="native/build/$a-image.oci.tar"
  bin="native/build/upstream/$a/$a"
  img="$(name "$a")"
  stamp="$( (echo "$img"; cat "$(readlink -f "native/build/upstream/$a")/../stamp" "$0" hack/support/oci.sh) | sha256sum | cut -c1-32)"
  if [ -f "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$stamp" ]; then echo "$ROOT/$out"; continue; fi
  t0=$SECONDS
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/addon-image.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/rootfs/etc" "$tmp/rootfs/bin"
  # As the upstream images lay them out: the binary in /bin; Prometheus's data in /prometheus, where a
  # pod mounts its volume (the layer's files are root's: the directory is writable by all instead).
  cp "$bin" "$tmp/rootfs/bin/$a"
  chmod 755 "$tmp/rootfs/bin/$a"
  if [ "$a" = prometheus ]; then mkdir -p "$tmp/rootfs/prometheus" && chmod 1777 "$tmp/rootfs/prometheus"; fi
  printf '%s\n' 'root:x:0:0:root:/:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' >"$tmp/rootfs/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$tmp/rootfs/etc/group"
  case "$a" in
    coredns) config='{"User":"65534:65534","Entrypoint":["/bin/coredns"],"ExposedPorts":{"53/tcp":{},"53/udp":{}},"WorkingDir":"/"}' ;;
    prometheus) config='{"User":"65534:65534","Entrypoint":["/bin/prometheus"],"Cmd":["--config.file=/etc/prometheus/prometheus.yml","--storage.tsdb.path=/prometheus"],"ExposedPorts":{"9090/tcp":{}},"WorkingDir":"/prometheus"}' ;;
  esac
  oci_pack "$tmp/rootfs" "$img" "$config" "$out"
  echo "$stamp" >"$out.stamp"
  rm -rf "$tmp"
  trap - EXIT
  echo "build-addon-images: $img -> $out ($(stat -c %s "$out") bytes, $((SECONDS - t0)) s)" >&2
  echo "$ROOT/$out"
done
