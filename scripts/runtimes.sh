#!/usr/bin/env bash
# Builds the container runtimes the test bed can run that Debian 12 does not package, at pinned
# versions, from the Go module proxy, into a cache outside the source tree. A second run finds
# the cache and costs nothing. Binaries are never written into the repository.
set -euo pipefail

# Pinned versions. containerd: the newest 2.x release the Go module proxy listed on 2026-11-23
# (`go list -m -versions github.com/containerd/containerd/v2`).
CONTAINERD2_VERSION=v2.4.2

usage() {
  cat <<'EOF'
usage: scripts/runtimes.sh build <runtime> | bin <runtime> | list

  build <runtime>  Build <runtime> into the cache unless it is already there; print its bin dir.
  bin <runtime>    Print the bin dir of <runtime>, building it first when missing (same as build).
  list             Print the runtimes this script knows, with their pinned versions.

runtimes:
  containerd-2     containerd, ctr and containerd-shim-runc-v2 of containerd 2.x (pinned below),
                   built with `go install` (tag no_btrfs: no libbtrfs headers needed). runc is
                   Debian's (package runc), which containerd 2.x drives unchanged.

environment:
  KPLEG_RUNTIMES_CACHE  cache root (default /var/cache/kpleg/runtimes); a runtime lives in
                        <cache>/<name>-<version>/bin, complete once <cache>/<name>-<version>/ok
                        exists
  GO                    the go command (default: go on PATH, else /usr/local/go/bin/go)
EOF
}

CACHE=${KPLEG_RUNTIMES_CACHE:-/var/cache/kpleg/runtimes}

log() { echo "runtimes: $*" >&2; }
die() { echo "runtimes: error: $*" >&2; exit 1; }

find_go() {
  if [ -n "${GO:-}" ]; then
    command -v "$GO" >/dev/null || die "GO=$GO is not a command"
    echo "$GO"
  elif command -v go >/dev/null; then
    command -v go
  elif [ -x /usr/local/go/bin/go ]; then
    echo /usr/local/go/bin/go
  else
    die "no Go toolchain (go on PATH or /usr/local/go/bin/go): containerd 2.x is built from \
the Go module proxy and needs Go >= 1.24; install Go, or set GO=/path/to/go"
  fi
}

# Builds the Go packages $3... of module version $2 into <cache>/$1/bin. Writes to a temporary
# directory first and renames it, so an interrupted build never looks complete.
go_build() {
  local name=$1 version=$2 dir tmp go start pkg
  shift 2
  dir=$CACHE/$name-$version
  if [ -f "$dir/ok" ]; then
    echo "$dir/bin"
    return 0
  fi
  go=$(find_go)
  mkdir -p "$CACHE"
  exec {lock}>"$CACHE/.$name-$version.lock"
  flock -w 1200 "$lock" || die "another build of $name-$version held its lock for 20 min"
  if [ -f "$dir/ok" ]; then
    echo "$dir/bin"
    return 0
  fi
  tmp=$(mktemp -d "$CACHE/.$name-$version.XXXXXX")
  chmod 0755 "$tmp"
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  start=$SECONDS
  log "building $name $version with $("$go" version | cut -d' ' -f3) into $dir (a few minutes, once)"
  for pkg in "$@"; do
    log "  go install $pkg@$version"
    # -buildvcs=false: the module cache is not a VCS checkout. GOFLAGS from the caller could add
    # -mod=vendor or similar, which go install of a remote module rejects.
    GOBIN=$tmp/bin GOFLAGS=-buildvcs=false "$go" install -tags no_btrfs "$pkg@$version" >&2 ||
      die "go install $pkg@$version failed (needs the Go module proxy reachable, or the modules in the Go module cache)"
  done
  {
    echo "version $version"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) with $("$go" version)"
    echo "packages $*"
    echo "seconds $((SECONDS - start))"
  } >"$tmp/ok"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT
  log "built $name $version in $((SECONDS - start)) s"
  echo "$dir/bin"
}

build() {
  case ${1:-} in
    containerd-2)
      go_build containerd "$CONTAINERD2_VERSION" \
        github.com/containerd/containerd/v2/cmd/containerd \
        github.com/containerd/containerd/v2/cmd/ctr \
        github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
      ;;
    "") die "which runtime? (scripts/runtimes.sh list)" ;;
    *) die "unknown runtime '$1' (scripts/runtimes.sh list)" ;;
  esac
}

case ${1:-} in
  build | bin) shift; build "$@" ;;
  list) echo "containerd-2 containerd $CONTAINERD2_VERSION (with ctr, containerd-shim-runc-v2)" ;;
  -h | --help | help) usage ;;
  *) usage >&2; exit 2 ;;
esac
