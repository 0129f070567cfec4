# shellcheck shell=bash disable=SC2034,SC2153  # variables shared with testbed.sh and its other parts
# The test bed's image, $IMAGE: busybox-static's applets in /bin, a pause binary at /pause
# (scripts/testbed/pause.c), default command /pause. It is every pod's sandbox image and the
# image of the tests' containers; nothing is ever pulled. Sourced by scripts/testbed.sh.

# shellcheck source=scripts/lib/oci.sh
. "$REPO/scripts/lib/oci.sh"

# Builds $IMAGE_DIR/image.tar (scripts/lib/oci.sh: one reproducible layer, so the image digest
# is stable across rebuilds). Rebuilt only when pause.c, busybox or the scripts that make it
# change; sets IMAGE_REBUILT=1 then.
build_image() {
  local busybox=/bin/busybox stamp rootfs a
  [ -x "$busybox" ] || die "$busybox missing (package busybox-static)"
  if ldd "$busybox" >/dev/null 2>&1; then
    die "$busybox is dynamically linked; install busybox-static"
  fi
  stamp=$(cat "$HERE/pause.c" "$busybox" "${BASH_SOURCE[0]}" "$REPO/scripts/lib/oci.sh" |
    sha256sum | cut -d' ' -f1)
  if [ -f "$IMAGE_DIR/image.tar" ] && [ "$(cat "$IMAGE_DIR/stamp" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  IMAGE_REBUILT=1
  log "building image $IMAGE"
  rm -rf "$IMAGE_DIR"
  rootfs=$IMAGE_DIR/rootfs
  mkdir -p "$rootfs"/{bin,dev,proc,sys,etc,root,run,var,tmp}
  chmod 1777 "$rootfs/tmp"
  gcc -static -O2 -s -Wall -Wextra -Werror -o "$rootfs/pause" "$HERE/pause.c" ||
    die "compiling scripts/testbed/pause.c failed (needs gcc and libc6-dev)"
  cp "$busybox" "$rootfs/bin/busybox"
  for a in $("$busybox" --list); do
    [ "$a" = busybox ] || ln -s busybox "$rootfs/bin/$a"
  done
  for a in sh sleep true false kill cat echo dd head yes; do
    [ -e "$rootfs/bin/$a" ] || die "busybox has no applet '$a'"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
  oci_image_archive "$rootfs" "$IMAGE_DIR" "$IMAGE" \
    '{"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
      "Cmd": ["/pause"], "WorkingDir": "/"}' \
    '{"created_by": "scripts/testbed.sh: busybox-static and pause"}'
  echo "$stamp" >"$IMAGE_DIR/stamp"
}
