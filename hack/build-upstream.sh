#!/usr/bin/env bash
# Builds the upstream Go parts kubenet-ts runs and tests against, from their Go modules, at the
# versions pinned in hack/upstream/<part>/go.mod (+ go.sum): the one place those versions live.
#
#   hack/build-upstream.sh [PART...]     PART: cni-plugins containerd runc etcd kubernetes helm
#                                        coredns prometheus (default: cni-plugins containerd runc)
#
#   cni-plugins  github.com/containernetworking/plugins: every plugin listed as a `tool` in its go.mod
#                (loopback, bridge, host-local, dhcp, portmap, bandwidth, tuning)
#   containerd   github.com/containerd/containerd/v2: containerd, containerd-shim-runc-v2, ctr
#   runc         github.com/opencontainers/runc (cgo, libseccomp: Debian's libseccomp-dev)
#   etcd         go.etcd.io/etcd/server/v3 (etcd) and go.etcd.io/etcd/etcdctl/v3 (etcdctl)
#   kubernetes   k8s.io/kubernetes: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
#                kube-proxy, kubectl (hack/upstream/kubernetes/update.sh writes its go.mod, which replaces each
#                k8s.io staging module with its published version). Each takes ~1-2 GB to link.
#   helm         helm.sh/helm/v4: helm (its Makefile's version ldflags: `helm version` reports the pinned tag)
#   coredns      github.com/coredns/coredns: coredns, its main package (the default plugins of its plugin.cfg)
#   prometheus   github.com/prometheus/prometheus (module v0.3XX.y is release 3.XX.y): prometheus, promtool,
#                with its release's version ldflags; without the web UI's assets (the API is what we use)
#   (A first build here, 2 cores, modules already downloaded: helm ~2 min, coredns ~3 min, prometheus
#   ~9.5 min; the local cluster's add-on images, hack/build-addon-images.sh, take coredns and prometheus.)
#
# Each part is built into a cache directory keyed by its module version and the Go version,
#   $KUBENET_CACHE_DIR/upstream/<part>-<version>-go<go version>/bin
# (KUBENET_CACHE_DIR defaults to /var/cache/kubenet-ts as root, else ~/.cache/kubenet-ts), once: a
# build whose stamp (go.mod, go.sum, this recipe) matches is not run again. native/build/upstream/
# <part> is a symlink to that bin directory: the tests, the demo, the benches and the image take the
# parts from there. Binaries are built one at a time (2 cores; each link takes up to ~1 GB), each to
# a temp name and renamed, and a part's directory appears whole (built aside, then renamed, under a
# lock per part), so a concurrent or interrupted run never leaves a half-built part behind.
# Offline apart from the Go module proxy; the machine's own Go (>= the go.mod's go line) is used:
# GOTOOLCHAIN=local, and /usr/local/go/bin first on PATH when it exists.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

die() { echo "build-upstream: $*" >&2; exit 1; }

. hack/support/go-env.sh
GOVER="$(go env GOVERSION)"

if [ -n "${KUBENET_CACHE_DIR:-}" ]; then CACHE="$KUBENET_CACHE_DIR"
elif [ "$(id -u)" -eq 0 ]; then CACHE=/var/cache/kubenet-ts
else CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/kubenet-ts"; fi
mkdir -p "$CACHE/upstream" native/build/upstream

# version PART MODULE: the pinned version of MODULE in hack/upstream/PART/go.mod.
version() {
  local v
  v="$(cd "hack/upstream/$1" && go list -m -f '{{.Version}}' "$2")" || die "$1: cannot read the version of $2 from hack/upstream/$1/go.mod"
  echo "$v"
}

# gobuild PART OUT PKG [go build args...]: one binary, built to a temp name and renamed.
gobuild() {
  local part="$1" out="$2" pkg="$3"
  shift 3
  local t0=$SECONDS
  (cd "hack/upstream/$part" && go build -trimpath "$@" -o "$out.partial" "$pkg") || { rm -f "$out.partial"; die "$part: go build $pkg failed"; }
  mv -f "$out.partial" "$out"
  echo "build-upstream: $part: $(basename "$out") ($((SECONDS - t0)) s)" >&2
}

build_cni_plugins() { # DIR VERSION
  local pkg
  while read -r pkg; do
    CGO_ENABLED=0 gobuild cni-plugins "$1/bin/$(basename "$pkg")" "$pkg" \
      -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$2"
  done < <(tools cni-plugins)
}

build_containerd() { # DIR VERSION
  local m=github.com/containerd/containerd/v2 pkg
  while read -r pkg; do
    CGO_ENABLED=0 gobuild containerd "$1/bin/$(basename "$pkg")" "$pkg" \
      -ldflags "-s -w -X $m/version.Version=$2 -X $m/version.Package=$m"
  done < <(tools containerd)
}

build_runc() { # DIR VERSION
  pkg-config --exists libseccomp 2>/dev/null || die "runc: libseccomp not found: install Debian packages libseccomp-dev and pkg-config (hack/bootstrap.sh)"
  # The release build's tags less libpathrs (a Rust library Debian 12 does not package).
  CGO_ENABLED=1 gobuild runc "$1/bin/runc" github.com/opencontainers/runc \
    -buildmode=pie -tags "seccomp urfave_cli_no_docs" -ldflags "-s -w"
}

build_etcd() { # DIR VERSION
  CGO_ENABLED=0 gobuild etcd "$1/bin/etcd" go.etcd.io/etcd/server/v3 -ldflags "-s -w"
  CGO_ENABLED=0 gobuild etcd "$1/bin/etcdctl" go.etcd.io/etcd/etcdctl/v3 -ldflags "-s -w"
}

build_kubernetes() { # DIR VERSION
  local v="$2" x="" p pkg
  local minor="${v#v1.}"
  minor="${minor%%.*}"
  # What `make` stamps (hack/lib/version.sh): the version every component reports (a kubelet's
  # Node status, version skew checks), with a fixed build date for reproducible binaries.
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    x+=" -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  while read -r pkg; do
    CGO_ENABLED=0 gobuild kubernetes "$1/bin/$(basename "$pkg")" "$pkg" -ldflags "-s -w$x"
  done < <(tools kubernetes)
}

build_helm() { # DIR VERSION
  # What helm's Makefile stamps for a release tag: the version, no "unreleased" metadata.
  local p=helm.sh/helm/v4/internal/version
  CGO_ENABLED=0 gobuild helm "$1/bin/helm" helm.sh/helm/v4/cmd/helm \
    -ldflags "-s -w -X $p.version=$2 -X $p.metadata= -X $p.gitTreeState=clean"
}

build_coredns() { # DIR VERSION
  # Its Makefile's build: CGO off, the commit (which a module has not) as the only stamp; the
  # version is a constant of coremain.
  CGO_ENABLED=0 gobuild coredns "$1/bin/coredns" github.com/coredns/coredns -ldflags "-s -w"
}

build_prometheus() { # DIR VERSION
  # What its .promu.yml stamps, less the UI (tag builtinassets needs the npm-built assets) and the
  # host: the release version from the module's VERSION file (3.x; the module's own is v0.3xx), the
  # module version in place of the commit (a module has none), a fixed user and date.
  local m=github.com/prometheus/prometheus p=github.com/prometheus/common/version dir rel pkg
  dir="$(cd hack/upstream/prometheus && go mod download -json "$m@$2" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  rel="$(cat "$dir/VERSION" 2>/dev/null)" || die "prometheus: no VERSION file in $m@$2"
  while read -r pkg; do
    CGO_ENABLED=0 gobuild prometheus "$1/bin/$(basename "$pkg")" "$pkg" -tags netgo \
      -ldflags "-s -w -X $p.Version=$rel -X $p.Revision=$2 -X $p.Branch=HEAD -X $p.BuildUser=kubenet-ts -X $p.BuildDate=19700101-00:00:00"
  done < <(tools prometheus)
}

# tools PART: the packages of the `tool` lines of hack/upstream/PART/go.mod.
tools() {
  awk '/^tool \(/{b=1; next} b && /^\)/{b=0} b{print $1} /^tool [^(]/{print $2}' "hack/upstream/$1/go.mod"
}

declare -A MODULE=(
  [cni-plugins]=github.com/containernetworking/plugins
  [containerd]=github.com/containerd/containerd/v2
  [runc]=github.com/opencontainers/runc
  [etcd]=go.etcd.io/etcd/server/v3
  [kubernetes]=k8s.io/kubernetes
  [helm]=helm.sh/helm/v4
  [coredns]=github.com/coredns/coredns
  [prometheus]=github.com/prometheus/prometheus
)

parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(cni-plugins containerd runc)
for part in "${parts[@]}"; do
  [ -n "${MODULE[$part]:-}" ] || die "unknown part '$part' (known: ${!MODULE[*]})"
  ver="$(version "$part" "${MODULE[$part]}")"
  dir="$CACHE/upstream/$part-$ver-$GOVER"
  stamp="$(cat "hack/upstream/$part/go.mod" "hack/upstream/$part/go.sum" <(declare -f "build_${part//-/_}" gobuild tools) | sha256sum | cut -c1-16)"
  # One build of a part at a time on this machine: a second run waits, then finds it built.
  exec 9>"$CACHE/upstream/$part.lock"
  flock 9
  if [ "$(cat "$dir/stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "build-upstream: building $part $ver with $GOVER into $dir" >&2
    t0=$SECONDS
    tmp="$dir.partial.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp/bin"
    trap 'rm -rf "$tmp"' EXIT
    "build_${part//-/_}" "$tmp" "$ver"
    echo "$stamp" >"$tmp/stamp"
    rm -rf "$dir"
    mv "$tmp" "$dir"
    trap - EXIT
    echo "build-upstream: $part $ver built in $((SECONDS - t0)) s" >&2
  fi
  ln -sfn "$dir/bin" "native/build/upstream/$part.partial.$$"
  mv -fT "native/build/upstream/$part.partial.$$" "native/build/upstream/$part"
  exec 9>&-
  echo "$ROOT/native/build/upstream/$part"
done
