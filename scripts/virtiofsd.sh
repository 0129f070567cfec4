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
set -euo pipefail

# Pinned: a virtiofsd release in the Rust crate registry that builds with the machine's Rust toolchain.
VIRTIOFSD_VERSION=1.13.2

CACHE=${KPLEG_TOOLS_CACHE:-/var/cache/kpleg/tools}
dir=$CACHE/virtiofsd-$VIRTIOFSD_VERSION

log() { echo "virtiofsd.sh: $*" >&2; }
die() { echo "virtiofsd.sh: error: $*" >&2; exit 1; }

if [ -f "$dir/ok" ] && [ -x "$dir/bin/virtiofsd" ]; then
  echo "$dir/bin"
  exit 0
fi

cargo=${CARGO:-}
if [ -z "$cargo" ]; then
  if command -v cargo >/dev/null; then
    cargo=$(command -v cargo)
  elif [ -x "$HOME/.cargo/bin/cargo" ]; then
    cargo=$HOME/.cargo/bin/cargo
  else
    die "no cargo (Rust toolchain): virtiofsd is built from the Rust crate registry; install Rust, or set CARGO"
  fi
fi

mkdir -p "$CACHE"
tmp=$(mktemp -d "$CACHE/.virtiofsd.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
# libseccomp-dev and libcap-ng-dev come from scripts/install-deps.sh.
if ! "$cargo" install --quiet --locked --root "$tmp" virtiofsd --version "$VIRTIOFSD_VERSION" >&2; then
  die "cargo could not build virtiofsd $VIRTIOFSD_VERSION"
fi
"$tmp/bin/virtiofsd" --version >/dev/null || die "the built virtiofsd does not run"
touch "$tmp/ok"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
log "built virtiofsd $VIRTIOFSD_VERSION in $dir in $(($(date +%s) - start)) s"
echo "$dir/bin"
