#!/usr/bin/env bash
# An arm64 Debian root for cross-building kplegd and booting it in an arm64 VM: the arm64
# builds of the libraries kpleg links (and their dependencies, libc included), unpacked from
# Debian's own packages of the host's release, without touching the host's dpkg (no
# `dpkg --add-architecture`: the arm64 prometheus-cpp-dev cannot be co-installed with the
# amd64 one). cmake/aarch64-linux-gnu.cmake builds against it; vmtests/run-in-vm.sh boots an
# arm64 guest into it (its busybox is the guest's /bin/sh).
#
#   scripts/sysroot.sh [DEST]     prints DEST once it is complete
#
# DEST defaults to $KPLEG_SYSROOT, else /var/cache/kpleg/sysroot-arm64. The package lists
# live under DEST/.apt and are read from the mirror of the host's Debian sources
# ($KPLEG_VM_DEBIAN_MIRROR overrides). A root already made from the same package list is kept
# (stamp DEST/root/.kpleg-sysroot); apt-get update runs only to make a new one.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../vmtests/common.sh"

dest=${1:-${KPLEG_SYSROOT:-/var/cache/kpleg/sysroot-arm64}}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
root=$dest/root
apt_dir=$dest/.apt

# What kplegd links (CMakeLists.txt's find_package list), the C/C++ runtime, and the guest's
# shell. protobuf-compiler-grpc only because gRPC's CMake package checks that its plugin file
# exists; the build runs the host's protoc and plugin.
PACKAGES=(
  libc6-dev libstdc++-12-dev libgcc-12-dev
  libbpf-dev libelf-dev zlib1g-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler-grpc
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev libssl-dev
  libnghttp2-dev prometheus-cpp-dev libgtest-dev libgmock-dev
  busybox-static
)
stamp=$(printf '%s\n' "${PACKAGES[@]}" | sha256sum | cut -c1-16)
if [ "$(cat "$root/.kpleg-sysroot" 2>/dev/null)" = "$stamp" ]; then
  echo "$dest"
  exit 0
fi

exec 9>"$dest/.lock"
flock 9
if [ "$(cat "$root/.kpleg-sysroot" 2>/dev/null)" = "$stamp" ]; then
  echo "$dest"
  exit 0
fi

suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$suite" ] || { kpleg_vm_log "cannot tell the host's Debian release (/etc/os-release)"; exit 1; }
mirror=${KPLEG_VM_DEBIAN_MIRROR:-$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)}
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /:\/\// { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$mirror" ] || { kpleg_vm_log "no Debian mirror in the host's apt sources (set KPLEG_VM_DEBIAN_MIRROR)"; exit 1; }

keyring=/usr/share/keyrings/debian-archive-keyring.gpg
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/state"
: >"$apt_dir/state/status"
{
  echo "deb [signed-by=$keyring] $mirror $suite main"
  echo "deb [signed-by=$keyring] $mirror $suite-updates main"
  # The security archive is a sibling of the main one on Debian's mirrors.
  echo "deb [signed-by=$keyring] ${mirror%/debian}/debian-security $suite-security main"
} >"$apt_dir/sources.list"
opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State=$apt_dir/state" -o "Dir::State::Lists=$apt_dir/lists"
  -o "Dir::State::status=$apt_dir/state/status" -o "Dir::Cache=$apt_dir" -o "Dir::Cache::archives=$apt_dir/archives"
  -o APT::Architecture=arm64 -o APT::Architectures::=arm64 -o Acquire::Languages=none
  -o Debug::NoLocking=1 -o APT::Install-Recommends=0)
[ "$(id -u)" -eq 0 ] && opts+=(-o APT::Sandbox::User=root)

t0=$SECONDS
apt-get -q "${opts[@]}" update >"$apt_dir/update.log" 2>&1 || { cat "$apt_dir/update.log" >&2; exit 1; }
apt-get -q -y "${opts[@]}" install --download-only "${PACKAGES[@]}" >"$apt_dir/install.log" 2>&1 ||
  { tail -n 30 "$apt_dir/install.log" >&2; exit 1; }

rm -rf "$root.new"
mkdir -p "$root.new"
for deb in "$apt_dir"/archives/*.deb; do
  dpkg-deb -x "$deb" "$root.new"
done
# Debian 12 is merged-/usr: /lib, /bin and /sbin are links into /usr (made by its installer,
# not by the packages).
for d in lib bin sbin; do
  if [ -d "$root.new/$d" ] && [ ! -L "$root.new/$d" ]; then
    mkdir -p "$root.new/usr/$d"
    cp -a "$root.new/$d/." "$root.new/usr/$d/"
    rm -rf "$root.new/${d:?}"
  fi
  ln -sfn "usr/$d" "$root.new/$d"
done
# Absolute symlinks (libfoo.so -> /lib/...) would point into the host when the compiler reads
# the root: make them relative.
find "$root.new" -type l -lname '/*' | while read -r link; do
  target=$(readlink "$link")
  rel=$(realpath -m --relative-to="$(dirname "$link")" "$root.new$target")
  ln -sfn "$rel" "$link"
done
# The guest's commands: busybox applets (the self-test runs /bin/sh and /bin/true), and the
# mount points its init needs.
for a in sh true false cat echo ls mkdir mount sleep env id uname; do
  [ -e "$root.new/usr/bin/$a" ] || ln -s busybox "$root.new/usr/bin/$a"
done
mkdir -p "$root.new"/{proc,sys,dev,run,tmp,var/tmp,root}
[ -e "$root.new/bin/busybox" ] || { kpleg_vm_log "busybox-static:arm64 left no /bin/busybox"; exit 1; }
echo "$stamp" >"$root.new/.kpleg-sysroot"
rm -rf "$root"
mv "$root.new" "$root"
kpleg_vm_log "arm64 root of $(ls "$apt_dir"/archives/*.deb | wc -l) packages ($(du -sm "$root" | cut -f1) MB) in $root, $((SECONDS - t0)) s"
echo "$dest"
