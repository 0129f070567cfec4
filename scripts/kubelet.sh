#!/usr/bin/env bash
# Builds an unmodified kubelet from the Go module proxy at the Kubernetes release
# tools/kubelet/go.mod pins, checked against tools/kubelet/go.sum, into a cache outside the source
# tree, and prints the directory that holds `kubelet`. A second run finds the cache and costs
# nothing.
#
#   scripts/kubelet.sh        build if missing; print the bin directory
#
# k8s.io/kubernetes is not meant to be required as a module: its go.mod requires its staging
# modules (k8s.io/api, client-go, cri-api, cri-client, kubelet, ...) as v0.0.0 and replaces them
# with ./staging/src/..., which a dependency's replace directives cannot do. tools/kubelet/go.mod
# therefore replaces each of them with its published version v0.<minor>.<patch> of the same
# release (v1.37.2 -> v0.37.2). The Go checksum database knows all of them, and go.sum, used as
# committed (-mod=readonly), is what the build is checked against.
#
# Built the way the release's hack/lib/golang.sh builds a non-debug binary (tags selinux, notest,
# grpcnotrace; -trimpath; -s -w; the version variables of k8s.io/component-base/version and
# k8s.io/client-go/pkg/version), except CGO_ENABLED=0, so the binary is static. gitCommit is left
# empty (the proxy's module zip carries no commit) and buildDate is the release's time as the
# proxy reports it, so the binary does not depend on when it was built.
#
# Environment:
#   KPLEG_TOOLS_CACHE   cache root (default /var/cache/kpleg/tools); kubelet lives in
#                       <cache>/kubelet-<version>/bin, complete once <cache>/kubelet-<version>/ok
#                       exists
#   GO                  the go command (default: go on PATH, else /usr/local/go/bin/go)
# The cache, its lock and its ok file: scripts/lib/toolcache.sh.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
module=$repo/tools/kubelet
VERSION=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$module/go.mod")

log() { echo "kubelet.sh: $*" >&2; }
die() { echo "kubelet.sh: error: $*" >&2; exit 1; }
# shellcheck source=scripts/lib/toolcache.sh
. "$repo/scripts/lib/toolcache.sh"

# build_kubelet TMP: kubelet into TMP/bin.
build_kubelet() {
  local tmp=$1 go major minor build_date ldflags pkg got
  go=$(find_go "kubelet is built from the Go module proxy")
  # v1.37.2 -> major 1, minor 37.
  major=${VERSION#v}
  major=${major%%.*}
  minor=${VERSION#v*.}
  minor=${minor%%.*}
  # The release's time (RFC 3339, UTC) from the module's .info; downloads the module if needed.
  build_date=$(cd "$module" && GOFLAGS=-mod=readonly "$go" list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes) ||
    die "cannot resolve k8s.io/kubernetes $VERSION (needs the Go module proxy, or the module in the Go module cache)"
  [ -n "$build_date" ] || build_date=1970-01-01T00:00:00Z
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitCommit= -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
  done
  log "building kubelet $VERSION with $("$go" version | cut -d' ' -f3) (several minutes, once)"
  # -mod=readonly: go.sum is used as committed, never updated.
  (cd "$module" &&
    GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0 \
      "$go" build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ldflags" \
      -o "$tmp/bin/kubelet" k8s.io/kubernetes/cmd/kubelet >&2) ||
    die "building kubelet $VERSION failed"
  got=$("$tmp/bin/kubelet" --version) || die "the built kubelet does not run"
  [ "$got" = "Kubernetes $VERSION" ] || die "the built kubelet says '$got', not 'Kubernetes $VERSION'"
  echo "with $("$go" version)"
}

[ -n "$VERSION" ] || die "no k8s.io/kubernetes version in $module/go.mod"
# The build takes minutes: concurrent callers wait up to 30 min for one build.
TOOL_LOCK_WAIT_S=1800 cached_build "${KPLEG_TOOLS_CACHE:-/var/cache/kpleg/tools}" kubelet "$VERSION" \
  kubelet build_kubelet
