#!/usr/bin/env bash
# Fetches the kernels of vmtests/kernels.txt from Debian's archive without installing them:
# apt-get download + dpkg-deb -x into DEST/<name>/, keeping boot/ (vmlinuz, config) and
# lib/modules/<version>/ (with a fresh modules.dep, which the package leaves to its postinst).
#
#   vmtests/fetch-kernels.sh [DEST] [NAME...]
#
# DEST defaults to $KPLEG_VM_KERNELS_DIR, else <build>/vmtests/kernels with <build> being
# $KPLEG_BUILD_DIR or the repository's build/. A kernel already unpacked at the
# version apt offers is not fetched again. Each DEST/<name>/kernel.env then says:
#   KPLEG_VM_KERNEL_NAME, KPLEG_VM_KERNEL_PACKAGE, KPLEG_VM_KERNEL_VERSION (package version),
#   KPLEG_VM_KERNEL_RELEASE (uname -r), KPLEG_VM_KERNEL_FLAVOUR, KPLEG_VM_KERNEL_IMAGE (vmlinuz path)
#
# Exit status: 0 all fetched, 3 apt could not provide a package (no network, stale lists),
# 1 any other failure (for example a kernel without BTF), 2 bad usage.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
case "${1:-}" in -h|--help) usage ;; -*) kpleg_vm_log "unknown option $1"; usage ;; esac

dest=${1:-$(kpleg_vm_kernels_dir)}
[ $# -gt 0 ] && shift
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)

kernels=$(kpleg_vm_kernels "$@") || exit 2

STAMP=.kpleg-fetched
BTF_OPTION=CONFIG_DEBUG_INFO_BTF=y

# A meta-package (linux-image-amd64) depends on exactly one versioned image package; follow
# it so the stamp records the kernel really unpacked. Prints "package version".
resolve_package() {
  local pkg=$1
  # Meta-packages chain at most a couple of levels; never loop forever on a broken archive.
  for _ in 1 2 3; do
    local info version target
    info=$(apt-cache show --no-all-versions "$pkg" 2>/dev/null) || return 1
    [ -n "$info" ] || return 1
    version=$(awk '/^Version:/ { print $2; exit }' <<<"$info")
    target=$(awk -F': ' '/^Depends:/ { print $2; exit }' <<<"$info" |
      tr ',' '\n' | sed -n 's/^ *\(linux-image-[0-9][^ ]*\).*/\1/p' | head -n1)
    if [ -z "$target" ]; then
      echo "$pkg $version"
      return 0
    fi
    pkg=$target
  done
  return 1
}

depmod_bin() { command -v depmod || { [ -x /sbin/depmod ] && echo /sbin/depmod; }; }

# Unpacks the .deb into dir and keeps only what booting needs. Prints the kernel release.
unpack() {
  local deb=$1 dir=$2 release
  dpkg-deb -x "$deb" "$dir" || { kpleg_vm_log "cannot unpack $deb"; return 1; }
  # Debian 12 ships lib/modules; merged-/usr packages of later releases ship usr/lib/modules.
  if [ ! -d "$dir/lib/modules" ] && [ -d "$dir/usr/lib/modules" ]; then
    mkdir -p "$dir/lib"
    mv "$dir/usr/lib/modules" "$dir/lib/modules"
  fi
  rm -rf "${dir:?}/usr" "${dir:?}/etc"
  local images=("$dir"/boot/vmlinuz-*)
  [ -f "${images[0]}" ] || { kpleg_vm_log "$deb has no boot/vmlinuz-*"; return 1; }
  release=${images[0]##*/vmlinuz-}
  [ -d "$dir/lib/modules/$release" ] || { kpleg_vm_log "$deb has no lib/modules/$release"; return 1; }
  echo "$release"
}

fetch_one() {
  local name=$1 pkg=$2 flavour=$3
  local kdir=$dest/$name
  case "$flavour" in generic|cloud) ;; *)
    kpleg_vm_log "$name: unknown flavour '$flavour' (generic or cloud)"; return 1 ;;
  esac

  local resolved real_pkg version
  if ! resolved=$(resolve_package "$pkg"); then
    if [ -f "$kdir/$STAMP" ]; then
      kpleg_vm_log "$name: apt does not know $pkg; using the cached $(cat "$kdir/$STAMP")"
      return 0
    fi
    kpleg_vm_log "$name: apt has no package $pkg (run apt-get update; the archive must be Debian 12's)"
    return "$KPLEG_VM_EXIT_UNAVAILABLE"
  fi
  read -r real_pkg version <<<"$resolved"
  local want="$real_pkg=$version"

  if [ -f "$kdir/$STAMP" ] && [ "$(cat "$kdir/$STAMP")" = "$want" ]; then
    echo "$name: $want already unpacked in $kdir"
    return 0
  fi

  local work
  work=$(mktemp -d "$dest/.fetch-$name.XXXXXX")
  # fetch_one runs in its own subshell (see the loop below).
  # shellcheck disable=SC2064  # expand now: work is local
  trap "rm -rf '$work'" EXIT
  echo "$name: downloading $want"
  local apt_opts=()
  # apt's download sandbox user cannot write into a private temporary directory.
  [ "$(id -u)" -eq 0 ] && apt_opts+=(-o APT::Sandbox::User=root)
  if ! (cd "$work" && apt-get download -q "${apt_opts[@]}" "$want" >"$work/apt.log" 2>&1); then
    sed 's/^/  apt: /' "$work/apt.log" >&2
    if [ -f "$kdir/$STAMP" ]; then
      kpleg_vm_log "$name: apt cannot fetch $want; using the cached $(cat "$kdir/$STAMP")"
      return 0
    fi
    kpleg_vm_log "$name: apt cannot fetch $want (no network to the Debian archive, or stale package lists: run apt-get update)"
    return "$KPLEG_VM_EXIT_UNAVAILABLE"
  fi

  local debs=("$work"/*.deb) release
  mkdir "$work/root" || return 1
  release=$(unpack "${debs[0]}" "$work/root") || return 1

  local config=$work/root/boot/config-$release
  if ! grep -qx "$BTF_OPTION" "$config" 2>/dev/null; then
    kpleg_vm_log "$name: $want is built without BTF ($BTF_OPTION missing from boot/config-$release); kpleg's CO-RE programs need it"
    return 1
  fi
  if [ "$flavour" = generic ] && ! grep -Eqx 'CONFIG_NET_9P_VIRTIO=[ym]' "$config"; then
    kpleg_vm_log "$name: $want has no 9p over virtio; list it with flavour cloud or pick another package"
    return 1
  fi

  local depmod
  depmod=$(depmod_bin) || { kpleg_vm_log "depmod not found (install kmod)"; return 1; }
  "$depmod" -b "$work/root" "$release" || { kpleg_vm_log "$name: depmod failed"; return 1; }

  ln -s "boot/vmlinuz-$release" "$work/root/vmlinuz" || return 1
  cat >"$work/root/kernel.env" <<ENV
KPLEG_VM_KERNEL_NAME=$name
KPLEG_VM_KERNEL_PACKAGE=$real_pkg
KPLEG_VM_KERNEL_VERSION=$version
KPLEG_VM_KERNEL_RELEASE=$release
KPLEG_VM_KERNEL_FLAVOUR=$flavour
KPLEG_VM_KERNEL_IMAGE=boot/vmlinuz-$release
ENV
  echo "$want" >"$work/root/$STAMP" || return 1

  if ! rm -rf "$kdir" || ! mv "$work/root" "$kdir"; then
    kpleg_vm_log "$name: cannot move the kernel into $kdir"
    return 1
  fi
  echo "$name: unpacked Linux $release ($want) into $kdir"
}

status=0
while read -r name pkg flavour; do
  # One fetch per kernel at a time, also across concurrent test runs. The subshell is checked
  # with ||, which turns set -e off inside it: fetch_one checks every step itself.
  rc=0
  (
    flock 9
    fetch_one "$name" "$pkg" "$flavour"
  ) 9>"$dest/.$name.lock" || rc=$?
  if [ "$rc" -ne 0 ]; then
    # "Unavailable" only when nothing worse happened to another kernel.
    if [ "$rc" -eq "$KPLEG_VM_EXIT_UNAVAILABLE" ] && [ "$status" -eq 0 ]; then
      status=$rc
    elif [ "$rc" -ne "$KPLEG_VM_EXIT_UNAVAILABLE" ]; then
      status=1
    fi
  fi
done <<<"$kernels"
exit "$status"
