#!/usr/bin/env bash
# Boots a kernel in a VM and runs one command there, on the host's own userspace.
#
#   vmtests/run-in-vm.sh --kernel KERNEL [options] -- COMMAND [ARG...]
#
# KERNEL is a directory unpacked by fetch-kernels.sh, a name from kernels.txt (looked up where
# fetch-kernels.sh puts it by default), or a vmlinuz file (its modules are
# looked for in ../lib/modules/<release> and /lib/modules/<release>).
#
# The guest sees the host's root filesystem read-only, the writable directories (--rwdir) at
# their host paths, fresh /proc, /sys, /dev, /run, /tmp and /var/tmp (tmpfs), pure cgroup2 at
# /sys/fs/cgroup, tracefs at /sys/kernel/tracing, debugfs and bpffs. The command runs as root in
# --cwd with HOME=/tmp/home and the caller's KPLEG_* variables. Its output is the guest console.
#
# Options:
#   --kernel KERNEL    the kernel to boot (or $KPLEG_VM_KERNEL)
#   --timeout S        wall-clock limit for the whole VM, boot included (default 300)
#   --memory M         guest memory, qemu syntax (default 1G)
#   --cpus N           guest CPUs (default: 2, fewer if the host has fewer)
#   --rwdir DIR        share DIR writable at the same path; repeatable. Default: the build
#                      directory ($KPLEG_BUILD_DIR, else <repo>/build when it exists)
#   --cwd DIR          the command's working directory (default: the repository)
#   --runner R         auto (vng when on PATH, else qemu), vng or qemu (or $KPLEG_VM_RUNNER)
#   --append ARGS      extra kernel command line arguments (or $KPLEG_VM_APPEND)
#   --verbose          show the kernel's boot messages
#   --keep             keep the run directory (console log, initramfs config) after success
#
# KPLEG_VM_MODULES: more modules the qemu runner loads at boot (for example overlay, which a
# container runtime mounts and a guest without its own modprobe cannot load on demand).
#
# Acceleration: KVM when /dev/kvm is writable and the CPU has vmx or svm, else TCG;
# KPLEG_VM_ACCEL=kvm|tcg overrides.
#
# Exit status: the command's own, or 124 when the timeout expired, 125 when the VM failed (no
# boot, guest init failure, no exit status reported), 2 for bad usage.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
die_usage() { kpleg_vm_log "$*"; exit 2; }
vm_failure() { kpleg_vm_log "VM failure: $*"; exit "$KPLEG_VM_EXIT_VM_FAILURE"; }

kernel_arg=${KPLEG_VM_KERNEL:-}
timeout_s=300
memory=1G
cpus=$(( $(nproc) < 2 ? $(nproc) : 2 ))
rwdirs=()
cwd=$KPLEG_REPO_ROOT
runner=${KPLEG_VM_RUNNER:-auto}
append=${KPLEG_VM_APPEND:-}
verbose=0
keep=0

while [ $# -gt 0 ]; do
  case "$1" in
    --kernel) kernel_arg=${2:?--kernel needs a value}; shift 2 ;;
    --timeout) timeout_s=${2:?--timeout needs a value}; shift 2 ;;
    --memory) memory=${2:?--memory needs a value}; shift 2 ;;
    --cpus) cpus=${2:?--cpus needs a value}; shift 2 ;;
    --rwdir) rwdirs+=("${2:?--rwdir needs a value}"); shift 2 ;;
    --cwd) cwd=${2:?--cwd needs a value}; shift 2 ;;
    --runner) runner=${2:?--runner needs a value}; shift 2 ;;
    --append) append="$append ${2:?--append needs a value}"; shift 2 ;;
    --verbose) verbose=1; shift ;;
    --keep) keep=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    *) die_usage "unknown argument '$1' (the command goes after --)" ;;
  esac
done
[ $# -gt 0 ] || die_usage "no command given (run-in-vm.sh --kernel K -- COMMAND...)"
[ -n "$kernel_arg" ] || die_usage "no kernel given (--kernel or KPLEG_VM_KERNEL)"
[[ "$timeout_s" =~ ^[1-9][0-9]*$ ]] || die_usage "--timeout wants whole seconds, got '$timeout_s'"
[[ "$cpus" =~ ^[1-9][0-9]*$ ]] || die_usage "--cpus wants a positive number, got '$cpus'"
case "$runner" in auto|qemu|vng) ;; *) die_usage "--runner is auto, qemu or vng, not '$runner'" ;; esac
[ -d "$cwd" ] || die_usage "--cwd $cwd is not a directory"
cwd=$(cd "$cwd" && pwd)

if [ ${#rwdirs[@]} -eq 0 ]; then
  if [ -n "${KPLEG_BUILD_DIR:-}" ]; then
    rwdirs=("$KPLEG_BUILD_DIR")
  elif [ -d "$KPLEG_REPO_ROOT/build" ]; then
    rwdirs=("$KPLEG_REPO_ROOT/build")
  fi
fi
for i in "${!rwdirs[@]}"; do
  [ -d "${rwdirs[$i]}" ] || die_usage "--rwdir ${rwdirs[$i]} is not a directory"
  rwdirs[i]=$(cd "${rwdirs[$i]}" && pwd)
  # The guest reads these paths from a shell fragment and mounts on them.
  [[ "${rwdirs[$i]}" =~ ^/[A-Za-z0-9._+/@-]*$ ]] ||
    die_usage "--rwdir ${rwdirs[$i]}: only letters, digits and ._+-@ are supported in shared paths"
  [ "${rwdirs[$i]}" != / ] || die_usage "--rwdir / would make the host root writable"
done

# --- the kernel -------------------------------------------------------------------------------

kernel_arch=x86_64 # x86_64 or arm64 (kernel.env, else the image's type)
kernel_image=""    # the vmlinuz to boot
kernel_release=""  # its uname -r
modules_dir=""     # its lib/modules/<release>, if any

release_of_image() {
  local image=$1 base
  base=$(basename "$image")
  if [[ "$base" == vmlinuz-* ]]; then
    echo "${base#vmlinuz-}"
  elif command -v file >/dev/null; then
    file -bL "$image" | sed -n 's/.*[, ]version \([^ ]*\) .*/\1/p'
  fi
}

resolve_kernel() {
  local arg=$1
  if [ ! -e "$arg" ] && [[ "$arg" != */* ]] && [ -d "$(kpleg_vm_kernels_dir)/$arg" ]; then
    arg=$(kpleg_vm_kernels_dir)/$arg
  fi
  if [ -d "$arg" ]; then
    local dir
    dir=$(cd "$arg" && pwd)
    if [ -f "$dir/kernel.env" ]; then
      kernel_release=$(sed -n 's/^KPLEG_VM_KERNEL_RELEASE=//p' "$dir/kernel.env")
      kernel_image=$dir/$(sed -n 's/^KPLEG_VM_KERNEL_IMAGE=//p' "$dir/kernel.env")
      kernel_arch=$(sed -n 's/^KPLEG_VM_KERNEL_ARCH=//p' "$dir/kernel.env")
    else
      local images=("$dir"/boot/vmlinuz-*)
      if [ ${#images[@]} -ne 1 ] || [ ! -f "${images[0]}" ]; then
        die_usage "--kernel $arg: expected one boot/vmlinuz-* (a directory from fetch-kernels.sh)"
      fi
      kernel_image=${images[0]}
      kernel_release=$(release_of_image "$kernel_image")
    fi
    modules_dir=$dir/lib/modules/$kernel_release
  elif [ -f "$arg" ]; then
    kernel_image=$(cd "$(dirname "$arg")" && pwd)/$(basename "$arg")
    kernel_release=$(release_of_image "$kernel_image")
    [ -n "$kernel_release" ] || die_usage "--kernel $arg: cannot tell its release (name it vmlinuz-<release>)"
    local candidate
    for candidate in "$(dirname "$kernel_image")/../lib/modules/$kernel_release" "/lib/modules/$kernel_release"; do
      if [ -d "$candidate" ]; then modules_dir=$(cd "$candidate" && pwd); break; fi
    done
  else
    die_usage "--kernel $arg: no such file, directory or fetched kernel (run vmtests/fetch-kernels.sh)"
  fi
  [ -f "$kernel_image" ] || die_usage "--kernel $arg: $kernel_image is missing"
  if [ -z "$kernel_arch" ]; then
    kernel_arch=x86_64
    if command -v file >/dev/null && file -bL "$kernel_image" | grep -q ARM64; then kernel_arch=arm64; fi
  fi
  [ -n "$kernel_release" ] || die_usage "--kernel $arg: cannot tell its release"
  if [ -n "$modules_dir" ] && [ ! -d "$modules_dir" ]; then modules_dir=""; fi
}
resolve_kernel "$kernel_arg"

# An arm64 guest cannot run the host's userspace: it boots into the arm64 Debian root of
# scripts/sysroot.sh instead (read-only as the host's root is), where the writable directories
# get mount points made from the host. The command runs in the first of them.
guest_root=/
if [ "$kernel_arch" = arm64 ]; then
  guest_root=${KPLEG_SYSROOT:-/var/cache/kpleg/sysroot-arm64}/root
  [ -f "$guest_root/.kpleg-sysroot" ] || vm_failure "no arm64 root in $guest_root (scripts/sysroot.sh makes it)"
  [ "$runner" != vng ] || die_usage "vng boots the host's architecture only; arm64 kernels take --runner qemu"
  runner=qemu
  for dir in "${rwdirs[@]}"; do mkdir -p "$guest_root$dir"; done
  [ -d "$guest_root$cwd" ] || cwd=${rwdirs[0]:-/}
fi

# --- the run directory ------------------------------------------------------------------------

if [ "$runner" = auto ]; then
  if command -v vng >/dev/null; then runner=vng; else runner=qemu; fi
fi

# The guest reads the command from the run directory and writes the exit status there. The qemu
# runner shares it under a tag of its own; vng shares it at its host path, so it must not be
# under a directory vng's guest covers with a tmpfs (/tmp, /run, /var/tmp).
if [ "$runner" = vng ]; then
  if [ ${#rwdirs[@]} -gt 0 ]; then
    run_base=${rwdirs[0]}/.kpleg-vm
  else
    run_base=${XDG_CACHE_HOME:-$HOME/.cache}/kpleg-vm/run
  fi
  mkdir -p "$run_base"
  rundir=$(mktemp -d "$run_base/run.XXXXXX")
else
  rundir=$(mktemp -d "${TMPDIR:-/tmp}/kpleg-vm.XXXXXX")
fi
log=$rundir/console.log
nonce=$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local rc=$?
  if [ "$rc" -eq 0 ] && [ "$keep" -eq 0 ]; then
    rm -rf "$rundir"
    [ -z "${run_base:-}" ] || rmdir "$run_base" 2>/dev/null || true
  else
    kpleg_vm_log "console log and run files kept in $rundir"
  fi
}
trap cleanup EXIT

shell_quote() { local s=${1//\'/\'\\\'\'}; printf "'%s'" "$s"; }

# cmd.sh runs under the host's /bin/sh in the guest.
{
  echo '# generated by run-in-vm.sh'
  while IFS='=' read -r name _; do
    [[ "$name" =~ ^KPLEG_[A-Za-z0-9_]*$ ]] || continue
    echo "export $name=$(shell_quote "${!name}")"
  done < <(env)
  # The arm64 root has no ld.so.cache: the loader is told where Debian's multiarch libraries are.
  [ "$kernel_arch" != arm64 ] || echo "export LD_LIBRARY_PATH=/usr/lib/aarch64-linux-gnu"
  echo "cd $(shell_quote "$cwd") || { echo 'kpleg-vm: cannot enter $cwd'; exit $KPLEG_VM_EXIT_VM_FAILURE; }"
  printf 'exec'
  for word in "$@"; do printf ' %s' "$(shell_quote "$word")"; done
  printf '\n'
} >"$rundir/cmd.sh"

# --- choosing the runner and the accelerator ---------------------------------------------------

kvm_usable() {
  case "${KPLEG_VM_ACCEL:-auto}" in
    kvm) return 0 ;;
    tcg) return 1 ;;
  esac
  # /dev/kvm can exist without hardware virtualisation behind it (nested setups), and then
  # stock kernels do not boot: ask the CPU too.
  [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo
}

# Starts the VM command in the background under the wall-clock limit, streams its console, and
# sets vm_rc to its exit status (124/137 when the limit killed it).
vm_rc=0
run_vm() {
  # The console goes through a pipe rather than a followed file: `tail -f --pid` can miss the
  # last lines written just before the VM exits, and those are the ones that say why.
  (
    timeout --kill-after=10 "$timeout_s" "$@" </dev/null 2>&1 &
    echo $! >"$rundir/vm.pid"
    rc=0
    wait $! || rc=$?
    echo "$rc" >"$rundir/vm.status"
  ) | tee "$log" | sed -u 's/\r$//' &
  local pipeline=$!
  # A signal to this script must not leave the VM running (bash runs traps while in `wait`).
  trap 'kill -TERM "$(cat "$rundir/vm.pid" 2>/dev/null)" 2>/dev/null; wait '"$pipeline"'; exit 130' INT TERM HUP
  wait "$pipeline" || true
  trap - INT TERM HUP
  vm_rc=$(cat "$rundir/vm.status" 2>/dev/null || echo "$KPLEG_VM_EXIT_VM_FAILURE")
}

started=$(date +%s.%N)

if [ "$runner" = vng ]; then
  command -v vng >/dev/null || vm_failure "--runner vng, but vng is not on PATH"
  # virtme-ng's init mounts cgroup2, tracefs and debugfs but not bpffs; the exit status comes
  # back through the run directory, shared writable, as with the qemu runner.
  cat >"$rundir/vng-exec.sh" <<EOF
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing
mkdir -p /tmp/home
# A copy of the output in the run directory: where virtme-ng finds no virtio console (Debian
# 11's kernel has it as a module) the command's output goes to a console it does not show.
{ HOME=/tmp/home /bin/sh $rundir/cmd.sh; echo \$? >$rundir/exit-status; } 2>&1 | tee $rundir/output
rc=\$(cat $rundir/exit-status)
printf '\nKPLEG_VM_EXIT.$nonce=%s\n' \$rc
EOF
  vng_args=(--run "$kernel_image" --user root --memory "$memory" --cpus "$cpus")
  for dir in "${rwdirs[@]}"; do vng_args+=(--rwdir "$dir"); done
  # Inside the first writable directory the run directory is shared already.
  [ ${#rwdirs[@]} -gt 0 ] || vng_args+=(--rwdir "$rundir")
  kvm_usable || vng_args+=(--disable-kvm)
  [ "$verbose" -eq 1 ] && vng_args+=(--verbose)
  for arg in $append; do vng_args+=(--append "$arg"); done
  kpleg_vm_log "booting Linux $kernel_release with vng (timeout ${timeout_s}s)"
  run_vm vng "${vng_args[@]}" --exec "/bin/sh $rundir/vng-exec.sh"
else
  if [ "$kernel_arch" = arm64 ]; then
    qemu_bin='qemu-system-aarch64'
    command -v "$qemu_bin" >/dev/null || vm_failure "$qemu_bin is not installed (Debian: qemu-system-arm)"
    busybox=$guest_root/bin/busybox
  else
    qemu_bin='qemu-system-x86_64'
    command -v "$qemu_bin" >/dev/null || vm_failure "$qemu_bin is not installed (Debian: qemu-system-x86)"
    [ "$(uname -m)" = x86_64 ] || vm_failure "the qemu runner boots x86_64 kernels only"
    busybox=${KPLEG_VM_BUSYBOX:-/bin/busybox}
  fi
  [ -x "$busybox" ] || vm_failure "$busybox not found (Debian: busybox-static)"
  if [ "$kernel_arch" = x86_64 ] && ldd "$busybox" >/dev/null 2>&1; then
    vm_failure "$busybox is dynamically linked; the initramfs needs a static one (Debian: busybox-static)"
  fi

  # The initramfs: busybox, guest-init.sh as /init, and the kernel's modules that 9p needs, in
  # load order (modprobe resolves the dependencies; built-in ones drop out).
  modules=()
  if [ -n "$modules_dir" ]; then
    modroot=${modules_dir%/lib/modules/*}
    modprobe_bin=$(command -v modprobe || echo /sbin/modprobe)
    if [ ! -f "$modules_dir/modules.dep" ]; then
      depmod_bin=$(command -v depmod || echo /sbin/depmod)
      "$depmod_bin" -b "$modroot" "$kernel_release" ||
        vm_failure "$modules_dir has no modules.dep and depmod failed"
    fi
    # shellcheck disable=SC2086  # a list of module names
    deps=$("$modprobe_bin" -a --show-depends -d "$modroot" -S "$kernel_release" \
      9p 9pnet_virtio virtio_pci ${KPLEG_VM_MODULES:-} 2>&1) ||
      vm_failure "Linux $kernel_release cannot share files with the host (no 9p over virtio): $deps"
    while read -r verb path _; do
      [ "$verb" = insmod ] || continue
      [[ " ${modules[*]} " == *" $path "* ]] || modules+=("$path")
    done <<<"$deps"
  else
    kpleg_vm_log "no modules for $kernel_release found: 9p and virtio must be built in"
  fi

  key=$( { sha256sum "$KPLEG_VM_DIR/guest-init.sh" "$busybox" | cut -d' ' -f1
           echo "$kernel_release ${modules[*]}"; } | sha256sum | cut -c1-16)
  cache_dir=""
  for candidate in "${modules_dir:+$modroot/.initramfs}" "${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/kpleg-vm"; do
    [ -n "$candidate" ] || continue
    if mkdir -p "$candidate" 2>/dev/null && [ -w "$candidate" ]; then cache_dir=$candidate; break; fi
  done
  initrd=${cache_dir:-$rundir}/initramfs-$kernel_release-$key.cpio.gz
  if [ ! -f "$initrd" ]; then
    staging=$rundir/initramfs
    mkdir -p "$staging/bin" "$staging/lib/modules"
    cp "$busybox" "$staging/bin/busybox"
    cp "$KPLEG_VM_DIR/guest-init.sh" "$staging/init"
    chmod 755 "$staging/init" "$staging/bin/busybox"
    : >"$staging/modules.load"
    for path in "${modules[@]}"; do
      name=$(basename "$path")
      # busybox insmod takes plain objects; Debian compresses 6.12's modules with xz.
      case "$name" in
        *.ko.xz) name=${name%.xz}; xz -dc "$path" >"$staging/lib/modules/$name" ;;
        *.ko.zst) name=${name%.zst}; zstd -qdc "$path" >"$staging/lib/modules/$name" ;;
        *.ko.gz) name=${name%.gz}; gzip -dc "$path" >"$staging/lib/modules/$name" ;;
        *) cp "$path" "$staging/lib/modules/$name" ;;
      esac || vm_failure "cannot unpack module $path"
      echo "$name" >>"$staging/modules.load"
    done
    # The host's busybox packs it (the guest's may be another architecture's).
    (cd "$staging" && find . | "${KPLEG_VM_BUSYBOX:-/bin/busybox}" cpio -o -H newc -R 0:0 2>/dev/null | gzip -1) >"$initrd.tmp.$$" ||
      vm_failure "cannot build the initramfs"
    mv "$initrd.tmp.$$" "$initrd"
    rm -rf "$staging"
  fi

  {
    echo "KPLEG_VM_NONCE=$nonce"
    echo "KPLEG_VM_RW_COUNT=${#rwdirs[@]}"
    for i in "${!rwdirs[@]}"; do echo "KPLEG_VM_RW_$i=${rwdirs[$i]}"; done
  } >"$rundir/config"

  # shellcheck disable=SC2054  # the commas are qemu's option syntax
  if [ "$kernel_arch" = arm64 ]; then
    # Software emulation of a generic arm64 machine (PCI, so the same virtio-9p-pci devices).
    accel=(-machine virt -accel tcg,thread=multi -cpu max,pauth-impdef=on)
    console=ttyAMA0
  elif kvm_usable; then
    accel=(-accel kvm -cpu host)
    console=ttyS0
  else
    accel=(-accel tcg,thread=multi -cpu max)
    console=ttyS0
  fi
  cmdline="console=$console panic=-1 oops=panic rdinit=/init"
  [ "$verbose" -eq 1 ] || cmdline="$cmdline quiet"
  [ -z "$append" ] || cmdline="$cmdline $append"

  # shellcheck disable=SC2054
  qemu=("$qemu_bin" -nodefaults -no-user-config -display none -no-reboot
    "${accel[@]}" -smp "$cpus" -m "$memory"
    -kernel "$kernel_image" -initrd "$initrd" -append "$cmdline"
    -serial stdio
    # The host root spans several filesystems: remap inode numbers so they stay unique.
    -fsdev "local,id=hostroot,path=$guest_root,security_model=none,readonly=on,multidevs=remap"
    -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot
    -fsdev "local,id=kplegrun,path=$rundir,security_model=none"
    -device virtio-9p-pci,fsdev=kplegrun,mount_tag=kplegrun)
  for i in "${!rwdirs[@]}"; do
    qemu+=(-fsdev "local,id=kplegrw$i,path=${rwdirs[$i]},security_model=none,multidevs=remap"
      -device "virtio-9p-pci,fsdev=kplegrw$i,mount_tag=kplegrw$i")
  done
  kpleg_vm_log "booting Linux $kernel_release ($kernel_arch) with qemu (${accel[*]}, ${cpus} CPUs, $memory, timeout ${timeout_s}s)"
  run_vm "${qemu[@]}"
fi

elapsed=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

if [ "$runner" = vng ] && [ -s "$rundir/output" ] && ! grep -q "KPLEG_VM_EXIT\.$nonce=" "$log"; then
  kpleg_vm_log "the console did not show the command's output; here it is"
  sed 's/\r$//' "$rundir/output"
fi

status=""
if [ -f "$rundir/exit-status" ]; then
  status=$(tr -dc '0-9' <"$rundir/exit-status")
fi
if [ -z "$status" ]; then
  status=$(tr -d '\r' <"$log" | sed -n "s/^KPLEG_VM_EXIT\.$nonce=\([0-9][0-9]*\)\$/\1/p" | tail -n1)
fi

if [ -n "$status" ]; then
  if [ "$vm_rc" -eq 124 ] || [ "$vm_rc" -eq 137 ]; then
    kpleg_vm_log "the command finished (status $status) but the VM did not power off within ${timeout_s}s"
  fi
  kpleg_vm_log "Linux $kernel_release: command exited with status $status after ${elapsed}s"
  exit "$status"
fi
if [ "$vm_rc" -eq 124 ] || [ "$vm_rc" -eq 137 ]; then
  kpleg_vm_log "Linux $kernel_release: timed out after ${timeout_s}s"
  exit "$KPLEG_VM_EXIT_TIMEOUT"
fi
vm_failure "Linux $kernel_release: the VM ended (status $vm_rc) after ${elapsed}s without reporting the command's exit status"
