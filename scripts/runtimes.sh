#!/usr/bin/env bash
# Builds the container runtimes the test bed can run that Debian 12 does not package, at pinned
# versions, from the Go module proxy, into a cache outside the source tree. A second run finds
# the cache and costs nothing. Binaries are never written into the repository.
set -euo pipefail

# Pinned versions. containerd: the newest 2.x release the Go module proxy listed on 2026-11-23
# (`go list -m -versions github.com/containerd/containerd/v2`).
CONTAINERD2_VERSION=v2.4.2
# CRI-O: the version tools/crio/go.mod requires (with go.sum, the hash of every module it is
# built from). The Go module proxy serves github.com/cri-o/cri-o by exact version but refuses its
# version list, so `go install …@version` fails ("loading deprecation … @v/list: 403"); it is
# built from that module instead, like crictl (scripts/crictl.sh).
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CRIO_MODULE=$REPO/tools/crio
CRIO_VERSION=$(awk '$1 == "require" && $2 == "github.com/cri-o/cri-o" { print $3 }' \
  "$CRIO_MODULE/go.mod" 2>/dev/null || true)
# cmd/crio's build tags, after the cri-o Makefile's BUILDTAGS: openpgp signatures in pure Go
# (no gpgme), no btrfs driver (no libbtrfs headers), seccomp through cgo and Debian's libseccomp.
# No selinux, apparmor or libsubid: Debian 12 has their -dev packages, the test bed needs none.
CRIO_TAGS="containers_image_ostree_stub containers_image_openpgp exclude_graphdriver_btrfs seccomp"
# Modules of cri-o's build that the checksum database has no entry for (release candidates of
# k8s.io modules, a conmon-rs pseudo-version): go.sum alone checks them.
CRIO_NOSUMDB=k8s.io,github.com/containers/conmon-rs

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
  crio             crio (CRI-O, version pinned by tools/crio/go.mod, cgo with Debian's
                   libseccomp) and pinns (C, from the same cri-o module source, static), built
                   with `go build` in tools/crio and cc. conmon and runc are Debian's (packages
                   conmon, runc); Debian's crun 1.8 rejects CRI-O's OCI spec version. Building
                   needs Debian's gcc, pkg-config, libseccomp-dev and libc6-dev (static libc).

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

# shellcheck source=scripts/lib/toolcache.sh
. "$REPO/scripts/lib/toolcache.sh"
GO_NEEDED="containerd 2.x and CRI-O are built from the Go module proxy and need Go >= 1.24 (CRI-O: 1.25)"

# go_build NAME VERSION "PROGRAMS" PKG...: the Go packages PKG... of module version VERSION into
# <cache>/NAME-VERSION/bin with `go install`.
go_build() {
  cached_build "$CACHE" "$1" "$2" "$3" go_install "$1" "$2" "${@:4}"
}

# go_install <tmp> <name> <version> <pkg>...: `go install <pkg>@<version>` into <tmp>/bin.
go_install() {
  local tmp=$1 name=$2 version=$3 go pkg
  shift 3
  go=$(find_go "$GO_NEEDED")
  log "building $name $version with $("$go" version | cut -d' ' -f3) into $CACHE/$name-$version (a few minutes, once)"
  for pkg in "$@"; do
    log "  go install $pkg@$version"
    # -buildvcs=false: the module cache is not a VCS checkout. GOFLAGS from the caller could add
    # -mod=vendor or similar, which go install of a remote module rejects.
    GOBIN=$tmp/bin GOFLAGS=-buildvcs=false "$go" install -tags no_btrfs "$pkg@$version" >&2 ||
      die "go install $pkg@$version failed (needs the Go module proxy reachable, or the modules in the Go module cache)"
  done
  echo "with $("$go" version)"
  echo "packages $*"
}

# crio_build <tmp>: crio from tools/crio (go.mod/go.sum, -mod=readonly) and pinns from the same
# cri-o module's source (pinns/src/*.c, flags of its Makefile: static, -Werror).
crio_build() {
  local tmp=$1 go src missing=()
  go=$(find_go "$GO_NEEDED")
  command -v cc >/dev/null || missing+=(gcc)
  command -v pkg-config >/dev/null || missing+=(pkg-config)
  if command -v pkg-config >/dev/null && ! pkg-config --exists libseccomp; then
    missing+=(libseccomp-dev)
  fi
  [ ${#missing[@]} -eq 0 ] ||
    die "building CRI-O needs Debian packages: apt-get install -y ${missing[*]}"
  log "building crio $CRIO_VERSION (tags: $CRIO_TAGS) with $("$go" version | cut -d' ' -f3) into $CACHE/crio-$CRIO_VERSION (a few minutes, once)"
  # -mod=readonly: go.sum is used as committed, never updated. CGO_ENABLED=1: seccomp is cgo.
  (cd "$CRIO_MODULE" &&
    GOFLAGS="-mod=readonly -buildvcs=false" GONOSUMDB=$CRIO_NOSUMDB CGO_ENABLED=1 \
      "$go" build -trimpath -tags "$CRIO_TAGS" -ldflags "-s -w" \
      -o "$tmp/bin/crio" github.com/cri-o/cri-o/cmd/crio >&2) ||
    die "building crio $CRIO_VERSION failed (needs the Go module proxy reachable, or the modules in the Go module cache)"
  src=$(cd "$CRIO_MODULE" && GOFLAGS=-mod=readonly "$go" list -m -f '{{.Dir}}' github.com/cri-o/cri-o) ||
    die "no source dir of github.com/cri-o/cri-o $CRIO_VERSION in the Go module cache"
  log "  cc pinns"
  cc -std=c99 -Os -Wall -Werror -Wextra -static -O3 -s -o "$tmp/bin/pinns" "$src"/pinns/src/*.c >&2 ||
    die "building pinns failed (needs gcc and libc6-dev's static libc)"
  "$tmp/bin/crio" --version >/dev/null 2>&1 || die "the built crio does not run"
  echo "with $("$go" version), tags $CRIO_TAGS"
  echo "packages github.com/cri-o/cri-o/cmd/crio pinns"
}

build() {
  case ${1:-} in
    containerd-2)
      go_build containerd "$CONTAINERD2_VERSION" "containerd ctr containerd-shim-runc-v2" \
        github.com/containerd/containerd/v2/cmd/containerd \
        github.com/containerd/containerd/v2/cmd/ctr \
        github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
      ;;
    crio)
      [ -n "$CRIO_VERSION" ] || die "no github.com/cri-o/cri-o version in $CRIO_MODULE/go.mod"
      cached_build "$CACHE" crio "$CRIO_VERSION" "crio pinns" crio_build
      ;;
    "") die "which runtime? (scripts/runtimes.sh list)" ;;
    *) die "unknown runtime '$1' (scripts/runtimes.sh list)" ;;
  esac
}

case ${1:-} in
  build | bin) shift; build "$@" ;;
  list)
    echo "containerd-2 containerd $CONTAINERD2_VERSION (with ctr, containerd-shim-runc-v2)"
    echo "crio crio $CRIO_VERSION (with pinns)"
    ;;
  -h | --help | help) usage ;;
  *) usage >&2; exit 2 ;;
esac
