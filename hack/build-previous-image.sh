#!/usr/bin/env bash
# Builds the agent's image of the previous release, for the rolling-upgrade e2e
# (test/e2e/release-upgrade.test.ts): the commit PREVIOUS below, exported with `git archive`, its
# dependencies installed with `npm ci`, and its own hack/build-image.sh run on it, so the image is
# what that release built. Its name carries the commit, `kubenet-ts:previous-<sha7>` (both releases
# are version 0.2.0, and a node's containerd keeps one image per name).
#
#   hack/build-previous-image.sh                  builds it (cached: see below) and prints the archive's path
#   hack/build-previous-image.sh --print-name     the image's name (kubenet-ts:previous-<sha7>)
#   hack/build-previous-image.sh --print-path     where the archive is (or will be), without building
#   hack/build-previous-image.sh --print-manifest that release's manifests/kubenet.yaml, naming this image
#   hack/build-previous-image.sh --optional       as without it, but without root: say so and build nothing
#
# PREVIOUS is the last commit whose agent kept one htb tree per direction under a capacity (the
# next one, 68dbb95, made shards the default): the upgrade that moves running pods to another
# layout. The archive is cached by commit under $KUBENET_CACHE_DIR/previous (default
# /var/cache/kubenet-ts): built once per machine (~3 min), then nothing to do.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PREVIOUS=fddd43c899278ea0661177ae295bb8acb3763841
SHORT="${PREVIOUS:0:7}"
TAG="kubenet-ts:previous-$SHORT"
CACHE="${KUBENET_CACHE_DIR:-/var/cache/kubenet-ts}/previous"
OUT="$CACHE/kubenet-image-$SHORT.oci.tar"
die() {
  echo "build-previous-image: $*" >&2
  exit 1
}

# The commit must be in this clone; a shallow one (CI's, say) fetches its history once from its origin.
need_previous() {
  if ! git cat-file -e "$PREVIOUS^{commit}" 2>/dev/null && [ "$(git rev-parse --is-shallow-repository)" = true ]; then
    echo "build-previous-image: this clone is shallow; fetching its history for $PREVIOUS" >&2
    git fetch --quiet --unshallow >&2 || true
  fi
  git cat-file -e "$PREVIOUS^{commit}" 2>/dev/null || die "this clone lacks $PREVIOUS (a shallow clone whose origin is out of reach? git fetch --unshallow)"
}

case "${1:-}" in
--print-name)
  echo "$TAG"
  exit 0
  ;;
--print-path)
  echo "$OUT"
  exit 0
  ;;
--print-manifest)
  need_previous
  git show "$PREVIOUS:manifests/kubenet.yaml" | sed -E "s#image: kubenet-ts:[^ ]+#image: $TAG#"
  exit 0
  ;;
--optional)
  if [ "$(id -u)" -ne 0 ]; then
    echo "build-previous-image: not root; the previous release's image is not built (the release-upgrade e2e needs it)" >&2
    exit 0
  fi
  ;;
'') ;;
*) die "unknown argument $1" ;;
esac

[ "$(id -u)" -eq 0 ] || die "run as root (hack/build-image.sh needs it)"
if [ -f "$OUT" ]; then
  echo "$OUT"
  exit 0
fi
need_previous
mkdir -p "$CACHE"
t0=$SECONDS
tmp="$(mktemp -d "${TMPDIR:-/tmp}/kubenet-previous.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/src" "$tmp/layout"
git archive "$PREVIOUS" | tar -x -C "$tmp/src"
echo "build-previous-image: building $PREVIOUS's image (npm ci, its hack/build-image.sh)" >&2
(
  cd "$tmp/src"
  npm ci --no-audit --no-fund --loglevel=error >"$tmp/npm-ci.log" 2>&1 || {
    tail -20 "$tmp/npm-ci.log" >&2
    exit 1
  }
  bash hack/build-image.sh "$tmp/image.oci.tar" >/dev/null
) || die "building $PREVIOUS's image failed"
# The same archive under this name: index.json's two name annotations.
tar -xf "$tmp/image.oci.tar" -C "$tmp/layout"
grep -q '"io.containerd.image.name":"docker.io/library/kubenet-ts:' "$tmp/layout/index.json" || die "unexpected index.json: $(cat "$tmp/layout/index.json")"
sed -i -E "s#\"io.containerd.image.name\":\"[^\"]+\"#\"io.containerd.image.name\":\"docker.io/library/$TAG\"#; s#\"org.opencontainers.image.ref.name\":\"[^\"]+\"#\"org.opencontainers.image.ref.name\":\"${TAG##*:}\"#" "$tmp/layout/index.json"
(cd "$tmp/layout" && tar -cf "$OUT.partial" oci-layout index.json blobs)
mv "$OUT.partial" "$OUT"
echo "build-previous-image: $TAG built in $((SECONDS - t0)) s" >&2
echo "$OUT"
