#!/usr/bin/env bash
# CTest cri.critest: cri-tools' CRI validation suite, with the spec selection of
# tests/cri/critest.sh, against a test bed of its own (scripts/testbed.sh up --cni, the runtime
# $KPLEG_TESTBED_RUNTIME names), or against $KPLEG_RUNTIME_ENDPOINT when set (as the other cri
# tests). Its own bed, because almost every critest spec runs its pods in a pod network and the
# shared test bed has none (and cannot gain one while up); it uses its own directory, bridge and
# subnet, like scripts/testbed/selftest.sh, and is taken down afterwards.
#
#   critest_test.sh [REPORT_DIR]     ginkgo's JSON and JUnit reports go to REPORT_DIR
#
# Exit status: 0 pass, 1 fail, 77 cannot run here (not root, no critest, no test bed);
# KPLEG_REQUIRE_PRIVILEGED=1 makes 77 a failure.
#
# Environment: KPLEG_CRITEST_BRIDGE (default kpleg-ct0), KPLEG_CRITEST_SUBNET (default
# 10.90.0.0/16) for its bed's pod network; KPLEG_CRITEST_TIMEOUT (default 5m here).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
report_dir=${1:-}

fail() { echo "FAIL: $*"; exit 1; }
skip() {
  [ "${KPLEG_REQUIRE_PRIVILEGED:-0}" = 1 ] && fail "$* (KPLEG_REQUIRE_PRIVILEGED=1 forbids skipping)"
  echo "SKIP: $*"
  exit 77
}

[ "$(id -u)" = 0 ] || skip "needs root: a containerd test bed with a pod network"
# critest and crictl: on PATH (scripts/test.sh puts scripts/crictl.sh's bin dir there), else
# built now (once; cached).
if ! command -v critest >/dev/null || ! command -v crictl >/dev/null; then
  bin=$(bash "$repo/scripts/crictl.sh") ||
    skip "critest could not be built (scripts/crictl.sh needs Go and the Go module proxy, once)"
  export PATH=$bin:$PATH
fi
# Ends before CTest's limit (600 s), so a hung runtime still gets its bed taken down below.
export KPLEG_CRITEST_TIMEOUT=${KPLEG_CRITEST_TIMEOUT:-5m}
args=()
# A report left by an earlier run (another runtime's) must not stand for this one's.
[ -z "$report_dir" ] || { rm -f "$report_dir/critest.json"; args+=(--report-dir "$report_dir"); }

if [ -n "${KPLEG_RUNTIME_ENDPOINT:-}" ]; then
  exec "$here/critest.sh" "${args[@]}" "$KPLEG_RUNTIME_ENDPOINT"
fi

tb=$(mktemp -d /tmp/kpleg-critest-tb.XXXXXX)
export KPLEG_TESTBED_DIR=$tb
export KPLEG_TESTBED_BRIDGE=${KPLEG_CRITEST_BRIDGE:-kpleg-ct0}
export KPLEG_TESTBED_SUBNET=${KPLEG_CRITEST_SUBNET:-10.90.0.0/16}
cleanup() {
  if bash "$repo/scripts/testbed.sh" down; then
    rm -rf "$tb"
  else
    echo "warning: 'KPLEG_TESTBED_DIR=$tb scripts/testbed.sh down' failed; $tb kept"
  fi
}
trap cleanup EXIT
start=$SECONDS
if ! up=$(bash "$repo/scripts/testbed.sh" up --cni); then
  skip "the test bed did not come up (scripts/testbed.sh up --cni in $tb; see above)"
fi
echo "critest_test.sh: test bed up in $((SECONDS - start)) s: $up"
"$here/critest.sh" "${args[@]}" "${up#KPLEG_RUNTIME_ENDPOINT=}"
