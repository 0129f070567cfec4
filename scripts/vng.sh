#!/usr/bin/env bash
# Installs virtme-ng (`vng`), at a pinned version, from PyPI into a Python virtual environment in
# a cache outside the source tree, and prints a directory that holds `vng` and virtme-ng's other
# commands, and no Python: the environment's own bin/ would put its python3 first on PATH. A
# second run finds the cache and costs nothing. vmtests/ boots its kernels with vng whenever it
# is on PATH.
#
#   scripts/vng.sh            install if missing; print the bin directory
#
# Environment:
#   KPLEG_TOOLS_CACHE   cache root (default /var/cache/kpleg/tools); virtme-ng lives in
#                       <cache>/virtme-ng-<version>, complete once <cache>/virtme-ng-<version>/ok exists
set -euo pipefail

# Pinned: the newest virtme-ng on PyPI on 2026-11-24.
VNG_VERSION=1.42

CACHE=${KPLEG_TOOLS_CACHE:-/var/cache/kpleg/tools}
dir=$CACHE/virtme-ng-$VNG_VERSION

log() { echo "vng.sh: $*" >&2; }
die() { echo "vng.sh: error: $*" >&2; exit 1; }

if [ -f "$dir/ok" ] && [ -x "$dir/commands/vng" ]; then
  echo "$dir/commands"
  exit 0
fi

command -v python3 >/dev/null || die "python3 is missing (scripts/install-deps.sh installs it)"
mkdir -p "$CACHE"
# A virtual environment cannot be moved (its scripts name their interpreter by path): build it
# in place and mark it complete last, so an interrupted install is redone, not used.
rm -rf "$dir"
start=$(date +%s)
python3 -m venv "$dir" || die "python3 -m venv failed (package python3-venv)"
if ! "$dir/bin/pip" install --quiet --disable-pip-version-check "virtme-ng==$VNG_VERSION" >&2; then
  rm -rf "$dir"
  die "pip could not install virtme-ng==$VNG_VERSION from PyPI"
fi
"$dir/bin/vng" --version >/dev/null || { rm -rf "$dir"; die "the installed vng does not run"; }
# vng runs virtme-run and its helpers by name: they go on PATH with it (their scripts name the
# environment's interpreter themselves).
mkdir -p "$dir/commands"
for cmd in "$dir"/bin/vng "$dir"/bin/virtme-*; do
  ln -s "$cmd" "$dir/commands/${cmd##*/}"
done
touch "$dir/ok"
log "installed virtme-ng $VNG_VERSION in $dir in $(($(date +%s) - start)) s"
echo "$dir/commands"
