#!/usr/bin/env bash
# Builds virtiofsd (the Rust one), at a pinned version, from the Rust crate registry with cargo into a cache
# outside the source tree, and prints the directory that holds `virtiofsd`. A second run finds
# the cache and costs nothing (the first build takes a few minutes on two cores).
#
# vng shares the host's root with the guest over virtio-fs when it finds virtiofsd on PATH, and
# over 9p otherwise. Debian's cloud kernels have no 9p, so the VM tests of those kernels need it.
# Debian 12 packages no virtiofsd of its own; the one qemu ships (/usr/lib/qemu/virtiofsd) takes
# other options than the ones vng passes.
#
#   scripts/virtiofsd.sh      build if missing; print the bin directory
#
# Environment:
#   KPLEG_TOOLS_CACHE   cache root (default /var/cache/kpleg/tools); virtiofsd lives in
#                       <cache>/virtiofsd-<version>/bin, complete once <cache>/virtiofsd-<version>/ok exists
#   CARGO               the cargo command (default: cargo on PATH, else ~/.cargo/bin/cargo)
# The cache, its lock and its ok file: scripts/lib/toolcache.sh.
set -euo pipefail

# Pinned: a virtiofsd release in the Rust crate registry that builds with the machine's Rust toolchain.
VIRTIOFSD_VERSION=1.13.2

log() { echo "virtiofsd.sh: $*" >&2; }
die() { echo "virtiofsd.sh: error: $*" >&2; exit 1; }
# shellcheck source=scripts/lib/toolcache.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/toolcache.sh"

# build_virtiofsd TMP: virtiofsd into TMP/bin.
build_virtiofsd() {
  local tmp=$1 cargo=${CARGO:-}
  if [ -z "$cargo" ]; then
    if command -v cargo >/dev/null; then
      cargo=$(command -v cargo)
    elif [ -x "$HOME/.cargo/bin/cargo" ]; then
      cargo=$HOME/.cargo/bin/cargo
    else
      die "no cargo (Rust toolchain): virtiofsd is built from the Rust crate registry; install Rust, or set CARGO"
    fi
  fi
  # libseccomp-dev and libcap-ng-dev come from scripts/install-deps.sh.
  "$cargo" install --quiet --locked --root "$tmp" virtiofsd --version "$VIRTIOFSD_VERSION" >&2 ||
    die "cargo could not build virtiofsd $VIRTIOFSD_VERSION"
  "$tmp/bin/virtiofsd" --version >/dev/null || die "the built virtiofsd does not run"
  echo "with $("$cargo" --version)"
}

cached_build "${KPLEG_TOOLS_CACHE:-/var/cache/kpleg/tools}" virtiofsd "$VIRTIOFSD_VERSION" virtiofsd \
  build_virtiofsd
