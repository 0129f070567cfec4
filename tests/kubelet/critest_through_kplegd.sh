#!/usr/bin/env bash
# CTest kubelet.critest_through_kplegd: cri-tools' CRI validation suite through kplegd's CRI
# endpoint (kplegd --cri-listen, forwarding to the runtime) and directly against the runtime, with
# the same spec selection (tests/cri/critest.sh): the same specs must pass both ways, so a kubelet
# pointed at kplegd sees the runtime it would see directly. Runs on a test bed of its own with a
# pod network (critest's pods need one), on the runtime $KPLEG_TESTBED_RUNTIME names, taken down
# afterwards. About a minute a suite.
#
#   critest_through_kplegd.sh BIN_DIR [DIRECT_REPORT_DIR]
#
# KPLEG_CRITEST_VIA=relay puts kpleg-cri-relay (fed by kplegd's API) in front of the runtime
# instead of kplegd --cri-listen.
#
# BIN_DIR is the build's bin directory (kplegd). With DIRECT_REPORT_DIR, the direct suite is not
# run again: its report is the one cri.critest wrote there on the same runtime (CTest runs that
# test first, as this test's fixture).
#
# Exit status: 0 pass, 1 fail, 77 cannot run here (not root, no critest, no test bed);
# KPLEG_REQUIRE_PRIVILEGED=1 makes 77 a failure.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin=${1:?usage: critest_through_kplegd.sh BIN_DIR [DIRECT_REPORT_DIR]}
direct_report=${2:-}

fail() { echo "FAIL: $*"; exit 1; }
skip() {
  [ "${KPLEG_REQUIRE_PRIVILEGED:-0}" = 1 ] && fail "$* (KPLEG_REQUIRE_PRIVILEGED=1 forbids skipping)"
  echo "SKIP: $*"
  exit 77
}

[ "$(id -u)" = 0 ] || skip "needs root: a containerd test bed with a pod network, and kplegd"
[ -x "$bin/kplegd" ] || fail "no kplegd in $bin"
if ! command -v critest >/dev/null || ! command -v crictl >/dev/null; then
  tools=$(bash "$repo/scripts/crictl.sh") ||
    skip "critest could not be built (scripts/crictl.sh needs Go and the Go module proxy, once)"
  export PATH=$tools:$PATH
fi
# Two suites must end before CTest's limit (600 s), so that the bed is still taken down.
export KPLEG_CRITEST_TIMEOUT=${KPLEG_CRITEST_TIMEOUT:-4m}

tb=$(mktemp -d /tmp/kpleg-critest-kd.XXXXXX)
export KPLEG_TESTBED_DIR=$tb
export KPLEG_TESTBED_BRIDGE=${KPLEG_CRITEST_BRIDGE:-kpleg-ck0}
export KPLEG_TESTBED_SUBNET=${KPLEG_CRITEST_SUBNET:-10.91.0.0/16}
kplegd_pid=""
cleanup() {
  if [ -n "${relay_pid:-}" ] && kill -0 "$relay_pid" 2>/dev/null; then
    kill -TERM "$relay_pid"
    wait "$relay_pid" || true
  fi
  if [ -n "$kplegd_pid" ] && kill -0 "$kplegd_pid" 2>/dev/null; then
    kill -TERM "$kplegd_pid"
    wait "$kplegd_pid" || true
  fi
  if bash "$repo/scripts/testbed.sh" down; then
    rm -rf "$tb"
  else
    echo "warning: 'KPLEG_TESTBED_DIR=$tb scripts/testbed.sh down' failed; $tb kept"
  fi
}
trap cleanup EXIT
up=$(bash "$repo/scripts/testbed.sh" up --cni) ||
  skip "the test bed did not come up (scripts/testbed.sh up --cni in $tb; see above)"
runtime=${up#KPLEG_RUNTIME_ENDPOINT=}

via=${KPLEG_CRITEST_VIA:-kplegd}
relay_pid=""
if [ "$via" = relay ]; then
  "$bin/kplegd" --runtime-endpoint "$runtime" \
    --socket "$tb/kpleg.sock" --metrics-address 127.0.0.1:0 >"$tb/kplegd.out" 2>"$tb/kplegd.log" &
  kplegd_pid=$!
  "$bin/kpleg-cri-relay" --listen "$tb/kplegd-cri.sock" --runtime-endpoint "$runtime" \
    --kplegd-socket "$tb/kpleg.sock" 2>"$tb/relay.log" &
  relay_pid=$!
else
  "$bin/kplegd" --runtime-endpoint "$runtime" --cri-listen "$tb/kplegd-cri.sock" \
    --socket "$tb/kpleg.sock" --metrics-address 127.0.0.1:0 >"$tb/kplegd.out" 2>"$tb/kplegd.log" &
  kplegd_pid=$!
fi
for _ in $(seq 1 100); do
  grep -q "kplegd ready" "$tb/kplegd.log" && break
  kill -0 "$kplegd_pid" 2>/dev/null || { cat "$tb/kplegd.log"; fail "kplegd exited at start"; }
  sleep 0.2
done
grep -q "kplegd ready" "$tb/kplegd.log" || { cat "$tb/kplegd.log"; fail "kplegd not ready in 20 s"; }
port=$(sed -n 's/.*metrics: serving .* on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tb/kplegd.log" | head -n1)

# passed SPECS of a ginkgo JSON report, one per line, sorted.
passed() {
  jq -r '.[0].SpecReports[] | select(.LeafNodeType == "It" and .State == "passed") |
    (.ContainerHierarchyTexts + [.LeafNodeText]) | join(" ")' "$1" | sort
}

status=0
mkdir -p "$tb/direct" "$tb/through"
if [ -n "$direct_report" ]; then
  [ -s "$direct_report/critest.json" ] || fail "no direct critest report in $direct_report (cri.critest's)"
  cp "$direct_report/critest.json" "$tb/direct/critest.json"
  echo "==== critest against the runtime: cri.critest's report ($direct_report) ===="
else
  echo "==== critest against the runtime ($runtime) ===="
  "$here/../cri/critest.sh" --report-dir "$tb/direct" "$runtime" || status=1
fi
echo "==== critest through kplegd ($tb/kplegd-cri.sock) ===="
"$here/../cri/critest.sh" --report-dir "$tb/through" "unix://$tb/kplegd-cri.sock" || status=1

[ -s "$tb/direct/critest.json" ] && [ -s "$tb/through/critest.json" ] || fail "a critest run wrote no report"
passed "$tb/direct/critest.json" >"$tb/direct.passed"
passed "$tb/through/critest.json" >"$tb/through.passed"
n_direct=$(wc -l <"$tb/direct.passed")
n_through=$(wc -l <"$tb/through.passed")
echo "passed: $n_direct directly, $n_through through kplegd"
if ! diff -u "$tb/direct.passed" "$tb/through.passed"; then
  echo "FAIL: the specs that pass differ (- directly, + through kplegd)"
  status=1
fi
[ "$n_direct" -gt 0 ] || { echo "FAIL: nothing passed"; status=1; }

# kplegd forwarded the suite's calls, and is still healthy after it.
if [ "$via" = relay ]; then
  kill -TERM "$relay_pid"
  wait "$relay_pid" || { echo "FAIL: the relay did not stop cleanly"; status=1; }
  relay_pid=""
  forwarded=$(sed -n 's/.*stopped after .* ms; \([0-9]*\) calls forwarded.*/\1/p' "$tb/relay.log")
  echo "calls forwarded through the relay: ${forwarded:-none}"
  [ "${forwarded:-0}" -gt 100 ] || { echo "FAIL: only ${forwarded:-0} calls went through the relay"; status=1; }
elif [ -n "$port" ]; then
  forwarded=$(curl -sf "http://127.0.0.1:$port/metrics" |
    awk '$1 ~ /^kpleg_cri_endpoint_calls_total\{/ { n += $2 } END { print n + 0 }')
  echo "calls forwarded through kplegd's endpoint: $forwarded"
  [ "$forwarded" -gt 100 ] || { echo "FAIL: only $forwarded calls went through kplegd"; status=1; }
  curl -sf "http://127.0.0.1:$port/healthz" >/dev/null || { echo "FAIL: kplegd unhealthy after the suite"; status=1; }
fi
kill -0 "$kplegd_pid" 2>/dev/null || { echo "FAIL: kplegd died during the suite"; status=1; }
if [ "$status" != 0 ]; then
  echo "---- kplegd log (last 40 lines) ----"
  tail -n 40 "$tb/kplegd.log"
fi
exit $status
