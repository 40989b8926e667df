#!/usr/bin/env bash
# dpkg-register.sh TREE: records the .debs that mmdebstrap --variant=extract unpacked into TREE
# (its --extract-hook, while they are still in TREE/var/cache/apt/archives) in TREE's dpkg
# database, as `dpkg --unpack` would record them without running any maintainer script: a
# status stanza (the package's control fields, `Status: install ok unpacked`, `Conffiles:` with
# the md5 of each conffile as shipped), info/PKG.list (every path the package unpacked) and
# info/PKG.md5sums (the package's own). The extract variant leaves that database empty; with it,
# `dpkg-query --admindir=TREE/var/lib/dpkg -W|-S|-s` says which package and version each file of
# the tree comes from (hack/build-image.sh: the image's /var/lib/dpkg/status.d and its SBOM).
set -euo pipefail
tree="$1"
db="$tree/var/lib/dpkg"
mkdir -p "$db/info"
# The info database's multiarch layout (Multi-Arch: same packages' files named PKG:ARCH.*).
echo 1 >"$db/info/format"
debs=("$tree"/var/cache/apt/archives/*.deb)
[ -f "${debs[0]}" ] || { echo "dpkg-register: no .deb in $tree/var/cache/apt/archives" >&2; exit 1; }
ctl="$(mktemp -d "${TMPDIR:-/tmp}/dpkg-register.XXXXXX")"
trap 'rm -rf "$ctl"' EXIT
status="$db/status.new"
: >"$status"
for f in "${debs[@]}"; do
  rm -rf "$ctl" && mkdir -p "$ctl"
  dpkg-deb --control "$f" "$ctl"
  pkg="$(dpkg-deb --field "$f" Package)"
  # dpkg names the info files of a Multi-Arch: same package PKG:ARCH.
  info="$pkg"
  [ "$(dpkg-deb --field "$f" Multi-Arch)" = same ] && info="$pkg:$(dpkg-deb --field "$f" Architecture)"
  dpkg-deb --fsys-tarfile "$f" | tar -t | sed -e 's#^\./#/#' -e 's#/$##' -e 's#^$#/.#' >"$db/info/$info.list"
  [ ! -f "$ctl/md5sums" ] || cp "$ctl/md5sums" "$db/info/$info.md5sums"
  {
    cat "$ctl/control"
    echo 'Status: install ok unpacked'
    if [ -s "$ctl/conffiles" ]; then
      echo 'Conffiles:'
      while read -r path _; do
        [ -n "$path" ] || continue
        echo " $path $(md5sum <"$tree$path" | cut -d' ' -f1)"
      done <"$ctl/conffiles"
    fi
    echo
  } >>"$status"
done
mv "$status" "$db/status"
