#!/usr/bin/env bash
# Builds kplegd's container image without a container engine: an OCI image (one uncompressed,
# reproducible layer) holding the binaries built in build/bin, exactly the shared libraries they
# load (as the dynamic loader of this Debian 12 host resolves them) with the loader itself, and
# the two programs `kplegd --self-test` runs (/bin/sh, /bin/true). Every file sits at the path
# Debian 12 gives it (merged /usr), so the image's file list is the one deploy/Dockerfile's image
# has for the same files (tests/deploy/image_files_test.py checks it).
#
#   scripts/image.sh build            build (or find in the cache); print the OCI archive's path
#   scripts/image.sh list             print the image's files and symlinks, one path a line
#   scripts/image.sh import --address SOCKET [--ctr CTR]
#                                     build, then import into that containerd's k8s.io namespace
#                                     (where the CRI plugin finds it) with ctr
#   scripts/image.sh name             print the image reference
#
# Environment:
#   KPLEG_BIN_DIR      where kplegd and kplegctl are (default <repo>/build/bin)
#   KPLEG_IMAGE        image reference (default localhost/kpleg/kplegd:dev, what
#                      deploy/kplegd-daemonset.yaml runs)
#   KPLEG_IMAGE_CACHE  where built images are kept, one directory per content hash (default
#                      /var/cache/kpleg/images, else ~/.cache/kpleg/images, else
#                      /tmp/kpleg-images-<uid>: the first writable); a build with the same
#                      inputs costs one hash of them
#
# Nothing in the image is generated here except its directories and the JSON documents: no
# /etc/passwd or /etc/group (kplegd runs as uid 0 and looks up no name; --socket-group, which
# does, has no group to find here), no ld.so.cache (the loader searches the multiarch directories
# without one), no locale and no CA certificates (kplegd makes no TLS client connections).
set -euo pipefail
shopt -s inherit_errexit
# Directory modes in the layer must not depend on the caller.
umask 022

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${KPLEG_BIN_DIR:-$REPO/build/bin}
IMAGE=${KPLEG_IMAGE:-localhost/kpleg/kplegd:dev}
# Installed into the image at /usr/local/bin, as deploy/Dockerfile COPYs them.
BINARIES=(kplegd kplegctl)
# Host programs copied at their own paths: `kplegd --self-test` runs /bin/true and /bin/sh.
HOST_PROGRAMS=(/bin/sh /bin/true)
ENTRYPOINT=/usr/local/bin/kplegd

log() { echo "image.sh: $*" >&2; }
die() { echo "image.sh: error: $*" >&2; exit 1; }

# shellcheck source=scripts/lib/oci.sh
. "$REPO/scripts/lib/oci.sh"

cache_dir() {
  local d=${KPLEG_IMAGE_CACHE:-}
  if [ -z "$d" ]; then
    for d in /var/cache/kpleg/images "${XDG_CACHE_HOME:-${HOME:-/nonexistent}/.cache}/kpleg/images" \
      "${TMPDIR:-/tmp}/kpleg-images-$(id -u)"; do
      mkdir -p "$d" 2>/dev/null && [ -w "$d" ] && break
    done
  fi
  { mkdir -p "$d" && [ -w "$d" ]; } || die "cannot write to $d"
  echo "$d"
}

# The host path of every ELF file that goes into the image (before symlinks are resolved): the
# binaries, the host programs, and what ldd says each of them loads, the loader included.
elf_paths() {
  local b
  for b in "${BINARIES[@]}"; do
    [ -x "$BIN/$b" ] || die "$BIN/$b not built (cmake --build build)"
    echo "$BIN/$b"
  done
  printf '%s\n' "${HOST_PROGRAMS[@]}"
  for b in "${BINARIES[@]/#/$BIN/}" "${HOST_PROGRAMS[@]}"; do
    ldd "$b" || die "ldd $b failed (not a dynamically linked ELF file?)"
  done | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u
}

# add_path HOST_PATH: puts HOST_PATH into the rootfs at its canonical place (its directory with
# every symlink resolved, e.g. /lib/x86_64-linux-gnu -> /usr/lib/x86_64-linux-gnu on a merged-/usr
# system), as the symlink it is or the file it is; a symlink brings its target along.
add_path() {
  local p=$1 dir base dest link target
  dir=$(realpath -e "$(dirname "$p")") || die "$p: no such directory"
  base=$(basename "$p")
  dest=$ROOTFS$dir/$base
  [ -e "$dest" ] || [ -L "$dest" ] && return 0
  mkdir -p "$ROOTFS$dir"
  if [ -L "$dir/$base" ]; then
    link=$(readlink "$dir/$base")
    ln -s "$link" "$dest"
    case $link in /*) target=$link ;; *) target=$dir/$link ;; esac
    add_path "$target"
  elif [ -f "$dir/$base" ]; then
    cp "$dir/$base" "$dest"
    chmod "$(stat -c %a "$dir/$base")" "$dest"
  else
    die "$dir/$base is neither a file nor a symlink"
  fi
}

# Content hash of every input: a build whose inputs are unchanged is found in the cache.
input_hash() {
  {
    echo "$IMAGE $(oci_arch)"
    sha256sum "${BASH_SOURCE[0]}" "$REPO/scripts/lib/oci.sh"
    elf_paths | while read -r p; do
      echo "$p -> $(realpath -e "$p")"
      sha256sum "$(realpath -e "$p")" | cut -d' ' -f1
    done
  } | sha256sum | cut -d' ' -f1
}

# build_into DIR: DIR/rootfs, DIR/image.tar (an OCI image layout as one archive, what
# `ctr images import` takes), DIR/config.json (the image config in it) and DIR/digest.
build_into() {
  local out=$1 p b l
  ROOTFS=$out/rootfs
  mkdir -p "$ROOTFS"/{usr/bin,usr/lib,usr/sbin,usr/local/bin,etc,dev,proc,sys,run,tmp,var}
  chmod 1777 "$ROOTFS/tmp"
  # Debian 12's merged /usr: the top-level directories are symlinks into /usr.
  for l in bin lib sbin; do ln -s "usr/$l" "$ROOTFS/$l"; done
  if [ -L /lib64 ]; then
    mkdir -p "$ROOTFS/usr/lib64"
    ln -s usr/lib64 "$ROOTFS/lib64"
  fi
  for b in "${BINARIES[@]}"; do
    cp "$BIN/$b" "$ROOTFS/usr/local/bin/$b"
    chmod 0755 "$ROOTFS/usr/local/bin/$b"
  done
  elf_paths | while read -r p; do
    case $p in "$BIN"/*) continue ;; esac
    add_path "$p"
  done
  oci_image_archive "$ROOTFS" "$out" "$IMAGE" \
    "$(jq -cn --arg ep "$ENTRYPOINT" '{
        Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        Entrypoint: [$ep], WorkingDir: "/"}')" \
    '{"created": "1970-01-01T00:00:00Z",
      "created_by": "scripts/image.sh: build/bin, the shared libraries they load, /bin/sh, /bin/true"}'
  echo "$OCI_MANIFEST_DIGEST" >"$out/digest"
}

# Prints the directory of the built image (rootfs/, image.tar, config.json, digest).
build() {
  local cache hash dir tmp
  case $IMAGE in *:*) ;; *) die "KPLEG_IMAGE=$IMAGE has no tag" ;; esac
  command -v jq >/dev/null || die "needs jq"
  cache=$(cache_dir)
  hash=$(input_hash)
  dir=$cache/$hash
  if [ -f "$dir/image.tar" ] && [ -f "$dir/digest" ] && [ -f "$dir/config.json" ]; then
    echo "$dir"
    return 0
  fi
  tmp=$(mktemp -d "$cache/.build.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  build_into "$tmp"
  chmod 0755 "$tmp"
  # Two builders of the same inputs make the same bytes: whichever rename comes first wins.
  if ! mv -T "$tmp" "$dir" 2>/dev/null; then
    rm -rf "$tmp"
    [ -f "$dir/image.tar" ] || die "cannot move the image into $dir"
  fi
  trap - EXIT
  log "built $IMAGE ($(cat "$dir/digest")) in $dir"
  # Builds of older inputs (about 250 MB each): keep the last three.
  find "$cache" -mindepth 1 -maxdepth 1 -type d ! -name '.*' -printf '%T@ %p\n' | sort -rn |
    tail -n +4 | cut -d' ' -f2- | xargs -r rm -rf
  echo "$dir"
}

cmd_list() {
  local dir
  dir=$(build)
  (cd "$dir/rootfs" && find . ! -type d -printf '/%P\n' | LC_ALL=C sort)
}

cmd_import() {
  local address="" ctr=ctr dir images
  while [ $# -gt 0 ]; do
    case $1 in
      --address) address=${2:?--address needs a socket path}; shift ;;
      --address=*) address=${1#--address=} ;;
      --ctr) ctr=${2:?--ctr needs a path}; shift ;;
      --ctr=*) ctr=${1#--ctr=} ;;
      *) die "unknown option for import: $1" ;;
    esac
    shift
  done
  [ -n "$address" ] || die "import needs --address <containerd socket>"
  dir=$(build)
  "$ctr" --address "$address" -n k8s.io images import "$dir/image.tar" >&2 ||
    die "ctr images import failed"
  images=$("$ctr" --address "$address" -n k8s.io images ls -q) || die "ctr images ls failed"
  grep -qxF "$IMAGE" <<<"$images" || die "$IMAGE missing after the import"
  echo "$IMAGE"
}

case ${1:-} in
  build) shift; [ $# -eq 0 ] || die "build takes no options"; echo "$(build)/image.tar" ;;
  list) shift; cmd_list ;;
  import) shift; cmd_import "$@" ;;
  name) echo "$IMAGE" ;;
  -h | --help | help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' ;;
  *) die "usage: scripts/image.sh build | list | import --address SOCKET [--ctr CTR] | name" ;;
esac
