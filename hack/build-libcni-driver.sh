#!/usr/bin/env bash
# Builds test/libcni/driver.go (a small CLI over the reference runtime library, libcni) into
# OUT (default native/build/libcni-driver), against github.com/containernetworking/cni at the
# version pinned in test/libcni/go.mod (+ go.sum), from the Go module proxy, with the machine's
# own Go (GOTOOLCHAIN=local; /usr/local/go/bin first on PATH when it exists).
# Idempotent and safe to run concurrently: the binary is built to a temp file and renamed; Go's
# build cache makes a rebuild cost about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${1:-native/build/libcni-driver}"
die() { echo "build-libcni-driver: $*" >&2; exit 1; }

. hack/support/go-env.sh

mkdir -p "$(dirname "$OUT")"
OUT="$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")"
partial="$OUT.partial.$$"
if ! (cd test/libcni && CGO_ENABLED=0 go build -trimpath -o "$partial" .); then
  rm -f "$partial"
  die "go build failed"
fi
mv -f "$partial" "$OUT"
echo "$OUT"
