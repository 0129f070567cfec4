#!/usr/bin/env bash
# One kernel of the VM matrix: fetch it (cached), boot it, run kpleg's self-test in it.
#
#   vmtests/vmtest.sh NAME
#
# NAME is a kernel of vmtests/kernels.txt. An arm64 kernel (package <name>:arm64) boots under
# qemu-system-aarch64 into the arm64 root of scripts/sysroot.sh and runs the cross-built kplegd
# ($KPLEG_ARM64_BUILD_DIR, default $KPLEG_BUILD_DIR/arm64, built by scripts/cross-arm64.sh).
# Environment:
#   KPLEG_BUILD_DIR        the build tree, shared writable with the guest (default <repo>/build)
#   KPLEG_VM_KERNELS_DIR   the kernel cache (default $KPLEG_BUILD_DIR/vmtests/kernels)
#   KPLEG_VMTEST_CMD       the guest check, a /bin/sh command line run in the repository
#                          (default: "$KPLEG_BUILD_DIR/bin/kplegd" --self-test)
#   KPLEG_VMTEST_PREPARE   a /bin/sh command line run on the host before the boot (default none)
#   KPLEG_VMTEST_TIMEOUT   seconds for boot and check together (default 480)
#   KPLEG_REQUIRE_PRIVILEGED=1  turn a skip (no qemu, kernel not fetchable) into a failure
# plus those of run-in-vm.sh (KPLEG_VM_RUNNER, KPLEG_VM_ACCEL, ...).
#
# Exit status: 0 pass, 77 skipped (CTest's SKIP_RETURN_CODE), anything else a failure, which
# the last line names: the kernel, the check and how it failed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [ $# -ne 1 ] || [[ "$1" == -* ]]; then
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
name=$1

build_dir=${KPLEG_BUILD_DIR:-$KPLEG_REPO_ROOT/build}
[ -d "$build_dir" ] || { echo "FAIL: vmtest $name: build directory $build_dir does not exist"; exit 1; }
build_dir=$(cd "$build_dir" && pwd)
export KPLEG_BUILD_DIR=$build_dir
KPLEG_VM_KERNELS_DIR=$(kpleg_vm_kernels_dir)
export KPLEG_VM_KERNELS_DIR
arm64_build_dir=${KPLEG_ARM64_BUILD_DIR:-$build_dir/arm64}
timeout_s=${KPLEG_VMTEST_TIMEOUT:-480}

skip() {
  if [ "${KPLEG_REQUIRE_PRIVILEGED:-0}" = 1 ]; then
    echo "FAIL: vmtest $name: $* (KPLEG_REQUIRE_PRIVILEGED=1 forbids skipping)"
    exit 1
  fi
  echo "SKIP: $*"
  exit "$KPLEG_VM_EXIT_SKIP"
}
fail() { echo "FAIL: vmtest $name: $*"; exit 1; }

entry=$(kpleg_vm_kernels "$name") || fail "no such kernel in $KPLEG_VM_KERNEL_LIST"
read -r _ package flavour _ <<<"$entry"
arch=x86_64
kplegd=$build_dir/bin/kplegd
if [[ "$package" == *:arm64 ]]; then
  arch=arm64
  kplegd=$arm64_build_dir/bin/kplegd
  # The guest sees only the build tree it shares.
  case "$arm64_build_dir/" in "$build_dir"/*) ;; *)
    fail "KPLEG_ARM64_BUILD_DIR ($arm64_build_dir) must be inside KPLEG_BUILD_DIR ($build_dir), which the guest shares" ;;
  esac
fi
check=${KPLEG_VMTEST_CMD:-"$kplegd" --self-test}

runner=${KPLEG_VM_RUNNER:-auto}
# vng boots the host's architecture only.
[ "$arch" = x86_64 ] || runner=qemu
if [ "$runner" = auto ]; then
  if command -v vng >/dev/null; then runner=vng; else runner=qemu; fi
fi
case "$runner" in
  vng)
    command -v vng >/dev/null || skip "vng is not installed (scripts/vng.sh)"
    # Without virtiofsd vng shares the root over 9p, which cloud kernels do not have.
    if [ "$flavour" = cloud ] && ! command -v virtiofsd >/dev/null; then
      skip "kernel $name is a cloud kernel: vng needs virtiofsd on PATH to boot it (scripts/virtiofsd.sh)"
    fi
    ;;
  qemu)
    if [ "$arch" = arm64 ]; then
      command -v qemu-system-aarch64 >/dev/null || skip "qemu-system-aarch64 is not installed (scripts/install-deps.sh: qemu-system-arm)"
      [ -f "${KPLEG_SYSROOT:-/var/cache/kpleg/sysroot-arm64}/root/.kpleg-sysroot" ] ||
        skip "no arm64 root to boot into (scripts/sysroot.sh, run by scripts/cross-arm64.sh)"
      [ -x "$kplegd" ] || [ -n "${KPLEG_VMTEST_CMD:-}" ] ||
        skip "the arm64 kplegd is not built ($kplegd: scripts/cross-arm64.sh)"
    else
      command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 is not installed (scripts/install-deps.sh)"
      [ "$(uname -m)" = x86_64 ] || skip "the qemu runner boots x86_64 kernels only"
    fi
    [ "$flavour" != cloud ] || skip "kernel $name is a cloud kernel, without 9p: the qemu runner cannot boot it (vng can)"
    ;;
  *) fail "KPLEG_VM_RUNNER is auto, qemu or vng, not '$runner'" ;;
esac
command -v apt-get >/dev/null || [ -f "$KPLEG_VM_KERNELS_DIR/$name/kernel.env" ] ||
  skip "kernel $name is not fetched and apt-get is not available to fetch $package"

fetch_rc=0
"$KPLEG_VM_DIR/fetch-kernels.sh" "$KPLEG_VM_KERNELS_DIR" "$name" || fetch_rc=$?
case "$fetch_rc" in
  0) ;;
  "$KPLEG_VM_EXIT_UNAVAILABLE") skip "kernel $name ($package) cannot be fetched: apt cannot reach the Debian archive" ;;
  *) fail "fetching kernel $name ($package) failed (status $fetch_rc)" ;;
esac
release=$(sed -n 's/^KPLEG_VM_KERNEL_RELEASE=//p' "$KPLEG_VM_KERNELS_DIR/$name/kernel.env")
version=$(sed -n 's/^KPLEG_VM_KERNEL_VERSION=//p' "$KPLEG_VM_KERNELS_DIR/$name/kernel.env")
kernel="Linux $release (Debian $version, $arch)"

if [ -z "${KPLEG_VMTEST_CMD:-}" ] && [ ! -x "$kplegd" ]; then
  fail "on $kernel: $kplegd is not built (cmake --build $build_dir --target kplegd)"
fi

if [ -n "${KPLEG_VMTEST_PREPARE:-}" ] && ! (cd "$KPLEG_REPO_ROOT" && /bin/sh -c "$KPLEG_VMTEST_PREPARE"); then
  fail "on $kernel: the host's preparation '$KPLEG_VMTEST_PREPARE' failed"
fi

echo "vmtest $name: booting Linux $release, check: $check"
output=$(mktemp "${TMPDIR:-/tmp}/kpleg-vmtest.XXXXXX")
trap 'rm -f "$output"' EXIT
# A VM that ends without reporting the check's status is booted once more: under software
# emulation (TCG) a guest kernel can trip over its own live text patching (an "Oops: int3" in
# a static-branch site while a tracepoint is switched), which says nothing about the check. A
# check that fails, or a VM that fails twice, is a failure.
for attempt in 1 2; do
  rc=0
  "$KPLEG_VM_DIR/run-in-vm.sh" --kernel "$KPLEG_VM_KERNELS_DIR/$name" --rwdir "$build_dir" \
    --timeout "$timeout_s" --runner "$runner" -- /bin/sh -c "$check" | tee "$output" || rc=${PIPESTATUS[0]}
  [ "$attempt" = 1 ] || break
  if [ "$rc" = "$KPLEG_VM_EXIT_VM_FAILURE" ]; then
    echo "vmtest $name: the VM failed before the check reported its status; booting it once more"
  elif [ "$rc" = "$KPLEG_VM_EXIT_TIMEOUT" ] && grep -aq 'rcu_sched kthread starved' "$output"; then
    # The guest kernel itself says its vCPUs got no time (an emulated guest on a busy host).
    echo "vmtest $name: the guest ran out of time with its vCPUs starved (rcu_sched kthread starved); booting it once more"
  else
    break
  fi
done

# What the check said about its failure: its lines that report one (a self-test names each
# failed check before its verdict), else its last line; the kernel's and the runner's own lines
# are left out.
check_output=$(grep -avE '^(\[ *[0-9]+\.[0-9]+\]|KPLEG_VM_EXIT\.|qemu-system-[a-z0-9_]+: |kpleg-vm: .* running the command$)' "$output" |
  tr -d '\r' | sed '/^[[:space:]]*$/d' || true)
said=$(grep -E 'FAIL|[Ff]ailed|[Ee]rror' <<<"$check_output" | head -n5 | awk 'NR > 1 { printf " | " } { printf "%s", $0 }' || true)
[ -n "$said" ] || said=$(tail -n1 <<<"$check_output")

case "$rc" in
  0) echo "PASS: vmtest $name on $kernel: $check" ;;
  "$KPLEG_VM_EXIT_TIMEOUT") fail "on $kernel: '$check' did not finish within ${timeout_s}s (last output: ${said:-none})" ;;
  "$KPLEG_VM_EXIT_VM_FAILURE") fail "on $kernel: the VM failed before '$check' reported a result (last output: ${said:-none})" ;;
  *) fail "on $kernel: '$check' failed with status $rc: ${said:-no output}" ;;
esac
