# shellcheck shell=bash
# Sourced by the hack/ scripts that run Go: the machine's own Go (/usr/local/go/bin first on PATH
# when it exists; never a toolchain the go command would fetch: GOTOOLCHAIN=local), no VCS stamping
# (builds from the module cache have none). Dies when there is no go.
[ -x /usr/local/go/bin/go ] && PATH="/usr/local/go/bin:$PATH"
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
if ! command -v go >/dev/null 2>&1; then
  echo "$(basename "$0"): go not found: this project needs the machine's Go (>= 1.26) on PATH" >&2
  exit 1
fi
