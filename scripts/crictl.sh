#!/usr/bin/env bash
# Builds cri-tools' two programs from the Go module proxy at the version tools/crictl/go.mod pins,
# checked against tools/crictl/go.sum, into a cache outside the source tree, and prints the
# directory that holds them. A second run finds the cache and costs nothing.
#
#   crictl   the CRI command-line client (`go build` of cmd/crictl)
#   critest  the CRI validation suite (ginkgo), the test binary of cmd/critest (`go test -c`, as
#            cri-tools' own Makefile builds it); tests/cri/critest.sh runs it
#
#   scripts/crictl.sh         build if missing; print the bin directory
#
# The Go module proxy serves cri-tools v1.34.0 by exact version but not its version list, so
# `go install …@version` cannot be used, and the checksum database has no entry for it nor for
# the release candidates of k8s.io modules it depends on: the hashes committed in go.sum are what
# the build is checked against (GONOSUMDB only skips the database lookup, never go.sum). critest's
# test file imports ginkgo, gomega and cri-tools' validate, benchmark and framework packages, so
# tools/crictl/tools.go imports them too: go.sum then holds every module critest needs.
#
# Environment:
#   KPLEG_TOOLS_CACHE   cache root (default /var/cache/kpleg/tools); the programs live in
#                       <cache>/cri-tools-<version>/bin, complete once <cache>/cri-tools-<version>/ok
#                       exists
#   GO                  the go command (default: go on PATH, else /usr/local/go/bin/go)
# The cache, its lock and its ok file: scripts/lib/toolcache.sh.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
module=$repo/tools/crictl
# `require sigs.k8s.io/cri-tools vX` or, inside a require ( ... ) block, `sigs.k8s.io/cri-tools vX`.
VERSION=$(awk '$1 == "require" && $2 == "sigs.k8s.io/cri-tools" { print $3; exit }
  $1 == "sigs.k8s.io/cri-tools" && $2 ~ /^v/ { print $2; exit }' "$module/go.mod")

log() { echo "crictl.sh: $*" >&2; }
die() { echo "crictl.sh: error: $*" >&2; exit 1; }
# shellcheck source=scripts/lib/toolcache.sh
. "$repo/scripts/lib/toolcache.sh"

# build_cri_tools TMP: crictl and critest into TMP/bin.
build_cri_tools() {
  local tmp=$1 go critest_version
  go=$(find_go "crictl and critest are built from the Go module proxy")
  log "building crictl and critest $VERSION with $("$go" version | cut -d' ' -f3) (once)"
  # -mod=readonly: go.sum is used as committed, never updated. The version ldflag is the one
  # cri-tools' Makefile sets for both programs (`crictl --version`, `critest -version`).
  gobuild() { # output, package, then the go subcommand...
    local out=$1 pkg=$2
    shift 2
    (cd "$module" &&
      GOFLAGS=-mod=readonly GONOSUMDB=sigs.k8s.io/cri-tools,k8s.io CGO_ENABLED=0 \
        "$go" "$@" -trimpath -ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=$VERSION" \
        -o "$out" "$pkg" >&2)
  }
  gobuild "$tmp/bin/crictl" sigs.k8s.io/cri-tools/cmd/crictl build ||
    die "building crictl $VERSION failed (needs the Go module proxy reachable, or the modules in the Go module cache)"
  gobuild "$tmp/bin/critest" sigs.k8s.io/cri-tools/cmd/critest test -c ||
    die "building critest $VERSION failed (needs the Go module proxy reachable, or the modules in the Go module cache)"
  "$tmp/bin/crictl" --version >/dev/null || die "the built crictl does not run"
  # critest reads /etc/crictl.yaml if present and warns on stderr if not; -version prints and
  # exits. Its output is read whole: it prints "PASS" after the version, and a grep -q that ended
  # first would kill it with SIGPIPE, which pipefail reports as a failure.
  critest_version=$("$tmp/bin/critest" -version 2>/dev/null) || die "the built critest does not run"
  grep -q "critest version: $VERSION" <<<"$critest_version" ||
    die "the built critest reports another version: $critest_version"
  echo "with $("$go" version)"
  echo "programs crictl critest"
}

[ -n "$VERSION" ] || die "no cri-tools version in $module/go.mod"
cached_build "${KPLEG_TOOLS_CACHE:-/var/cache/kpleg/tools}" cri-tools "$VERSION" "crictl critest" \
  build_cri_tools
