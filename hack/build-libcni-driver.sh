#!/usr/bin/env bash
# Builds test/libcni/driver.go (a small CLI over the reference runtime library, libcni) into
# OUT (default native/build/libcni-driver). Offline: GOPATH mode against Debian's packages
# golang-go and golang-github-appc-cni-dev (both in hack/bootstrap.sh).
# Idempotent and safe to run concurrently: the binary is built to a temp file and renamed.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${1:-native/build/libcni-driver}"
SRC="test/libcni/driver.go"
GOCODE="${LIBCNI_GOCODE:-/usr/share/gocode}"
LIBCNI="$GOCODE/src/github.com/containernetworking/cni/libcni"

die() { echo "build-libcni-driver: $*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "go not found: install Debian package golang-go (run hack/bootstrap.sh)"
[ -f "$LIBCNI/api.go" ] || die "libcni not found at $LIBCNI: install Debian package golang-github-appc-cni-dev (run hack/bootstrap.sh)"
[ -f "$SRC" ] || die "missing $SRC"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/libcni-driver-build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# The build cache makes rebuilds fast; fall back to a throwaway one when HOME is unusable.
if [ -z "${GOCACHE:-}" ]; then
  if [ -n "${HOME:-}" ] && mkdir -p "$HOME/.cache" 2>/dev/null && [ -w "$HOME/.cache" ]; then
    GOCACHE="$HOME/.cache/go-build"
  else
    GOCACHE="$tmp/gocache"
  fi
fi

mkdir -p "$(dirname "$OUT")"
partial="$OUT.partial.$$"
if ! GO111MODULE=off GOPATH="$GOCODE:$tmp/gopath" GOCACHE="$GOCACHE" GOFLAGS= CGO_ENABLED=0 \
  go build -trimpath -o "$partial" "$SRC"; then
  rm -f "$partial"
  die "go build failed"
fi
mv -f "$partial" "$OUT"
echo "$OUT"
