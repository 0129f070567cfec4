#!/usr/bin/env bash
# Runs every kpleg test on this machine: installs the build and test dependencies (Debian
# packages), builds, runs the CTest suite (unit, bpf, cri, e2e, deploy, bench, vmtest labels), fuzzes the
# cgroup path parser for a bounded time, and takes the local test bed down afterwards.
#
# Tests that need root, BPF or containerd skip with a reason when run unprivileged; with
# KPLEG_REQUIRE_PRIVILEGED=1 (as in CI) such a skip is a failure.
#
#   KPLEG_BUILD_DIR   build directory (default <repo>/build)
#   CTEST_ARGS        extra ctest arguments (e.g. "-L unit")
#   FUZZ_SECONDS      fuzzing time (default 60; 0 skips fuzzing)
#   KPLEG_TESTBED_RUNTIME  runtime of the cri/e2e test bed: containerd-1.6 (default) or
#                     containerd-2 (see docs/testbed.md)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KPLEG_BUILD_DIR:-$repo/build}
cd "$repo"

bash scripts/install-deps.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j "$(nproc)"

status=0
# The cri/e2e tests share one containerd test bed (one kills and restarts it), so tests run
# one at a time. The whole output is kept in $build/Testing/ctest-output.log.
ctest_log=$build/Testing/ctest-output.log
mkdir -p "$build/Testing"
(cd "$build" && ctest --output-on-failure --no-tests=error ${CTEST_ARGS:-}) 2>&1 | tee "$ctest_log" ||
  status=$?

if [ "${FUZZ_SECONDS:-60}" != 0 ]; then
  FUZZ_SECONDS=${FUZZ_SECONDS:-60} bash scripts/fuzz.sh || status=1
fi

bash scripts/testbed.sh down || true

# A failed test's output (assertions, then kplegd's log) scrolls far up a long run: repeat its
# assertion messages last.
if [ "$status" != 0 ] && grep -Eq ': Failure$|^FAIL: ' "$ctest_log"; then
  echo
  echo "==== failed assertions (the whole output: $ctest_log) ===="
  awk '/: Failure$|^FAIL: / {n = 10} n > 0 {print; n--; if (++shown >= 120) exit}' "$ctest_log"
fi
exit $status
