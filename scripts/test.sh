#!/usr/bin/env bash
# Runs every kpleg test on this machine: installs the build and test dependencies (Debian
# packages), builds, runs the CTest suite (unit, bpf, cri, e2e, kubelet, deploy, bench, vmtest
# labels) against containerd 1.6, the cri, e2e, kubelet and bench labels again against containerd
# 2.x (built from the Go module proxy), the lifecycle, differential and event-stream tests against
# CRI-O (built the same way), fuzzes the cgroup path parser, the runtime event decoder, the kernel event
# decoder with the cgroup index and the consumer API's request handlers (scripts/fuzz.sh) for a
# bounded time each, and takes the local test bed
# down afterwards.
#
# Tests that need root, BPF or containerd skip with a reason when run unprivileged; with
# KPLEG_REQUIRE_PRIVILEGED=1 (as in CI) such a skip is a failure.
#
#   KPLEG_BUILD_DIR   build directory (default <repo>/build)
#   CTEST_ARGS        extra ctest arguments (e.g. "-L unit")
#   FUZZ_SECONDS      fuzzing time per target (default 60; 0 skips fuzzing)
#   KPLEG_TESTBED_RUNTIME  runtime of the test bed for the whole suite: containerd-1.6
#                     (default) or containerd-2 (see docs/testbed.md)
#   KPLEG_TEST_RUNTIMES    runtimes the tests run against once more after the whole suite
#                     (default "containerd-2 crio"; empty for none; see below for what each runs)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KPLEG_BUILD_DIR:-$repo/build}
cd "$repo"

bash scripts/install-deps.sh
# virtme-ng from PyPI (pinned, cached outside the tree): the VM tests boot their kernels with it.
if vng_bin=$(bash scripts/vng.sh); then
  export PATH=$vng_bin:$PATH
elif [ "${KPLEG_REQUIRE_PRIVILEGED:-0}" = 1 ]; then
  echo "FAIL: cannot install virtme-ng (KPLEG_REQUIRE_PRIVILEGED=1)"
  exit 1
else
  echo "virtme-ng could not be installed: the VM tests use the plain qemu runner"
fi
# crictl and critest (cri-tools) from the Go module proxy (pinned by tools/crictl, cached): the test
# bed makes its own CRI calls with crictl (scripts/testbed.sh builds it the same way if needed), the
# CRI tests use it as users do, and cri.critest runs critest (tests/cri/critest.sh). Without them
# the test bed cannot come up and the tests that need it skip (and fail in CI).
if crictl_bin=$(bash scripts/crictl.sh); then
  export PATH=$crictl_bin:$PATH
else
  echo "crictl and critest could not be built (see above)"
fi
# The kubelet from the Go module proxy (pinned by tools/kubelet, cached; about 5 min the first
# time): kubelet.e2e runs it against kplegd's CRI endpoint. Without it that test skips (and fails
# in CI).
if kubelet_bin=$(bash scripts/kubelet.sh); then
  export PATH=$kubelet_bin:$PATH
else
  echo "the kubelet could not be built (see above)"
fi
# virtiofsd from the Rust crate registry (pinned, cached): vng boots the cloud kernels, which have no 9p, with it.
if vfsd_bin=$(bash scripts/virtiofsd.sh); then
  export PATH=$vfsd_bin:$PATH
else
  echo "virtiofsd could not be built: the VM tests of cloud kernels skip (and fail in CI)"
fi
# Which cgroup controllers are on a v1 hierarchy (and which on cgroup2): the run must leave the
# host as it found it (the CRI-O test bed mounts hugetlb for a while; see docs/testbed.md).
cgroup_layout() { awk '!/^#/ { print $1, ($2 == 0 ? "cgroup2" : "v1") }' /proc/cgroups; }
layout_before=$(cgroup_layout)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j "$(nproc)"

status=0
# The cri/e2e tests share one containerd test bed (one kills and restarts it), so tests run
# one at a time. The whole output is kept in $build/Testing/ctest-output.log.
ctest_log=$build/Testing/ctest-output.log
mkdir -p "$build/Testing"
(cd "$build" && ctest --output-on-failure --no-tests=error ${CTEST_ARGS:-}) 2>&1 | tee "$ctest_log" ||
  status=$?

# Tests again on each other runtime the test bed can run (KPLEG_TEST_RUNTIMES, default
# "containerd-2 crio"; empty for none), when the whole suite ran (no CTEST_ARGS):
# - containerd-2: the cri, e2e and kubelet suites and the quick benchmark (with its CRI-calls
#   bound).
# - crio: the lifecycle tests in both modes (but the OCI-hook one: the test bed has no
#   runc-hooked handler on CRI-O), the differential test, the runtime event stream's tests, the
#   removal hint on an idle daemon,
#   kplegd's CRI endpoint, a kubelet fed by kplegd (kubelet.e2e), crictl's and kpleg-load's
#   churn; about 12 min. The other cri/e2e/kubelet tests read
#   containerd's cgroup paths, shim files or state, or need the test bed's CNI (docs/testbed.md).
# The runtimes are built from the Go module proxy into a cache outside the tree the first time
# (about 2 min each; scripts/runtimes.sh). A runtime that cannot be built is a skip, and a
# failure when KPLEG_REQUIRE_PRIVILEGED=1.
if [ -z "${CTEST_ARGS:-}" ]; then
  for rt in ${KPLEG_TEST_RUNTIMES-containerd-2 crio}; do
    case $rt in
      crio)
        select=(-L 'cri|e2e|kubelet' -E 'OciHooks'
                -R '^(Modes/LifecycleTest\.|DifferentialTest\.|ApiE2eTest\.(TheRuntimesEventStream|AQuietRuntimesEventStream|ExitedContainersCost)|CriEndpointTest\.|kubelet\.e2e$|Crictl\.|KpLegLoad\.Churn)') ;;
      *) select=(-L 'cri|e2e|kubelet|bench') ;;
    esac
    bash scripts/testbed.sh down >/dev/null 2>&1 || true
    echo "==== tests against $rt: ${select[*]} ====" | tee -a "$ctest_log"
    if ! bash scripts/runtimes.sh build "$rt" >/dev/null; then
      if [ "${KPLEG_REQUIRE_PRIVILEGED:-0}" = 1 ]; then
        echo "FAIL: cannot build $rt (KPLEG_REQUIRE_PRIVILEGED=1)" | tee -a "$ctest_log"
        status=1
      else
        echo "skipped: cannot build $rt (see above)" | tee -a "$ctest_log"
      fi
      continue
    fi
    (cd "$build" && KPLEG_TESTBED_RUNTIME=$rt ctest --output-on-failure --no-tests=error "${select[@]}") 2>&1 |
      tee -a "$ctest_log" || status=1
  done
fi

if [ "${FUZZ_SECONDS:-60}" != 0 ]; then
  FUZZ_SECONDS=${FUZZ_SECONDS:-60} bash scripts/fuzz.sh || status=1
fi

bash scripts/testbed.sh down || true
if [ "$(cgroup_layout)" != "$layout_before" ]; then
  echo "FAIL: the run changed which cgroup controllers are on v1 hierarchies:" | tee -a "$ctest_log"
  diff <(echo "$layout_before") <(cgroup_layout) | tee -a "$ctest_log"
  status=1
fi

# A failed test's output (assertions, then kplegd's log) scrolls far up a long run: repeat its
# assertion messages last.
if [ "$status" != 0 ] && grep -Eq ': Failure$|^FAIL: ' "$ctest_log"; then
  echo
  echo "==== failed assertions (the whole output: $ctest_log) ===="
  awk '/: Failure$|^FAIL: / {n = 10} n > 0 {print; n--; if (++shown >= 120) exit}' "$ctest_log"
fi
exit $status
