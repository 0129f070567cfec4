#!/bin/busybox sh
# PID 1 of the plain qemu runner's guest (run-in-vm.sh packs it into the initramfs as /init).
#
# Loads the 9p modules the kernel lacks, mounts the host's root read-only, the writable shares
# at their host paths, and the kernel filesystems kpleg needs (pure cgroup2, tracefs, bpffs),
# then chroots into the host root to run /run/kpleg-vm/cmd.sh. The command's exit status goes
# to the host through the run share's exit-status file and a console line; any failure here
# powers off without one, which the host reports as a VM failure.
#
# The run share (tag kplegrun) holds: config (shell variables, see run-in-vm.sh), cmd.sh, and
# receives exit-status.

/bin/busybox mkdir -p /proc /sys /dev /mnt/root /kpleg
/bin/busybox mount -t proc proc /proc
/bin/busybox --install -s /bin
export PATH=/bin
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# The kernel found no /dev/console in the initramfs (it holds no device nodes, so building it
# needs no root): take the console now that devtmpfs has it.
exec </dev/console >/dev/console 2>&1

fail() {
  echo "kpleg-vm: guest init failed: $*"
  sync
  poweroff -f
  sleep 5
  exit 1
}

while read -r module; do
  [ -n "$module" ] || continue
  insmod "/lib/modules/$module" || fail "insmod $module"
done </modules.load

# Larger 9p messages: the default (8 KiB on 6.1) makes every file access crawl under TCG.
P9_OPTS=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o "$P9_OPTS,cache=none" kplegrun /kpleg || fail "cannot mount the run share (9p)"
[ -r /kpleg/config ] || fail "the run share has no config"
# shellcheck source=/dev/null  # written by run-in-vm.sh
. /kpleg/config

report() {
  # The file is what the host trusts (9p with cache=none writes through before this returns);
  # the console line is for people reading the log.
  echo "$1" >/kpleg/exit-status
  sync
  printf '\nKPLEG_VM_EXIT.%s=%s\n' "$KPLEG_VM_NONCE" "$1"
}

R=/mnt/root
# The host's files never change under the guest, so the page cache may keep them (loose).
mount -t 9p -o "$P9_OPTS,ro,cache=loose" hostroot "$R" || fail "cannot mount the host root (9p)"

mount -t proc proc "$R/proc" || fail "mount /proc"
mount -t sysfs sysfs "$R/sys" || fail "mount /sys"
mount -t devtmpfs devtmpfs "$R/dev" || fail "mount /dev"
mkdir -p "$R/dev/pts" "$R/dev/shm"
# What udev would add: bash's process substitution opens /dev/fd/N.
ln -sf /proc/self/fd "$R/dev/fd"
ln -sf /proc/self/fd/0 "$R/dev/stdin"
ln -sf /proc/self/fd/1 "$R/dev/stdout"
ln -sf /proc/self/fd/2 "$R/dev/stderr"
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts "$R/dev/pts" || fail "mount /dev/pts"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/dev/shm" || fail "mount /dev/shm"
for dir in /tmp /var/tmp; do
  [ -d "$R$dir" ] && { mount -t tmpfs -o mode=1777 tmpfs "$R$dir" || fail "mount $dir"; }
done
mount -t tmpfs -o mode=755 tmpfs "$R/run" || fail "mount /run"
mount -t cgroup2 cgroup2 "$R/sys/fs/cgroup" || fail "mount cgroup2 on /sys/fs/cgroup"
# Hand every controller to child cgroups, as a node's init does, so tests see a real layout.
# shellcheck disable=SC2013  # one line of space-separated names
for controller in $(cat "$R/sys/fs/cgroup/cgroup.controllers"); do
  echo "+$controller" >"$R/sys/fs/cgroup/cgroup.subtree_control" 2>/dev/null
done
mount -t tracefs tracefs "$R/sys/kernel/tracing" || fail "mount tracefs"
mount -t debugfs debugfs "$R/sys/kernel/debug" || fail "mount debugfs"
mount -t bpf bpf "$R/sys/fs/bpf" || fail "mount bpffs"

# Writable shares, each at the path it has on the host (config: KPLEG_VM_RW_COUNT and
# KPLEG_VM_RW_<i>, shared with tag kplegrw<i>).
i=0
while [ "$i" -lt "${KPLEG_VM_RW_COUNT:-0}" ]; do
  eval "dir=\$KPLEG_VM_RW_$i"
  # Under the guest's own tmpfs (/tmp, /run, /var/tmp) the host's directory is hidden: make
  # the mount point there.
  [ -d "$R$dir" ] || mkdir -p "$R$dir" || fail "writable share $dir has no mount point in the guest"
  mount -t 9p -o "$P9_OPTS,cache=mmap" "kplegrw$i" "$R$dir" || fail "cannot mount writable share $dir (9p)"
  i=$((i + 1))
done

mkdir -p "$R/run/kpleg-vm" "$R/tmp/home"
cp /kpleg/cmd.sh "$R/run/kpleg-vm/cmd.sh" || fail "cannot copy the command"
hostname kpleg-vm
ip link set lo up 2>/dev/null

echo "kpleg-vm: $(uname -r) up in $(cut -d' ' -f1 /proc/uptime) s; running the command"
env -i HOME=/tmp/home TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  chroot "$R" /bin/sh /run/kpleg-vm/cmd.sh
report "$?"
poweroff -f
sleep 5
