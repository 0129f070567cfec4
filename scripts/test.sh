#!/usr/bin/env bash
# kpleg's tests on this machine, in two sizes (README.md):
#
#   scripts/test.sh         before every push (14 min measured on a fresh machine, README.md):
#                           installs the Debian packages, builds (one build directory, clang, the
#                           fuzz targets included, the benchmarks left out), runs the unit, bpf,
#                           cri, e2e and deploy tests against containerd 1.6 but the long ones
#                           listed in LONG below, one VM kernel, and a short fuzz of every target.
#   scripts/test.sh --all   the whole matrix (CI; 45 min measured with the tools and kernels
#                           cached, about 10 more on a fresh machine):
#                           every test against containerd 1.6 (kubelet, critest, the quick bench,
#                           the restart storm, every VM kernel, a container in the VM on two of
#                           them, the arm64 kernel last), then on containerd 2.x and on
#                           CRI-O what differs there (RUNTIME_TESTS below), and every fuzz target
#                           for 15 s. The tools it needs from the registries (the kubelet,
#                           containerd 2.x, CRI-O, virtiofsd) and the arm64 kplegd
#                           (scripts/cross-arm64.sh) build in the background, at the lowest CPU
#                           priority, while the project builds and the first tests run.
#
# Both print at the end a table of their phases with their times, and CTest's ten slowest tests.
# Tests that need root, BPF or containerd skip with a reason when run unprivileged; with
# KPLEG_REQUIRE_PRIVILEGED=1 (as in CI) such a skip is a failure.
#
#   KPLEG_BUILD_DIR        build directory (default <repo>/build)
#   CTEST_ARGS             run these ctest arguments instead of the selection (e.g. "-L unit");
#                          no other runtime's pass then
#   FUZZ_SECONDS           fuzzing time per target (default 15; 0 skips fuzzing)
#   KPLEG_TEST_RUNTIMES    the runtimes of the passes after containerd 1.6's (default: none, and
#                          "containerd-2 crio" with --all)
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
all=0
for arg in "$@"; do
  case $arg in
    --all) all=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "scripts/test.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KPLEG_BUILD_DIR:-$repo/build}
cd "$repo"
mkdir -p "$build/Testing"
ctest_log=$build/Testing/ctest-output.log
: >"$ctest_log"
status=0
run_start=$SECONDS

# The phase table: "name|seconds|result" rows, printed at the end.
phases=()
# phase NAME COMMAND...: runs COMMAND and records its time; returns its status.
phase() {
  local name=$1 t0=$SECONDS rc=0
  shift
  echo "==== $name ====" >&2
  "$@" || rc=$?
  phases+=("$name|$((SECONDS - t0))|$([ "$rc" = 0 ] && echo ok || echo "FAILED ($rc)")")
  return "$rc"
}
# need NAME SCRIPT [ARGS]: a tool from the registries (pinned, cached); puts its bin dir on PATH.
# Without it the tests that need it skip (and fail under KPLEG_REQUIRE_PRIVILEGED=1).
need() {
  local name=$1 dir
  shift
  if dir=$(bash "$@"); then
    export PATH=$dir:$PATH
  else
    echo "$name could not be built or installed (see above): the tests that need it skip" >&2
    if [ "${KPLEG_REQUIRE_PRIVILEGED:-0}" = 1 ]; then
      echo "FAIL: no $name (KPLEG_REQUIRE_PRIVILEGED=1)" | tee -a "$ctest_log"
      return 1
    fi
  fi
}
# run_ctest NAME CTEST_ARGS...: one pass of CTest, its output appended to $ctest_log. One test
# at a time but in the unit pass: the cri/e2e tests share one test bed, and one kills and
# restarts it; the unit tests need none (and take a minute instead of two, two at a time).
run_ctest() {
  local name=$1
  shift
  echo "==== ctest $name: $* ====" >>"$ctest_log"
  (cd "$build" && ctest --output-on-failure --no-tests=error "$@") 2>&1 | tee -a "$ctest_log"
}

# Tests left out of the default run, each run by --all (the README says how long each takes):
# the kubelet suite (its own built kubelet, critest directly and through kplegd), the quick bench,
# the restart storm and the README's demo, and the VM kernels but the newest generic one.
LONG='^(kubelet\.|cri\.critest$|CriEndpoint|bench_|RestartStormTest\.|SoakTest\.|ApiE2eTest\.ReadmeMainCommand|vmtest\.(qemu\.|container\.|5\.10-|6\.1-|7\.3-|.*-cloud))'
# In --all, the tests that need a tool built in the background (the kubelet, virtiofsd) run after
# the other runtimes' passes, each runtime's once its build is done.
KUBELET_TESTS='^kubelet\.e2e$'
CLOUD_VMS='^vmtest\..*-cloud$'
# The arm64 kernel's test runs after the arm64 kplegd is cross-built in the background.
ARM64_VMS='^vmtest\..*-arm64$'
# What the passes on other runtimes run (-R), because it differs there:
# - containerd-2: its event stream confirms transitions instead of the status calls (lifecycle in
#   both modes, the differential test, the event stream's own tests, the restart storm, a
#   container created before kplegd and started after, a removal before the death was confirmed,
#   the removal sweep of long-exited containers, a death the runtime records late); its cgroup
#   paths and restart (FaultsTest.Containerd..., an exited container reloaded after a restart,
#   cgroup resolution, the CRI client);
#   kplegd's CRI endpoint and the kubelet on it (the kubelet's own hint); critest directly and
#   through kplegd; the quick bench's CRI-calls bound (0 on 2.x).
# - crio: the lifecycle tests in both modes (but the OCI-hook one: the test bed has no
#   runc-hooked handler on CRI-O), the differential test, the runtime event stream's tests, the
#   removal hint on an idle daemon, kplegd's CRI endpoint, the kubelet on it, crictl's and
#   kpleg-load's churn. The other cri/e2e/kubelet tests read containerd's cgroup paths, shim
#   files or state, or need the test bed's CNI (docs/testbed.md).
declare -A RUNTIME_TESTS=(
  [containerd-2]='^(Modes/LifecycleTest\.|DifferentialTest\.|ApiE2eTest\.(TheRuntimesEventStream|AQuietRuntimesEventStream|ExitedContainersCost)|RestartStormTest\.|StartUpTest\.|ProxiedTestBedTest\.|LongExitedTest\.|FaultsTest\.(Containerd|ADeathTheRuntimeRecordsLate|AnExitedContainerReloaded)|CgroupResolution\.|GrpcCriClientTestBed\.|CriEndpoint|kubelet\.|cri\.critest$|Crictl\.|KpLegLoad\.Churn|bench_quick$)'
  [crio]='^(Modes/LifecycleTest\.|DifferentialTest\.|ApiE2eTest\.(TheRuntimesEventStream|AQuietRuntimesEventStream|ExitedContainersCost)|CriEndpointTest\.|kubelet\.e2e$|Crictl\.|KpLegLoad\.Churn)'
)
declare -A RUNTIME_EXCLUDE=([containerd-2]='^$' [crio]='OciHooks')
# Which cgroup controllers are on a v1 hierarchy (and which on cgroup2): the run must leave the
# host as it found it (the CRI-O test bed mounts hugetlb for a while; see docs/testbed.md).
cgroup_layout() { awk '!/^#/ { print $1, ($2 == 0 ? "cgroup2" : "v1") }' /proc/cgroups; }
layout_before=$(cgroup_layout)

other_runtimes=
if [ -z "${CTEST_ARGS:-}" ]; then
  default_runtimes=
  [ "$all" = 0 ] || default_runtimes="containerd-2 crio"
  other_runtimes=${KPLEG_TEST_RUNTIMES-$default_runtimes}
fi
for rt in $other_runtimes; do
  [ -n "${RUNTIME_TESTS[$rt]:-}" ] || { echo "scripts/test.sh: no test selection for runtime '$rt'" >&2; exit 2; }
done

# --all: the tools from the registries that only later tests need build in the background, at
# the lowest CPU priority, one after another in the order the passes need them; each writes
# "name|seconds|result" to $tools_dir/NAME.done when it ends.
tools_dir=$build/Testing/tools
bg_pid=
if [ "$all" = 1 ] && [ -z "${CTEST_ARGS:-}" ]; then
  rm -rf "$tools_dir"
  mkdir -p "$tools_dir"
  (
    bg_tool() { # NAME SCRIPT [ARGS]
      local name=$1 t0=$SECONDS r=ok
      shift
      nice -n 19 bash "$@" >"$tools_dir/$name.out" 2>"$tools_dir/$name.log" || r=FAILED
      echo "$name|$((SECONDS - t0))|$r" >"$tools_dir/$name.done"
    }
    for rt in $other_runtimes; do bg_tool "$rt" scripts/runtimes.sh build "$rt"; done
    bg_tool kubelet scripts/kubelet.sh
    bg_tool virtiofsd scripts/virtiofsd.sh
    bg_tool arm64 scripts/cross-arm64.sh "$build"
  ) &
  bg_pid=$!
fi
# wait_tool NAME: waits for NAME's background build; the wait and the build time go to the phase
# table. Fails when the build failed (its log is printed).
wait_tool() {
  local name=$1 t0=$SECONDS
  while [ ! -f "$tools_dir/$name.done" ]; do
    kill -0 "$bg_pid" 2>/dev/null || [ -f "$tools_dir/$name.done" ] ||
      { echo "FAIL: the background build of $name ended without a result" | tee -a "$ctest_log"; return 1; }
    sleep 2
  done
  phases+=("wait for $name|$((SECONDS - t0))|" "  $name, built in the background|$(cut -d'|' -f2- <"$tools_dir/$name.done")")
  grep -q '|ok$' "$tools_dir/$name.done" && return 0
  tail -n 30 "$tools_dir/$name.log"
  if [ "${KPLEG_REQUIRE_PRIVILEGED:-0}" = 1 ]; then
    echo "FAIL: cannot build $name (KPLEG_REQUIRE_PRIVILEGED=1)" | tee -a "$ctest_log"
  else
    echo "skipped: cannot build $name (see above): the tests that need it skip" | tee -a "$ctest_log"
  fi
  return 1
}
# on_runtime RUNTIME NAME CTEST_ARGS...: a pass on RUNTIME's test bed (the shared bed of the
# runtime before goes down first).
current_bed=${KPLEG_TESTBED_RUNTIME:-containerd-1.6}
on_runtime() {
  local rt=$1 name=$2 rc=0 saved=${KPLEG_TESTBED_RUNTIME-}
  shift 2
  if [ "$rt" != "$current_bed" ]; then
    bash scripts/testbed.sh down >/dev/null 2>&1 || true
    current_bed=$rt
  fi
  export KPLEG_TESTBED_RUNTIME=$rt
  phase "$name" run_ctest "$rt" "$@" || rc=$?
  if [ -n "$saved" ]; then export KPLEG_TESTBED_RUNTIME=$saved; else unset KPLEG_TESTBED_RUNTIME; fi
  return $rc
}

phase install-deps bash scripts/install-deps.sh || exit 1

# crictl and critest (the test bed makes its own CRI calls with crictl; cri.critest and the
# kubelet suite run critest) and virtme-ng (the VM tests boot their kernels with it).
phase crictl need crictl scripts/crictl.sh || status=1
phase virtme-ng need virtme-ng scripts/vng.sh || status=1

# Line tables only, not full debug info: stack traces and perf's symbols keep their lines, and
# the compiler's time drops by about a seventh (857 s against 986 s for the same 339 targets;
# api_server_test.cc alone 15.6 s against 19.3 s with -g).
phase build bash -c "cmake -S . -B '$build' -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO='-O2 -gline-tables-only -DNDEBUG' \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DKPLEG_FUZZ=ON \
    -DKPLEG_BENCH=$([ "$all" = 1 ] || [ -n "${CTEST_ARGS:-}" ] && echo ON || echo OFF) >/dev/null &&
  cmake --build '$build' -j '$(nproc)'" || exit 1

if [ -n "${CTEST_ARGS:-}" ]; then
  # shellcheck disable=SC2086
  phase "tests: ctest $CTEST_ARGS" run_ctest custom $CTEST_ARGS || status=1
elif [ "$all" = 0 ]; then
  phase "tests: unit" run_ctest unit -L '^unit$' -j "$(nproc)" || status=1
  phase "tests: containerd 1.6" run_ctest containerd-1.6 -LE '^unit$' -E "$LONG" || status=1
  for rt in $other_runtimes; do
    bash scripts/runtimes.sh build "$rt" >/dev/null || { echo "FAIL: cannot build $rt" | tee -a "$ctest_log"; status=1; continue; }
    on_runtime "$rt" "tests: $rt" -R "${RUNTIME_TESTS[$rt]}" -E "${RUNTIME_EXCLUDE[$rt]}|$LONG" || status=1
  done
else
  phase "tests: unit" run_ctest unit -L '^unit$' -j "$(nproc)" || status=1
  phase "tests: containerd 1.6" run_ctest containerd-1.6 -LE '^unit$' \
    -E "$KUBELET_TESTS|$CLOUD_VMS|$ARM64_VMS" || status=1
  for rt in $other_runtimes; do
    wait_tool "$rt" || { status=1; continue; }
    on_runtime "$rt" "tests: $rt" -R "${RUNTIME_TESTS[$rt]}" -E "${RUNTIME_EXCLUDE[$rt]}|$KUBELET_TESTS" ||
      status=1
  done
  # The kubelet on each runtime, the last one's bed first.
  if wait_tool kubelet && need kubelet scripts/kubelet.sh; then
    for rt in $(printf '%s\n' $other_runtimes | tac) containerd-1.6; do
      # A runtime that could not be built has failed the run already.
      [ "$rt" = containerd-1.6 ] || grep -qs '|ok$' "$tools_dir/$rt.done" || continue
      # The relay run (kpleg-cri-relay) on the two containerd versions only: it forwards
      # CRI-O's calls the same way, so CRI-O saves the half minute.
      if [ "$rt" = crio ]; then
        KPLEG_KUBELET_PHASES="kpleg runtime direct" on_runtime "$rt" "tests: $rt, the kubelet" \
          -R "$KUBELET_TESTS" || status=1
      else
        on_runtime "$rt" "tests: $rt, the kubelet" -R "$KUBELET_TESTS" || status=1
      fi
    done
  else
    status=1
  fi
  if wait_tool virtiofsd && need virtiofsd scripts/virtiofsd.sh; then
    phase "tests: cloud kernels" run_ctest vm -R "$CLOUD_VMS" || status=1
  else
    status=1
  fi
  if wait_tool arm64; then
    phase "tests: arm64 kernel" run_ctest vm-arm64 -R "$ARM64_VMS" || status=1
  else
    status=1
  fi
fi

fuzz_seconds=${FUZZ_SECONDS:-15}
if [ "$fuzz_seconds" != 0 ]; then
  FUZZ_SECONDS=$fuzz_seconds FUZZ_BUILD_DIR=$build phase "fuzz: 6 targets x ${fuzz_seconds}s" \
    bash scripts/fuzz.sh || status=1
fi

bash scripts/testbed.sh down >/dev/null 2>&1 || true
if [ "$(cgroup_layout)" != "$layout_before" ]; then
  echo "FAIL: the run changed which cgroup controllers are on v1 hierarchies:" | tee -a "$ctest_log"
  diff <(echo "$layout_before") <(cgroup_layout) | tee -a "$ctest_log"
  status=1
fi

# The phases, and CTest's ten slowest tests of the whole run.
{
  echo
  echo "==== phases ($([ "$all" = 1 ] && echo "--all" || echo default)) ===="
  for row in "${phases[@]}"; do
    # The name may hold a '|' (a CTEST_ARGS regex): the time and the result are the last two.
    r=${row##*|} && n=${row%|*} && s=${n##*|} && n=${n%|*}
    printf '  %-52s %6d s  %s\n' "$n" "$s" "$r"
  done
  printf '  %-52s %6d s  %s\n' "total" "$((SECONDS - run_start))" "$([ "$status" = 0 ] && echo ok || echo FAILED)"
  echo "==== the ten slowest tests ===="
  awk '/^==== ctest / { pass = $3; sub(/:$/, "", pass) }
       / Test +#[0-9]+: / { for (i = 1; i < NF; i++) if ($(i + 1) == "sec") printf "%10.1f s  %s (%s)\n", $i, $4, pass }' \
    "$ctest_log" | sort -rn | awk "NR <= 10"
} | tee -a "$ctest_log"

# A failed test's output (assertions, then kplegd's log) scrolls far up a long run: repeat its
# assertion messages last.
if [ "$status" != 0 ] && grep -Eq ': Failure$|^FAIL: ' "$ctest_log"; then
  echo
  echo "==== failed assertions (the whole output: $ctest_log) ===="
  awk '/: Failure$|^FAIL: / {n = 10} n > 0 {print; n--; if (++shown >= 120) exit}' "$ctest_log"
fi
exit $status
