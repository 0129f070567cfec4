#!/usr/bin/env bash
# Fetches the kernels of vmtests/kernels.txt from Debian's archive without installing them:
# apt-get download + dpkg-deb -x into DEST/<name>/, keeping boot/ (vmlinuz, config) and
# lib/modules/<version>/ (with a fresh modules.dep, which the package leaves to its postinst).
# A kernel from a Debian release other than the host's (kernels.txt's suite column) comes from
# apt lists of its own under DEST/.apt, read from the mirror the host's Debian sources name
# ($KPLEG_VM_DEBIAN_MIRROR overrides); the host's apt configuration is left alone.
#
#   vmtests/fetch-kernels.sh [DEST] [NAME...]
#
# DEST defaults to $KPLEG_VM_KERNELS_DIR, else <build>/vmtests/kernels with <build> being
# $KPLEG_BUILD_DIR or the repository's build/. A kernel already unpacked at the
# version apt offers is not fetched again. Each DEST/<name>/kernel.env then says:
#   KPLEG_VM_KERNEL_NAME, KPLEG_VM_KERNEL_PACKAGE, KPLEG_VM_KERNEL_VERSION (package version),
#   KPLEG_VM_KERNEL_RELEASE (uname -r), KPLEG_VM_KERNEL_FLAVOUR, KPLEG_VM_KERNEL_IMAGE (vmlinuz path),
#   KPLEG_VM_KERNEL_ARCH (x86_64, or arm64 for a package named <package>:arm64)
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

# The Debian mirror of the host's own sources, for the other suites: the first deb822 stanza
# or one-line source that is not the security archive.
host_mirror() {
  [ -z "${KPLEG_VM_DEBIAN_MIRROR:-}" ] || { echo "$KPLEG_VM_DEBIAN_MIRROR"; return; }
  {
    cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '
      /^URIs:/ { u = $2 } /^Suites:/ { s = $0 }
      /^[[:space:]]*$/ { if (u && s !~ /-security/) print u; u = s = "" }
      END { if (u && s !~ /-security/) print u }'
    awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($(i + 1) !~ /-security/) print $i; break } }' \
      /etc/apt/sources.list 2>/dev/null || true
  } | head -n1 | grep .
}

# apt options for a suite: none for the host's ("-"), else its private lists under DEST/.apt/.
apt_opts_for() {
  local suite=$1 dir=$dest/.apt/$1
  [ "$suite" = - ] && return 0
  printf '%s\n' -o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null \
    -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache" -o Dir::State::status=/dev/null \
    -o APT::Architectures::=amd64 -o APT::Architectures::=arm64 -o Acquire::Languages=none
}

# Refreshes a suite's private apt lists when its source changed or they are a day old. One
# suite per directory: a newer suite's meta-packages would otherwise win over an older one's.
private_apt_update() {
  local suite=$1 dir=$dest/.apt/$1 mirror keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  mirror=$(host_mirror) || { kpleg_vm_log "no Debian mirror in the host's apt sources (set KPLEG_VM_DEBIAN_MIRROR)"; return "$KPLEG_VM_EXIT_UNAVAILABLE"; }
  [ -r "$keyring" ] || { kpleg_vm_log "$keyring missing (Debian: debian-archive-keyring)"; return 1; }
  mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
  local want="deb [signed-by=$keyring] $mirror $suite main"
  if [ "$(cat "$dir/sources.list" 2>/dev/null)" = "$want" ] &&
    [ -n "$(find "$dir/updated" -mmin -1440 2>/dev/null)" ]; then
    return 0
  fi
  echo "$want" >"$dir/sources.list"
  local opts
  mapfile -t opts < <(apt_opts_for "$suite")
  [ "$(id -u)" -eq 0 ] && opts+=(-o APT::Sandbox::User=root)
  if ! apt-get -q "${opts[@]}" update >"$dir/update.log" 2>&1 || grep -q '^[WE]:' "$dir/update.log"; then
    sed 's/^/  apt: /' "$dir/update.log" >&2
    kpleg_vm_log "cannot read the package lists of $suite from $mirror"
    [ -f "$dir/updated" ] && return 0   # stale lists still name packages; the cache may hold them
    return "$KPLEG_VM_EXIT_UNAVAILABLE"
  fi
  touch "$dir/updated"
}

# A meta-package (linux-image-amd64) depends on exactly one versioned image package; follow
# it so the stamp records the kernel really unpacked. Prints "package version".
resolve_package() {
  local pkg=$1 arch="" opts
  mapfile -t opts < <(apt_opts_for "$suite")
  # linux-image-arm64:arm64: the dependencies are named without the architecture.
  case "$pkg" in *:*) arch=:${pkg#*:}; pkg=${pkg%%:*} ;; esac
  # Meta-packages chain at most a couple of levels; never loop forever on a broken archive.
  for _ in 1 2 3; do
    local info version target
    info=$(apt-cache "${opts[@]}" show --no-all-versions "$pkg$arch" 2>/dev/null) || return 1
    [ -n "$info" ] || return 1
    version=$(awk '/^Version:/ { print $2; exit }' <<<"$info")
    target=$(awk -F': ' '/^Depends:/ { print $2; exit }' <<<"$info" |
      tr ',' '\n' | sed -n 's/^ *\(linux-image-[0-9][^ ]*\).*/\1/p' | head -n1)
    if [ -z "$target" ]; then
      echo "$pkg$arch $version"
      return 0
    fi
    pkg=$target
  done
  return 1
}

depmod_bin() { command -v depmod || { [ -x /sbin/depmod ] && echo /sbin/depmod; }; }

# Unpacks the .deb into dir and keeps only what booting needs. Prints the kernel release.
unpack() {
  local dir=$1 release deb
  shift
  for deb in "$@"; do
    dpkg-deb -x "$deb" "$dir" || { kpleg_vm_log "cannot unpack $deb"; return 1; }
  done
  # Debian 12 ships lib/modules; merged-/usr packages of later releases ship usr/lib/modules.
  if [ ! -d "$dir/lib/modules" ] && [ -d "$dir/usr/lib/modules" ]; then
    mkdir -p "$dir/lib"
    mv "$dir/usr/lib/modules" "$dir/lib/modules"
  fi
  rm -rf "${dir:?}/usr" "${dir:?}/etc"
  # The split packages keep vmlinuz and config in lib/modules/<release>/: put them in boot/.
  local split
  for split in "$dir"/lib/modules/*/vmlinuz; do
    [ -f "$split" ] || continue
    release=$(basename "$(dirname "$split")")
    mkdir -p "$dir/boot"
    mv "$split" "$dir/boot/vmlinuz-$release"
    [ ! -f "$dir/lib/modules/$release/config" ] || mv "$dir/lib/modules/$release/config" "$dir/boot/config-$release"
  done
  local images=("$dir"/boot/vmlinuz-*)
  [ -f "${images[0]}" ] || { kpleg_vm_log "$* has no boot/vmlinuz-*"; return 1; }
  release=${images[0]##*/vmlinuz-}
  [ -d "$dir/lib/modules/$release" ] || { kpleg_vm_log "$* has no lib/modules/$release"; return 1; }
  echo "$release"
}

fetch_one() {
  local name=$1 pkg=$2 flavour=$3 suite=$4
  local kdir=$dest/$name
  case "$flavour" in generic|cloud) ;; *)
    kpleg_vm_log "$name: unknown flavour '$flavour' (generic or cloud)"; return 1 ;;
  esac

  if [ "$suite" != - ]; then
    local rc=0
    (flock 8; private_apt_update "$suite") 8>"$dest/.apt-$suite.lock" || rc=$?
    [ "$rc" -eq 0 ] || return "$rc"
  fi

  local resolved real_pkg version
  if ! resolved=$(resolve_package "$pkg"); then
    if [ -f "$kdir/$STAMP" ]; then
      kpleg_vm_log "$name: apt does not know $pkg; using the cached $(cat "$kdir/$STAMP")"
      return 0
    fi
    kpleg_vm_log "$name: apt has no package $pkg$([ "$suite" = - ] && echo " (run apt-get update; the host's archive must be Debian 12's)" || echo " in $suite")"
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
  local apt_opts
  mapfile -t apt_opts < <(apt_opts_for "$suite")
  # apt's download sandbox user cannot write into a private temporary directory.
  [ "$(id -u)" -eq 0 ] && apt_opts+=(-o APT::Sandbox::User=root)
  # Debian 13's backports split the image into linux-binary-* (vmlinuz), linux-modules-* and
  # linux-base-* (config), which the image package depends on at its own version.
  local parts=("$want") part arch=""
  case "$real_pkg" in *:*) arch=:${real_pkg#*:} ;; esac
  for part in $(apt-cache "${apt_opts[@]}" show --no-all-versions "$real_pkg" 2>/dev/null |
      awk -F': ' '/^Depends:/ { print $2; exit }' | tr ',' '\n' |
      sed -n 's/^ *\(linux-\(binary\|modules\|base\)-[^ ]*\) .*/\1/p'); do
    parts+=("$part$arch=$version")
  done
  if ! (cd "$work" && apt-get download -q "${apt_opts[@]}" "${parts[@]}" >"$work/apt.log" 2>&1); then
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
  release=$(unpack "$work/root" "${debs[@]}") || return 1

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
KPLEG_VM_KERNEL_ARCH=$(case "$real_pkg" in *:arm64) echo arm64 ;; *) echo x86_64 ;; esac)
ENV
  echo "$want" >"$work/root/$STAMP" || return 1

  if ! rm -rf "$kdir" || ! mv "$work/root" "$kdir"; then
    kpleg_vm_log "$name: cannot move the kernel into $kdir"
    return 1
  fi
  echo "$name: unpacked Linux $release ($want) into $kdir"
}

status=0
while read -r name pkg flavour suite; do
  # One fetch per kernel at a time, also across concurrent test runs. The subshell is checked
  # with ||, which turns set -e off inside it: fetch_one checks every step itself.
  rc=0
  (
    flock 9
    fetch_one "$name" "$pkg" "$flavour" "$suite"
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
