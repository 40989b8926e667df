#!/usr/bin/env bash
# The main job on a fresh Debian machine: bootstrap, then run the demo (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then echo "demo: run as root (it creates network namespaces and a bridge)" >&2; exit 1; fi
bash hack/bootstrap.sh
bash hack/build-native.sh   # the CNI binary the agent installs
bash hack/build-upstream.sh cni-plugins >/dev/null   # the reference plugins it runs (cached)
exec node --import=tsx hack/demo.ts "$@"
