#!/usr/bin/env bash
# Builds crictl (cri-tools) from the Go module proxy at the version tools/crictl/go.mod pins,
# checked against tools/crictl/go.sum, into a cache outside the source tree, and prints the
# directory that holds `crictl`. A second run finds the cache and costs nothing.
#
#   scripts/crictl.sh         build if missing; print the bin directory
#
# The Go module proxy serves cri-tools v1.34.0 by exact version but not its version list, so
# `go install …@version` cannot be used, and the checksum database has no entry for it nor for
# the release candidates of k8s.io modules it depends on: the hashes committed in go.sum are what
# the build is checked against (GONOSUMDB only skips the database lookup, never go.sum).
#
# Environment:
#   KPLEG_TOOLS_CACHE   cache root (default /var/cache/kpleg/tools); crictl lives in
#                       <cache>/crictl-<version>/bin, complete once <cache>/crictl-<version>/ok exists
#   GO                  the go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
module=$repo/tools/crictl
VERSION=$(awk '$1 == "require" && $2 == "sigs.k8s.io/cri-tools" { print $3 }' "$module/go.mod")

CACHE=${KPLEG_TOOLS_CACHE:-/var/cache/kpleg/tools}
dir=$CACHE/crictl-$VERSION

log() { echo "crictl.sh: $*" >&2; }
die() { echo "crictl.sh: error: $*" >&2; exit 1; }

[ -n "$VERSION" ] || die "no cri-tools version in $module/go.mod"
if [ -f "$dir/ok" ] && [ -x "$dir/bin/crictl" ]; then
  echo "$dir/bin"
  exit 0
fi

go=${GO:-}
if [ -z "$go" ]; then
  if command -v go >/dev/null; then
    go=$(command -v go)
  elif [ -x /usr/local/go/bin/go ]; then
    go=/usr/local/go/bin/go
  else
    die "no Go toolchain (go on PATH or /usr/local/go/bin/go): crictl is built from the Go module proxy"
  fi
fi

mkdir -p "$CACHE"
tmp=$(mktemp -d "$CACHE/.crictl.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
mkdir -p "$tmp/bin"
# -mod=readonly: go.sum is used as committed, never updated.
if ! (cd "$module" &&
  GOFLAGS=-mod=readonly GONOSUMDB=sigs.k8s.io/cri-tools,k8s.io CGO_ENABLED=0 \
    "$go" build -trimpath \
    -ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=$VERSION" \
    -o "$tmp/bin/crictl" sigs.k8s.io/cri-tools/cmd/crictl >&2); then
  die "building crictl $VERSION failed"
fi
"$tmp/bin/crictl" --version >/dev/null || die "the built crictl does not run"
touch "$tmp/ok"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
log "built crictl $VERSION in $dir in $(($(date +%s) - start)) s"
echo "$dir/bin"
