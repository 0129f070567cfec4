#!/bin/sh
# The guest side of vmtest.container.<kernel>: a real container on the booted kernel. Runs in the
# VM as root, on the host's userspace (run-in-vm.sh), on a cgroup2-only guest.
#
#   vmtests/container-check.sh BUILD_DIR
#
# Brings up the test bed (scripts/testbed.sh: the host's Debian containerd 1.6 and runc, the
# local busybox image, no network) in the guest's /run, then runs the end-to-end lifecycle
# tests in ebpf mode: the real kplegd against that containerd, each container's events checked
# against what the runtime reports (a start and an exit with code 0 and 3, an OOM kill through
# the container's memory limit reported as OOMKilled, a stop and a removal of a container and
# then of its pod). The test bed is not taken down: the VM powers off with it.
set -u
build=${1:?usage: container-check.sh BUILD_DIR}
repo=$(cd "$(dirname "$0")/.." && pwd)

# Nothing of the host's test bed: a private one in the guest's tmpfs.
unset KPLEG_RUNTIME_ENDPOINT KPLEG_TESTBED_RUNTIME
export KPLEG_TESTBED_DIR=/run/kpleg-testbed
export KPLEG_REQUIRE_PRIVILEGED=1

# The hosts here are hybrid (v1 controllers beside cgroup2); this guest must not be.
if [ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ]; then
  echo "FAIL: /sys/fs/cgroup is not cgroup2 in the guest"
  exit 1
fi
v1=$(awk 'NR > 1 && $2 != 0 { printf " %s", $1 }' /proc/cgroups)
if [ -n "$v1" ]; then
  echo "FAIL: controllers on cgroup v1 hierarchies in the guest:$v1"
  exit 1
fi
echo "container-check: $(uname -r) up $(cut -d' ' -f1 /proc/uptime) s, cgroup2 only ($(cat /sys/fs/cgroup/cgroup.controllers))"

# The image as the host built it (container-image.sh, KPLEG_VMTEST_PREPARE): `up` finds it
# current and only imports it.
mkdir -p "$KPLEG_TESTBED_DIR"
if [ -f "$build/vmtests/testbed-image/image.tar" ]; then
  cp -a "$build/vmtests/testbed-image" "$KPLEG_TESTBED_DIR/image"
fi

# The test bed first, on its own, to see what its start costs here.
t0=$(cut -d' ' -f1 /proc/uptime)
if ! endpoint=$(bash "$repo/scripts/testbed.sh" up); then
  echo "FAIL: the test bed did not come up in the guest"
  exit 1
fi
echo "container-check: test bed up in $(awk -v a="$t0" '{ printf "%.1f", $1 - a }' /proc/uptime) s ($endpoint)"

tests=Modes/LifecycleTest.ExitZeroAndExitThree/ebpf
tests=$tests:Modes/LifecycleTest.OomKilledThroughItsMemoryLimit/ebpf
tests=$tests:Modes/LifecycleTest.StopAndRemoveAContainerThenThePod/ebpf
t0=$(cut -d' ' -f1 /proc/uptime)
"$build/tests/e2e_lifecycle_test" --gtest_filter="$tests" --gtest_brief=1
rc=$?
echo "container-check: the lifecycle tests took $(awk -v a="$t0" '{ printf "%.1f", $1 - a }' /proc/uptime) s"
if [ "$rc" -eq 0 ]; then
  echo "container-check: $(uname -r): PASS"
else
  echo "container-check: $(uname -r): FAIL (e2e_lifecycle_test exited $rc)"
fi
exit "$rc"
