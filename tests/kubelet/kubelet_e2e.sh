#!/usr/bin/env bash
# CTest kubelet.e2e: an unmodified kubelet (scripts/kubelet.sh builds it), standalone (no API
# server, static pods only), with EventedPLEG on, against the test bed's containerd with kplegd
# in between: kubelet -> kplegd --cri-listen -> containerd. Four runs of the kubelet
# (KPLEG_KUBELET_PHASES, default "kpleg runtime direct relay"), each with a fresh kplegd that
# prints every lifecycle event with its kernel timestamp:
#
#   kpleg    the kubelet's runtime endpoint is kplegd --cri-listen --cri-events kpleg: kplegd
#            forwards every call and answers GetContainerEvents itself from its kernel-confirmed
#            events (on containerd 1.6 too, which has no event stream)
#   runtime  the same with --cri-events runtime: GetContainerEvents is forwarded to the runtime
#            like any call (containerd 1.6 answers UNIMPLEMENTED; the kubelet gives up its hint
#            after 5 tries and lives on its 1 s relist)
#   direct   the kubelet talks to containerd itself; kplegd runs beside it only to timestamp the
#            containers' deaths and starts
#   relay    the kubelet talks to kpleg-cri-relay (socket-activated), which forwards to containerd
#            and serves GetContainerEvents from kplegd's API; kplegd is killed and restarted
#            2 x KPLEG_KUBELET_KPLEGD_KILLS times (default 5 + 5) under the crash loop, then the
#            relay itself is restarted once (see run_relay_phase below for what is asserted)
#
# Each run starts a sleeper pod and KPLEG_KUBELET_CRASHERS (default 6) pods whose container runs
# sh -c 'sleep 2; exit 1' with restartPolicy Always, added 0.7 s apart (so their deaths fall at
# different points of the kubelet's 1 s relist). The crash-loop back-off is capped at 2 s
# (KubeletConfiguration crashLoopBackOff.maxContainerRestartPeriod, KubeletCrashLoopBackOffMax,
# beta and on by default in v1.37): a container's first restart has no back-off, every later one
# waits 2 s after the container finished.
#
# Asserted: the sleeper runs (kplegd's event, crictl); every crash pod is restarted by the kubelet;
# kplegd sees the pods of the kubelet's cgroup root (/kpleg-kubelet/kubepods/...) through the
# kernel (events with source "kernel"); in the kpleg run the kubelet's GetContainerEvents stream
# through kplegd stays open (kpleg_cri_endpoint_event_streams 1, the kubelet's
# evented_pleg_connection_error_count 0, no "disabling container-termination fast path", no
# "failed to get container events") and its hint fires ("requested pod relist after container
# termination") for every death that was followed by a restart. The runtime and direct runs must
# behave as the runtime allows: without a runtime event stream the kubelet disables its hint,
# with one it fires.
#
# Measured, printed and written to RESULTS_FILE: from a container's death (kernel_ts_ns of
# kplegd's ContainerDied) to its replacement's start (kernel_ts_ns of the next ContainerStarted of
# the same pod and container name), first restarts (no back-off) and later ones (2 s back-off)
# apart; from the death to the kubelet noticing it (its GenericPLEG log line oldState=running
# newState=exited, --v=4) and to the kubelet receiving kplegd's hint; and the CRI calls per minute
# the kubelet makes through kplegd (kpleg_cri_endpoint_calls_total by method) in the kpleg and
# runtime runs: quiet (the sleeper only, KPLEG_KUBELET_IDLE_WINDOW seconds before the crash pods
# come, default 0: skipped) and with the crash pods (KPLEG_KUBELET_WINDOW seconds from the first
# one, default 20; the direct run measures KPLEG_KUBELET_DIRECT_WINDOW, default 15), and
# kplegd's own calls to the runtime in the same windows (kpleg_cri_calls_total). The defaults
# are what the assertions need (every crash pod restarted twice, first without back-off, then
# after it); docs/kubelet.md's numbers were measured with KPLEG_KUBELET_IDLE_WINDOW=20
# KPLEG_KUBELET_WINDOW=60 KPLEG_KUBELET_DIRECT_WINDOW=30 (about 3.5 minutes). About 1.5 minutes
# in all with the defaults, of which the relay run is about 30 s (95 s measured for all four).
# Each window's CPU of the kubelet, kplegd and (with KPLEG_KUBELET_RUNTIME_CGROUP) the runtime is
# in the report too; KPLEG_KUBELET_ANALYSIS_DIR gets each run's analysis.json (bench/kubelet.sh).
#
#   kubelet_e2e.sh <build bin dir> [RESULTS_FILE]
#
# The test bed: $KPLEG_RUNTIME_ENDPOINT when set, else scripts/testbed.sh up (its runtime from
# KPLEG_TESTBED_RUNTIME, its directory from KPLEG_TESTBED_DIR). While it runs, the kubelet owns
# that runtime: it stops every pod sandbox it did not start, so nothing else may use the test bed
# meanwhile (CTest: RUN_SERIAL).
#
# What the kubelet would change on the host is kept away from it: it runs in a private mount
# namespace in which the kernel settings it insists on (protectKernelDefaults: vm.overcommit_memory
# 1, kernel.panic 10, ...) read as it wants where the host's differ; its root, certificates, pod
# logs and volume plugins are in a temporary directory; its cgroup root is /kpleg-kubelet (created
# in every cgroup v1 hierarchy, removed afterwards); its servers listen on 127.0.0.1 only
# (KPLEG_KUBELET_PORT, default 10350, and healthz on KPLEG_KUBELET_HEALTHZ_PORT, default 10348),
# with no read-only port; it makes no iptables chains. What it creates at fixed paths
# (/var/lib/kubelet/device-plugins/kubelet.sock, the /var/log/containers/*.log links) is removed
# afterwards, with the directories if it created them.
#
# Exit status: 0 pass, 1 fail, 77 cannot run here (not root, no kubelet, no test bed, no BPF);
# KPLEG_REQUIRE_PRIVILEGED=1 makes 77 a failure. The temporary directory (logs, events, metrics)
# is kept when the test fails.
set -euo pipefail

bin=${1:?usage: kubelet_e2e.sh <build bin dir> [RESULTS_FILE]}
results=${2:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
CRASHERS=${KPLEG_KUBELET_CRASHERS:-6}
WINDOW=${KPLEG_KUBELET_WINDOW:-20}
DIRECT_WINDOW=${KPLEG_KUBELET_DIRECT_WINDOW:-15}
IDLE_WINDOW=${KPLEG_KUBELET_IDLE_WINDOW:-0}
KUBELET_PORT=${KPLEG_KUBELET_PORT:-10350}
HEALTHZ_PORT=${KPLEG_KUBELET_HEALTHZ_PORT:-10348}
CGROOT=kpleg-kubelet
PHASES=${KPLEG_KUBELET_PHASES:-kpleg runtime direct relay}
KILLS=${KPLEG_KUBELET_KPLEGD_KILLS:-5}
NODE=kpleg-node
IMAGE=localhost/kpleg/busybox:1
BACKOFF_MAX=2s
started=$SECONDS

fail() {
  echo "FAIL: $*"
  failed=1
  exit 1
}
skip() {
  [ "${KPLEG_REQUIRE_PRIVILEGED:-0}" = 1 ] && fail "$* (KPLEG_REQUIRE_PRIVILEGED=1 forbids skipping)"
  echo "SKIP: $*"
  exit 77
}
log() { echo "kubelet_e2e: $*"; }

[ "$(id -u)" = 0 ] || skip "needs root: the kubelet, kplegd's BPF programs, the test bed"
for tool in unshare curl python3; do
  command -v "$tool" >/dev/null || skip "needs $tool"
done
[ -x "$bin/kplegd" ] && [ -x "$bin/kplegctl" ] || fail "no kplegd or kplegctl in $bin"
# The kubelet: on PATH (scripts/test.sh puts scripts/kubelet.sh's bin dir there), else built now
# (once, several minutes; cached).
if ! command -v kubelet >/dev/null; then
  kbin=$(bash "$repo/scripts/kubelet.sh") ||
    skip "the kubelet could not be built (scripts/kubelet.sh needs Go and the Go module proxy, once)"
  export PATH=$kbin:$PATH
fi
if ! command -v crictl >/dev/null; then
  cbin=$(bash "$repo/scripts/crictl.sh") ||
    skip "crictl could not be built (scripts/crictl.sh needs Go and the Go module proxy, once)"
  export PATH=$cbin:$PATH
fi
KUBELET=$(command -v kubelet)
kubelet_version=$("$KUBELET" --version)
# A kubelet of the host would lose its device plugin socket to ours.
[ ! -e /var/lib/kubelet/device-plugins/kubelet.sock ] ||
  skip "/var/lib/kubelet/device-plugins/kubelet.sock exists: a kubelet runs on this host"

tmp=$(mktemp -d /tmp/kpleg-kubelet.XXXXXX)
chmod 0755 "$tmp"
failed=0
kubelet_pid=
kplegd_pid=
relay_unit_pid=
endpoint=
# What exists before the kubelet runs stays; what it adds goes.
pre_existing=()
for p in /var/lib/kubelet /var/lib/kubelet/device-plugins /var/log/containers; do
  [ -e "$p" ] && pre_existing+=("$p")
done
cgroup_dirs_made=()

existed() {
  local p
  for p in "${pre_existing[@]}"; do [ "$p" = "$1" ] && return 0; done
  return 1
}

stop_pid() { # pid name: SIGTERM, then SIGKILL after 15 s
  local pid=$1 name=$2
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  if ! timeout 15 tail --pid="$pid" -f /dev/null; then
    log "$name (pid $pid) did not stop within 15 s of SIGTERM; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

crictl_() { crictl --config /dev/null --runtime-endpoint "$endpoint" --image-endpoint "$endpoint" --timeout 20s "$@"; }

# The pods of this test (static pods are named <name>-<node>): stopped and removed through the
# runtime once the kubelet is gone (a stopped kubelet leaves its pods running).
remove_pods() {
  [ -n "$endpoint" ] || return 0
  local ids
  ids=$(crictl_ pods -q --name "-$NODE\$" 2>/dev/null) || return 0
  [ -z "$ids" ] || crictl_ rmp -f $ids >/dev/null || log "warning: could not remove pods $ids"
}

# The kubelet's pod-level cgroups (runc removes the containers' own), children first.
remove_pod_cgroups() {
  local mnt
  while read -r mnt; do
    [ -d "$mnt/$CGROOT/kubepods" ] || continue
    find "$mnt/$CGROOT/kubepods" -depth -mindepth 1 -type d -exec rmdir {} \; 2>/dev/null || true
  done < <(awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/self/mounts)
}

cleanup() {
  local mnt p
  stop_pid "$kubelet_pid" kubelet
  remove_pods
  stop_pid "$relay_unit_pid" kpleg-cri-relay
  stop_pid "$kplegd_pid" kplegd
  # The kubelet's whole cgroup tree, in every hierarchy; /kpleg-kubelet itself where the test
  # made it (the kubelet makes it in the cgroup2 hierarchy).
  while read -r mnt; do
    [ -d "$mnt/$CGROOT" ] || continue
    find "$mnt/$CGROOT" -depth -mindepth 1 -type d -exec rmdir {} \; 2>/dev/null || true
    rmdir "$mnt/$CGROOT" 2>/dev/null || log "warning: cannot remove cgroup $mnt/$CGROOT"
  done < <(awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/self/mounts)
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  if [ -d /var/log/containers ]; then
    find /var/log/containers -maxdepth 1 -type l -lname "$tmp/*" -delete 2>/dev/null || true
  fi
  for p in /var/lib/kubelet/device-plugins /var/lib/kubelet /var/log/containers; do
    existed "$p" || rmdir "$p" 2>/dev/null || true
  done
  if [ "$failed" = 0 ]; then
    rm -rf "$tmp"
  else
    log "logs, events and metrics kept in $tmp"
  fi
  log "total time $((SECONDS - started)) s"
}
trap 'failed=1' ERR
trap cleanup EXIT

# --- test bed --------------------------------------------------------------------------------
if [ -n "${KPLEG_RUNTIME_ENDPOINT:-}" ]; then
  endpoint=$KPLEG_RUNTIME_ENDPOINT
else
  up=$(bash "$repo/scripts/testbed.sh" up) || skip "the test bed did not come up (scripts/testbed.sh up; see above)"
  endpoint=${up#KPLEG_RUNTIME_ENDPOINT=}
fi
runtime_version=$(crictl_ version 2>/dev/null | awk '/^RuntimeName/ {n=$2} /^RuntimeVersion/ {v=$2} END {print n, v}') ||
  skip "the runtime at $endpoint does not answer"
crictl_ inspecti "$IMAGE" >/dev/null 2>&1 || fail "the runtime at $endpoint has no image $IMAGE"
log "$kubelet_version, runtime $runtime_version at $endpoint"

# --- what the kubelet needs of the host ------------------------------------------------------
# Its cgroup root must exist in every cgroup v1 hierarchy (cpuset needs cpus and mems to take
# tasks); on cgroup2 it makes it itself.
while read -r mnt fstype; do
  [ "$fstype" = cgroup ] || continue
  [ -d "$mnt/$CGROOT" ] && continue
  mkdir "$mnt/$CGROOT"
  cgroup_dirs_made+=("$mnt/$CGROOT")
  if [ -f "$mnt/cpuset.cpus" ]; then
    cat "$mnt/cpuset.cpus" >"$mnt/$CGROOT/cpuset.cpus"
    cat "$mnt/cpuset.mems" >"$mnt/$CGROOT/cpuset.mems"
  fi
done < <(awk '$3 == "cgroup" || $3 == "cgroup2" { print $2, $3 }' /proc/self/mounts)
cgroup_driver_note="cgroupfs driver, cgroupRoot /$CGROOT"
if awk '$3 == "cgroup" { found = 1 } END { exit !found }' /proc/self/mounts; then
  cgroup_driver_note+=" (cgroup v1 hierarchies present: failCgroupV1 false)"
fi
# The kernel settings the kubelet checks with protectKernelDefaults (it refuses to start when one
# differs): where the host's value differs, a file with the kubelet's value is bind-mounted over
# it in the kubelet's private mount namespace. The host keeps its own.
mkdir -p "$tmp/sysctl"
mounts=""
for kv in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
  kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
  key=${kv%=*}
  want=${kv#*=}
  [ "$(cat "/proc/sys/$key")" = "$want" ] && continue
  f=$tmp/sysctl/${key//\//.}
  echo "$want" >"$f"
  mounts+="mount --bind $f /proc/sys/$key && "
done

# --- the runs --------------------------------------------------------------------------------
# start_kplegd DIR ARGS...: kplegd on the test bed, events as JSON lines in DIR/events.jsonl.
start_kplegd() {
  local d=$1 deadline
  shift
  "$bin/kplegd" --runtime-endpoint "$endpoint" --socket "$d/api.sock" --metrics-address 127.0.0.1:0 \
    --print-events json "$@" >"$d/events.jsonl" 2>"$d/kplegd.log" &
  kplegd_pid=$!
  deadline=$((SECONDS + 30))
  until grep -q 'kplegd ready' "$d/kplegd.log" 2>/dev/null; do
    kill -0 "$kplegd_pid" 2>/dev/null || { cat "$d/kplegd.log"; fail "kplegd exited"; }
    [ "$SECONDS" -lt "$deadline" ] || { cat "$d/kplegd.log"; fail "kplegd not ready within 30 s"; }
    sleep 0.1
  done
  if ! grep -q 'kplegd ready: ebpf mode' "$d/kplegd.log"; then
    cat "$d/kplegd.log"
    skip "kplegd could not load its BPF programs here (relist mode): no kernel timestamps to measure with"
  fi
  metrics_port=$(grep -o 'metrics: serving .* on 127\.0\.0\.1:[0-9]*' "$d/kplegd.log" | sed 's/.*://' | head -1)
  [ -n "$metrics_port" ] || fail "kplegd did not say where it serves /metrics"
}

write_config() { # DIR ENDPOINT
  cat >"$1/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# Standalone: no API server (no --kubeconfig), static pods only.
containerRuntimeEndpoint: $2
staticPodPath: $1/manifests
fileCheckFrequency: 5s
podLogsDir: $1/pod-logs
volumePluginDir: $1/volume-plugins
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupRoot: /$CGROOT
failSwapOn: false
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $HEALTHZ_PORT
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
makeIPTablesUtilChains: false
protectKernelDefaults: true
# No image garbage collection: the test bed's image is never pulled again.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
crashLoopBackOff:
  maxContainerRestartPeriod: $BACKOFF_MAX
featureGates:
  EventedPLEG: true
EOF
}

write_pod() { # FILE NAME CONTAINER COMMAND...
  local file=$1 name=$2 container=$3 args tmpfile
  shift 3
  args=$(printf '"%s", ' "$@")
  # Written aside under a dot name (the kubelet ignores those) and renamed: the kubelet never
  # reads half a manifest, and the pod's uid (a hash that includes the file name) is final.
  tmpfile=$(dirname "$file")/.$(basename "$file")
  cat >"$tmpfile" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $name, namespace: default}
spec:
  hostNetwork: true
  restartPolicy: Always
  terminationGracePeriodSeconds: 2
  containers:
  - name: $container
    image: $IMAGE
    imagePullPolicy: Never
    command: [${args%, }]
EOF
  mv "$tmpfile" "$file"
}

start_kubelet() { # DIR
  local d=$1
  mkdir -p "$d/manifests" "$d/pod-logs" "$d/volume-plugins" "$d/root" "$d/certs"
  # unshare without --fork: the shell, then the kubelet, keep unshare's pid.
  TZ=UTC unshare -m --propagation private sh -c "${mounts}exec \"$KUBELET\" --config=$d/config.yaml \
    --root-dir=$d/root --cert-dir=$d/certs --hostname-override=$NODE --v=4" >"$d/kubelet.log" 2>&1 &
  kubelet_pid=$!
}

# wait_event DIR SECONDS PYTHON_CONDITION: until an event in DIR/events.jsonl satisfies the
# condition on e (a dict).
wait_event() {
  local d=$1 secs=$2 cond=$3
  python3 - "$d/events.jsonl" "$secs" "$cond" <<'PY'
import json, sys, time
path, secs, cond = sys.argv[1], float(sys.argv[2]), sys.argv[3]
deadline = time.time() + secs
while time.time() < deadline:
    with open(path) as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if eval(cond, {}, {"e": e}):
                sys.exit(0)
    time.sleep(0.2)
sys.exit(1)
PY
}

metrics() { curl -s --max-time 10 "http://127.0.0.1:$metrics_port/metrics"; }
kubelet_metrics() { curl -sk --max-time 10 "https://127.0.0.1:$KUBELET_PORT/metrics"; }
# cpu_snapshot FILE: CPU seconds so far of the kubelet and kplegd (utime + stime of the process)
# and, with KPLEG_KUBELET_RUNTIME_CGROUP (a cgroup2 directory holding the runtime and its shims,
# as bench/run.sh makes), of the runtime: for bench/kubelet.sh's node CPU.
cpu_snapshot() {
  local p name tck
  tck=$(getconf CLK_TCK)
  {
    for name in kubelet kplegd; do
      [ "$name" = kubelet ] && p=$kubelet_pid || p=$kplegd_pid
      [ -n "$p" ] && [ -r "/proc/$p/stat" ] &&
        awk -v n="$name" -v t="$tck" '{ sub(/.*\) /, ""); print n, ($12 + $13) / t }' "/proc/$p/stat"
    done
    [ -n "${KPLEG_KUBELET_RUNTIME_CGROUP:-}" ] &&
      awk '$1 == "usage_usec" { print "runtime", $2 / 1e6 }' "$KPLEG_KUBELET_RUNTIME_CGROUP/cpu.stat"
  } >"$1" || true
}

# run_phase NAME: one kubelet run (kpleg, runtime or direct; see the top of this file).
run_phase() {
  local name=$1 d=$tmp/$1 kubelet_ep i window t0
  mkdir -p "$d"
  log "---- run '$name' ----"
  case $name in
    kpleg | runtime)
      start_kplegd "$d" --cri-listen "$d/cri.sock" --cri-events "$name"
      kubelet_ep=unix://$d/cri.sock
      window=$WINDOW
      ;;
    direct)
      start_kplegd "$d"
      kubelet_ep=$endpoint
      window=$DIRECT_WINDOW
      ;;
  esac
  write_config "$d" "$kubelet_ep"
  mkdir -p "$d/manifests"
  write_pod "$d/manifests/sleeper.yaml" "sleeper-$name" sleep /bin/sleep 100000
  t0=$SECONDS
  start_kubelet "$d"
  if ! wait_event "$d" 90 "e['type'] == 'ContainerStarted' and e['pod_name'] == 'sleeper-$name-$NODE' and e['container_name'] == 'sleep'"; then
    tail -n 40 "$d/kubelet.log"
    fail "[$name] the sleeper pod did not start within 90 s of the kubelet's start"
  fi
  crictl_ ps -q --state Running --name '^sleep$' --label "io.kubernetes.pod.name=sleeper-$name-$NODE" | grep -q . ||
    fail "[$name] crictl does not list the sleeper's container as running"
  log "[$name] sleeper running $((SECONDS - t0)) s after the kubelet's start (kplegd's event, crictl ps)"
  if [ "$name" != direct ] && [ "$IDLE_WINDOW" -gt 0 ]; then
    # The calls of a quiet node: the kubelet with one running pod.
    log "[$name] counting the kubelet's CRI calls with only the sleeper for $IDLE_WINDOW s"
    metrics >"$d/idle0.txt"
    date +%s%N >"$d/idle-start"
    sleep "$IDLE_WINDOW"
    metrics >"$d/idle1.txt"
    date +%s%N >"$d/idle-end"
  fi
  metrics >"$d/metrics0.txt"
  cpu_snapshot "$d/cpu0.txt"
  date +%s%N >"$d/window-start"
  for i in $(seq 1 "$CRASHERS"); do
    write_pod "$d/manifests/crasher-$i.yaml" "crasher-$name-$i" crash /bin/sh -c 'sleep 2; exit 1'
    sleep 0.7
  done
  log "[$name] $CRASHERS crash pods added; measuring for $window s"
  sleep $((window > CRASHERS * 7 / 10 ? window - CRASHERS * 7 / 10 : 1))
  date +%s%N >"$d/window-end"
  cpu_snapshot "$d/cpu1.txt"
  metrics >"$d/metrics1.txt"
  if [ "$name" != direct ]; then
    "$bin/kplegctl" --socket "$d/api.sock" stuck --older-than 10s >"$d/stuck.txt" 2>&1 || echo "exit $?" >>"$d/stuck.txt"
  fi
  kubelet_metrics >"$d/kubelet-metrics.txt" || true
  date +%s%N >"$d/kubelet-stop"
  stop_pid "$kubelet_pid" kubelet
  kubelet_pid=
  remove_pods
  stop_pid "$kplegd_pid" kplegd
  kplegd_pid=
  remove_pod_cgroups
}

# The analysis of one run (key=value lines for the assertions below, and DIR/analysis.json for
# the report).
analyze() { # DIR NAME
  python3 - "$1" "$2" "$CRASHERS" "$NODE" "$(date -u +%Y)" <<'PY'
import json, os, re, statistics, sys
from datetime import datetime, timezone

d, name, crashers, node, year = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
def read_ns(f):
    with open(os.path.join(d, f)) as fh:
        return int(fh.read().strip())
stop_ns = read_ns("kubelet-stop")
w0, w1 = read_ns("window-start"), read_ns("window-end")

events = []
with open(os.path.join(d, "events.jsonl")) as f:
    for line in f:
        try:
            events.append(json.loads(line))
        except ValueError:
            pass

crash = [e for e in events if not e.get("sandbox") and e.get("container_name") == "crash"
         and e.get("pod_name", "").startswith("crasher-%s-" % name)]
sleeper_running = any(e["type"] == "ContainerStarted" and e.get("pod_name") == "sleeper-%s-%s" % (name, node)
                      and e.get("container_name") == "sleep" for e in events)
lifecycle = [e for e in crash if e["type"] in ("ContainerStarted", "ContainerDied") and e.get("kernel_ts_ns", 0) > 0]
timed = [e for e in crash if e["type"] in ("ContainerStarted", "ContainerDied")]
kernel_events = sum(1 for e in timed if e.get("source") == "kernel")

# The kubelet's log: klog's "I1124 06:34:28.278195 ..." in UTC (TZ=UTC).
klog_re = re.compile(r'^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6})')
def klog_ns(line):
    m = klog_re.match(line)
    if not m:
        return None
    mo, dd, hh, mi, ss, us = (int(x) for x in m.groups())
    t = datetime(year, mo, dd, hh, mi, ss, tzinfo=timezone.utc)
    return int(t.timestamp()) * 10**9 + us * 1000
pleg_exited, hint = {}, {}
log_counts = {"disabling": 0, "stream_failures": 0, "hints": 0, "relist_pod_dropped": 0}
cid_re = re.compile(r'containerID="([0-9a-f]{64})"')
with open(os.path.join(d, "kubelet.log"), errors="replace") as f:
    for line in f:
        if "disabling container-termination fast path" in line:
            log_counts["disabling"] += 1
        elif "failed to get container events" in line:
            log_counts["stream_failures"] += 1
        elif "Relist request channel full" in line:
            log_counts["relist_pod_dropped"] += 1
        elif "requested pod relist after container termination" in line:
            log_counts["hints"] += 1
            m, t = cid_re.search(line), klog_ns(line)
            if m and t:
                hint.setdefault(m.group(1), t)
        elif '"GenericPLEG"' in line and 'newState="exited"' in line and 'oldState="running"' in line:
            m, t = cid_re.search(line), klog_ns(line)
            if m and t:
                pleg_exited.setdefault(m.group(1), t)

by_pod = {}
for e in sorted(lifecycle, key=lambda e: e["kernel_ts_ns"]):
    by_pod.setdefault(e["pod_uid"], []).append(e)
first, later, notice, hinted, emitted, missing_hint = [], [], [], [], [], []
deaths = 0
restarted_pods = set()
for uid, evs in by_pod.items():
    n_death = 0
    for i, e in enumerate(evs):
        if e["type"] != "ContainerDied" or e["kernel_ts_ns"] >= stop_ns:
            continue
        deaths += 1
        n_death += 1
        died = e["kernel_ts_ns"]
        nxt = next((s for s in evs[i + 1:] if s["type"] == "ContainerStarted"), None)
        cid = e["container_id"]
        if e.get("emit_ts_ns", 0) > 0:
            emitted.append((e["emit_ts_ns"] - died) / 1e6)
        if cid in pleg_exited:
            notice.append((pleg_exited[cid] - died) / 1e6)
        if cid in hint:
            hinted.append((hint[cid] - died) / 1e6)
        if nxt is None:
            continue
        restarted_pods.add(uid)
        (first if n_death == 1 else later).append((nxt["kernel_ts_ns"] - died) / 1e6)
        if cid not in hint:
            missing_hint.append(cid[:12])

def stats(xs):
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "mean": statistics.mean(xs), "median": statistics.median(xs),
            "min": min(xs), "max": max(xs)}

def calls(f, metric="kpleg_cri_endpoint_calls_total"):
    out = {}
    p = os.path.join(d, f)
    if not os.path.exists(p):
        return out
    pat = re.compile(r'^' + metric + r'\{([^}]*)\} (\S+)')  # labels in any order
    with open(p) as fh:
        for line in fh:
            m = pat.match(line)
            if m:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
                method, code = labels["method"], labels["code"]
                key = method if code == "OK" else "%s(%s)" % (method, code)
                out[key] = out.get(key, 0) + float(m.group(2))
    return out
def gauge(f, metric):
    p = os.path.join(d, f)
    if not os.path.exists(p):
        return None
    with open(p) as fh:
        for line in fh:
            if line.startswith(metric + " ") or line.startswith(metric + "{"):
                return float(line.split()[-1])
    return None
def rate(f0, f1, seconds, metric="kpleg_cri_endpoint_calls_total"):
    c0, c1 = calls(f0, metric), calls(f1, metric)
    r = {m: (c1.get(m, 0) - c0.get(m, 0)) * 60.0 / seconds for m in sorted(set(c0) | set(c1))}
    return {m: v for m, v in r.items() if v > 0}
window_s = (w1 - w0) / 1e9
per_min = rate("metrics0.txt", "metrics1.txt", window_s)
# kplegd's own calls to the runtime (confirming the kernel's signals, building the events it
# serves, reconciling): the runtime's load is the kubelet's and these.
own_per_min = rate("metrics0.txt", "metrics1.txt", window_s, "kpleg_cri_calls_total")
idle_s, idle_per_min, idle_own_per_min = None, {}, {}
if os.path.exists(os.path.join(d, "idle-end")):
    idle_s = (read_ns("idle-end") - read_ns("idle-start")) / 1e9
    idle_per_min = rate("idle0.txt", "idle1.txt", idle_s)
    idle_own_per_min = rate("idle0.txt", "idle1.txt", idle_s, "kpleg_cri_calls_total")
restarts_in_window = sum(1 for e in lifecycle if e["type"] == "ContainerStarted" and w0 <= e["kernel_ts_ns"] < w1)
lat_sum = gauge("kubelet-metrics.txt", "kubelet_evented_pleg_connection_latency_seconds_sum")
lat_cnt = gauge("kubelet-metrics.txt", "kubelet_evented_pleg_connection_latency_seconds_count")

runtime_stream = None
with open(os.path.join(d, "kplegd.log")) as f:
    for line in f:
        if "runtime events:" in line:
            runtime_stream = "does not serve GetContainerEvents" not in line

a = {
    "name": name,
    "sleeper_running": sleeper_running,
    "crash_pods_seen": len(by_pod),
    "crash_pods_restarted": len(restarted_pods),
    "deaths": deaths,
    "kernel_events": kernel_events,
    "timed_events": len(timed),
    "first_restart_ms": stats(first),
    "later_restart_ms": stats(later),
    "kubelet_noticed_ms": stats(notice),
    "kplegd_emitted_ms": stats(emitted),
    "hint_received_ms": stats(hinted),
    "deaths_restarted_without_hint": missing_hint,
    "log": log_counts,
    "window_s": window_s,
    "calls_per_min": per_min,
    "calls_per_min_total": sum(per_min.values()),
    "idle_window_s": idle_s,
    "idle_calls_per_min": idle_per_min,
    "idle_calls_per_min_total": sum(idle_per_min.values()),
    "own_calls_per_min": own_per_min,
    "own_calls_per_min_total": sum(own_per_min.values()),
    "idle_own_calls_per_min": idle_own_per_min,
    "idle_own_calls_per_min_total": sum(idle_own_per_min.values()),
    "restarts_in_window": restarts_in_window,
    "event_streams": gauge("metrics1.txt", "kpleg_cri_endpoint_event_streams"),
    "kubelet_stream_errors": gauge("kubelet-metrics.txt", "kubelet_evented_pleg_connection_error_count"),
    "kubelet_stream_connects": gauge("kubelet-metrics.txt", "kubelet_evented_pleg_connection_success_count"),
    "kubelet_event_latency_mean_ms": (lat_sum / lat_cnt * 1000) if lat_sum is not None and lat_cnt else None,
    "kubelet_events_received": lat_cnt,
    "runtime_stream": runtime_stream,
}
# CPU seconds per minute of the window (cpu_snapshot), by process.
def cpu(f):
    try:
        with open(os.path.join(d, f)) as fh:
            return {k: float(v) for k, v in (l.split() for l in fh if l.strip())}
    except (OSError, ValueError):
        return {}
c0, c1 = cpu("cpu0.txt"), cpu("cpu1.txt")
a["cpu_s_per_min"] = {k: (c1[k] - c0[k]) * 60e9 / (w1 - w0) for k in c1 if k in c0}
with open(os.path.join(d, "analysis.json"), "w") as f:
    json.dump(a, f, indent=1)
def sh(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    if v is None:
        return ""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)
for k in ("sleeper_running", "crash_pods_seen", "crash_pods_restarted", "deaths", "kernel_events",
          "timed_events", "event_streams", "kubelet_stream_errors", "runtime_stream"):
    print("%s=%s" % (k, sh(a[k])))
print("first_restarts=%d" % a["first_restart_ms"]["n"])
print("missing_hints=%d" % len(missing_hint))
for k, v in log_counts.items():
    print("log_%s=%d" % (k, v))
PY
}

check_phase() { # NAME
  local name=$1 d=$tmp/$1 vars
  vars=$(analyze "$d" "$name") || fail "[$name] analysis failed"
  local sleeper_running crash_pods_seen crash_pods_restarted deaths kernel_events timed_events \
    event_streams kubelet_stream_errors runtime_stream first_restarts missing_hints log_disabling \
    log_stream_failures log_hints log_relist_pod_dropped
  eval "$vars"
  [ "$sleeper_running" = 1 ] || fail "[$name] no ContainerStarted for the sleeper"
  [ "$crash_pods_seen" = "$CRASHERS" ] || fail "[$name] kplegd saw $crash_pods_seen of $CRASHERS crash pods"
  [ "$crash_pods_restarted" = "$CRASHERS" ] ||
    fail "[$name] the kubelet restarted $crash_pods_restarted of $CRASHERS crash pods"
  [ "$first_restarts" = "$CRASHERS" ] || fail "[$name] $first_restarts first restarts measured, not $CRASHERS"
  # The kernel path sees the kubelet's pods under /kpleg-kubelet/kubepods (root name kubepods).
  [ "$timed_events" -gt 0 ] && [ $((kernel_events * 10)) -ge $((timed_events * 9)) ] ||
    fail "[$name] only $kernel_events of $timed_events starts and deaths came from the kernel"
  log "[$name] $CRASHERS crash pods restarted ($deaths deaths); $kernel_events of $timed_events starts/deaths from the kernel"
  case $name in
    kpleg)
      [ "$event_streams" = 1 ] || fail "[kpleg] kpleg_cri_endpoint_event_streams is '$event_streams' at the end, not 1"
      [ "$log_disabling" = 0 ] || fail "[kpleg] the kubelet disabled its container-termination fast path"
      [ "$log_stream_failures" = 0 ] ||
        fail "[kpleg] the kubelet's event stream through kplegd failed $log_stream_failures times"
      [ -z "$kubelet_stream_errors" ] || [ "$kubelet_stream_errors" = 0 ] ||
        fail "[kpleg] the kubelet counts $kubelet_stream_errors event stream errors"
      [ "$log_hints" -gt 0 ] || fail "[kpleg] the kubelet never requested a pod relist after a container termination"
      [ "$missing_hints" = 0 ] ||
        fail "[kpleg] $missing_hints deaths were followed by a restart without the kubelet's hint"
      log "[kpleg] stream open (kpleg_cri_endpoint_event_streams 1, no stream errors); $log_hints hints fired"
      grep -qi '^no CRI call in flight' "$d/stuck.txt" ||
        fail "[kpleg] kplegctl stuck lists calls in flight: $(cat "$d/stuck.txt")"
      ;;
    runtime | direct)
      if [ "$runtime_stream" = 0 ]; then
        # The runtime has no GetContainerEvents: 5 failures, then the kubelet gives its hint up.
        [ "$log_disabling" = 1 ] && [ "$log_hints" = 0 ] ||
          fail "[$name] runtime without an event stream, yet the kubelet logged $log_disabling 'disabling' and $log_hints hints"
        log "[$name] runtime has no event stream: the kubelet disabled its hint after $log_stream_failures failures (1 s relist only)"
      else
        [ "$log_disabling" = 0 ] && [ "$log_hints" -gt 0 ] ||
          fail "[$name] runtime with an event stream, yet the kubelet logged $log_disabling 'disabling' and $log_hints hints"
        log "[$name] the runtime's own event stream: $log_hints hints fired"
      fi
      ;;
  esac
}

# --- the relay run ------------------------------------------------------------------------------
# kubelet -> kpleg-cri-relay (socket-activated: socket_unit.py holds the socket as a .socket unit
# would and starts the relay under systemd-socket-activate) -> runtime, the relay reading
# kplegd's events from its API. While the crash pods crash-loop, kplegd is killed KILLS times
# with SIGKILL and KILLS times with SIGTERM (each time started again at once, as its DaemonSet
# would). Asserted over that window: no kubelet call failed for a reason kpleg controls (none
# the relay ended CANCELLED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED or UNAVAILABLE, no such
# "rpc error" in the kubelet's log), every crash pod restarted, no "PLEG is not healthy", the
# kubelet's event stream unbroken (no "disabling", no stream failure, its error count 0) and its
# hint firing, the relay caught up after every new kplegd, and `kplegctl stuck` reads the
# relay's calls in flight. Then the relay itself is restarted once (SIGTERM, graceful; the
# socket stays): the calls that failed meanwhile are counted and reported, and the crash pods
# must go on restarting through the new relay.

# Sum over the crash pods of their container's highest attempt number (the runtime's count of
# the kubelet's restarts), read from the runtime directly.
crash_attempts() {
  crictl_ ps -a --name '^crash$' -o json 2>/dev/null | python3 -c '
import json, sys
best = {}
for c in json.load(sys.stdin).get("containers", []):
    pod = c["labels"].get("io.kubernetes.pod.name", "")
    best[pod] = max(best.get(pod, -1), c["metadata"].get("attempt", 0))
print(sum(v + 1 for v in best.values()))'
}
# wait_attempts MIN SECONDS: until crash_attempts >= MIN.
wait_attempts() {
  local deadline=$((SECONDS + $2))
  until [ "$(crash_attempts)" -ge "$1" ]; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.5
  done
}
# Lines of the kubelet's log saying a CRI call failed for a reason of the path (not the runtime's
# own answer), and of the relay's log saying it ended a call so.
kubelet_path_errors() { grep -cE 'rpc error: code = (Unavailable|Canceled|DeadlineExceeded|ResourceExhausted)' "$1/kubelet.log" || true; }
relay_path_errors() { grep -cE 'call failed: .* with code (1|4|8|14):' "$1/relay.log" || true; }

relay_crictl() { crictl --config /dev/null --runtime-endpoint "unix://$tmp/relay/cri.sock" --image-endpoint "unix://$tmp/relay/cri.sock" --timeout 20s "$@"; }

restart_kplegd() { # DIR N
  local d=$1 n=$2 deadline
  "$bin/kplegd" --runtime-endpoint "$endpoint" --socket "$d/api.sock" --metrics-address 127.0.0.1:0 \
    --print-events json >>"$d/events.jsonl" 2>"$d/kplegd-$n.log" &
  kplegd_pid=$!
  deadline=$((SECONDS + 30))
  until grep -q 'kplegd ready' "$d/kplegd-$n.log" 2>/dev/null; do
    kill -0 "$kplegd_pid" 2>/dev/null || { cat "$d/kplegd-$n.log"; fail "[relay] kplegd exited"; }
    [ "$SECONDS" -lt "$deadline" ] || fail "[relay] kplegd not ready within 30 s"
    sleep 0.1
  done
}

run_relay_phase() {
  local d=$tmp/relay i sig t0 a0 a1 k0 r0 deadline hz errs hints catchups
  mkdir -p "$d"
  log "---- run 'relay' ----"
  [ -x "$bin/kpleg-cri-relay" ] || fail "no kpleg-cri-relay in $bin"
  command -v systemd-socket-activate >/dev/null ||
    skip "needs systemd-socket-activate (Debian package systemd; scripts/install-deps.sh)"
  start_kplegd "$d"
  python3 "$here/socket_unit.py" "$d/cri.sock" "$d/relay.log" -- "$bin/kpleg-cri-relay" \
    --listen "$d/cri.sock" --runtime-endpoint "$endpoint" --kplegd-socket "$d/api.sock" \
    --status-socket "$d/relay-status.sock" &
  relay_unit_pid=$!
  until [ -S "$d/cri.sock" ]; do sleep 0.05; done
  # systemd-socket-activate starts the relay at the first connection, as a .socket unit does:
  # crictl's, which waits in the backlog meanwhile.
  relay_crictl version >/dev/null || { cat "$d/relay.log"; fail "[relay] crictl version through the relay failed"; }
  grep -q 'serving on the socket systemd passed' "$d/relay.log" || { cat "$d/relay.log"; fail "[relay] the relay did not start"; }
  write_config "$d" "unix://$d/cri.sock"
  mkdir -p "$d/manifests"
  write_pod "$d/manifests/sleeper.yaml" "sleeper-relay" sleep /bin/sleep 100000
  start_kubelet "$d"
  if ! wait_event "$d" 90 "e['type'] == 'ContainerStarted' and e['pod_name'] == 'sleeper-relay-$NODE' and e['container_name'] == 'sleep'"; then
    tail -n 40 "$d/kubelet.log"
    fail "[relay] the sleeper pod did not start within 90 s of the kubelet's start"
  fi
  relay_crictl ps -q --state Running --name '^sleep$' | grep -q . ||
    fail "[relay] crictl through the relay does not list the sleeper's container"
  for i in $(seq 1 "$CRASHERS"); do
    write_pod "$d/manifests/crasher-$i.yaml" "crasher-relay-$i" crash /bin/sh -c 'sleep 2; exit 1'
    sleep 0.7
  done
  wait_attempts $((CRASHERS * 2)) 60 || fail "[relay] the crash pods were not restarted once ($(crash_attempts) attempts)"
  a0=$(crash_attempts)
  k0=$(kubelet_path_errors "$d")
  t0=$SECONDS
  local relay_pid ticks0 ns0
  relay_pid=$(tail -1 "$d/relay.log.pids")
  ticks0=$(awk '{print $14 + $15}' "/proc/$relay_pid/stat")
  ns0=$(date +%s%N)
  log "[relay] crash pods looping ($a0 attempts); killing kplegd $KILLS times (SIGKILL) and $KILLS times (SIGTERM)"
  for i in $(seq 1 $((KILLS * 2))); do
    sig=KILL
    [ $((i % 2)) = 0 ] && sig=TERM
    kill -"$sig" "$kplegd_pid"
    wait "$kplegd_pid" 2>/dev/null || true
    restart_kplegd "$d" "$i"
    sleep 1  # the crash pods die and restart meanwhile
  done
  # After the last new kplegd: each crash pod restarted again, through the relay.
  wait_attempts $((a0 + CRASHERS)) 60 || fail "[relay] crash pods stopped restarting while kplegd was restarted ($(crash_attempts) attempts, from $a0)"
  a1=$(crash_attempts)
  RELAY_USAGE_NOTE="relay during the crash loop and kplegd's restarts: CPU $(awk -v t0="$ticks0" -v ns0="$ns0" -v ns1="$(date +%s%N)" -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15 - t0) / hz * 1e9 / (ns1 - ns0) * 100}' "/proc/$relay_pid/stat") % of a core, RSS $(awk '/^VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$relay_pid/status") MiB (peak $(awk '/^VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$relay_pid/status") MiB), $(awk '/^Threads/ {print $2}' "/proc/$relay_pid/status") threads"
  log "[relay] $RELAY_USAGE_NOTE"
  kubelet_metrics >"$d/kubelet-metrics.txt" || true
  "$bin/kplegctl" --socket "$d/relay-status.sock" stuck --older-than 10s >"$d/stuck.txt" 2>&1 || echo "exit $?" >>"$d/stuck.txt"
  hz=$(curl -s --max-time 5 "http://127.0.0.1:$HEALTHZ_PORT/healthz" || true)
  errs=$(($(kubelet_path_errors "$d") - k0))
  catchups=$(grep -c 'catch-up events for the gap' "$d/relay.log" || true)
  hints=$(grep -c 'requested pod relist after container termination' "$d/kubelet.log" || true)
  log "[relay] $((SECONDS - t0)) s of kplegd restarts: crash pods went from $a0 to $a1 attempts; relay caught up $catchups new kplegd instances; $hints hints fired"
  [ "$(relay_path_errors "$d")" = 0 ] || { grep 'call failed' "$d/relay.log" | head; fail "[relay] the relay ended kubelet calls with a path error"; }
  [ "$errs" = 0 ] || { grep -E 'rpc error: code = (Unavailable|Canceled|DeadlineExceeded|ResourceExhausted)' "$d/kubelet.log" | tail -5; fail "[relay] $errs kubelet CRI calls failed while kplegd was restarted"; }
  [ "$hz" = ok ] || fail "[relay] the kubelet's healthz says '$hz'"
  # (Its start says "PLEG is not healthy: pleg has yet to be successful" until its first relist.)
  ! grep 'PLEG is not healthy' "$d/kubelet.log" | grep -vq 'pleg has yet to be successful' ||
    fail "[relay] the kubelet says PLEG is not healthy"
  ! grep -q 'disabling container-termination fast path' "$d/kubelet.log" || fail "[relay] the kubelet disabled its event hint"
  ! grep -q 'failed to get container events' "$d/kubelet.log" || fail "[relay] the kubelet's event stream through the relay failed"
  local stream_errors
  stream_errors=$(awk '/^kubelet_evented_pleg_connection_error_count / {print $2}' "$d/kubelet-metrics.txt")
  [ -z "$stream_errors" ] || [ "$stream_errors" = 0 ] || fail "[relay] the kubelet counts $stream_errors event stream errors"
  [ "$hints" -gt 0 ] || fail "[relay] the kubelet never got a STOPPED hint through the relay"
  [ "$catchups" -ge $((KILLS * 2)) ] || fail "[relay] the relay caught up after $catchups of $((KILLS * 2)) new kplegd instances"
  grep -qi '^no CRI call in flight' "$d/stuck.txt" || fail "[relay] kplegctl stuck on the relay's status socket: $(cat "$d/stuck.txt")"
  log "[relay] no kubelet call failed, PLEG healthy, event stream unbroken (error count ${stream_errors:-0}), kplegctl stuck reads the relay"

  # The relay's own restart, socket-activated.
  k0=$(kubelet_path_errors "$d")
  r0=$(grep -c 'failed to get container events' "$d/kubelet.log" || true)
  t0=$(date +%s%N)
  kill -USR1 "$relay_unit_pid"
  # A call made as the relay restarts: answered by the old relay or, from the backlog, by the new.
  relay_crictl version >/dev/null || fail "[relay] crictl version during the relay's restart failed"
  local restart_ms=$((($(date +%s%N) - t0) / 1000000))
  deadline=$((SECONDS + 20))
  until [ "$(grep -c 'serving on the socket systemd passed' "$d/relay.log")" -ge 2 ]; do
    [ "$SECONDS" -lt "$deadline" ] || { tail -20 "$d/relay.log"; fail "[relay] the relay did not come back"; }
    sleep 0.05
  done
  a1=$(crash_attempts)
  wait_attempts $((a1 + CRASHERS)) 60 || fail "[relay] crash pods stopped restarting after the relay's restart"
  kubelet_metrics >"$d/kubelet-metrics-after.txt" || true
  RELAY_RESTART_NOTE="relay restarted: a crictl call made with the SIGTERM answered after $restart_ms ms; kubelet calls failed on the path meanwhile: $(($(kubelet_path_errors "$d") - k0)); relay-ended path errors: $(relay_path_errors "$d"); kubelet event stream failures: $(($(grep -c 'failed to get container events' "$d/kubelet.log" || true) - r0)), error count now $(awk '/^kubelet_evented_pleg_connection_error_count / {print $2}' "$d/kubelet-metrics-after.txt")"
  log "[relay] $RELAY_RESTART_NOTE"
  stop_pid "$kubelet_pid" kubelet
  kubelet_pid=
  remove_pods
  stop_pid "$relay_unit_pid" kpleg-cri-relay
  relay_unit_pid=
  stop_pid "$kplegd_pid" kplegd
  kplegd_pid=
  remove_pod_cgroups
}

RELAY_RESTART_NOTE=
RELAY_USAGE_NOTE=
for phase in $PHASES; do
  if [ "$phase" = relay ]; then
    run_relay_phase
    continue
  fi
  run_phase "$phase"
  check_phase "$phase"
  # bench/kubelet.sh reads each run's analysis (CPU, latencies, calls) from there.
  if [ -n "${KPLEG_KUBELET_ANALYSIS_DIR:-}" ]; then
    mkdir -p "$KPLEG_KUBELET_ANALYSIS_DIR"
    cp "$tmp/$phase/analysis.json" "$KPLEG_KUBELET_ANALYSIS_DIR/$phase.json"
  fi
done
if ! [[ " $PHASES " == *" kpleg "* && " $PHASES " == *" runtime "* && " $PHASES " == *" direct "* ]]; then
  echo "PASS: phases $PHASES${RELAY_RESTART_NOTE:+; $RELAY_RESTART_NOTE}"
  exit 0
fi

# --- report ----------------------------------------------------------------------------------
report=$(python3 - "$tmp" "$kubelet_version" "$runtime_version" "$("$bin/kplegd" --version)" "$CRASHERS" "$BACKOFF_MAX" "$cgroup_driver_note" <<'PY'
import json, os, sys
tmp, kubelet, runtime, kplegd, crashers, backoff, cg = sys.argv[1:8]
runs = {n: json.load(open(os.path.join(tmp, n, "analysis.json"))) for n in ("kpleg", "runtime", "direct")}
label = {"kpleg": "kubelet -> kplegd (--cri-events kpleg) -> runtime",
         "runtime": "kubelet -> kplegd (--cri-events runtime) -> runtime",
         "direct": "kubelet -> runtime (kplegd beside, timestamps only)"}
def fmt(s):
    if not s or s.get("n", 0) == 0:
        return "n=0"
    return "mean %7.1f  median %7.1f  min %7.1f  max %7.1f ms  (n=%d)" % (s["mean"], s["median"], s["min"], s["max"], s["n"])
out = []
out.append("kubelet e2e results")
out.append("  %s, EventedPLEG on, standalone (static pods), %s" % (kubelet, cg))
out.append("  runtime %s; %s; %s crash pods (sh -c 'sleep 2; exit 1', restartPolicy Always)" % (runtime, kplegd, crashers))
rs = runs["kpleg"]["runtime_stream"]
out.append("  runtime's own GetContainerEvents: %s" % ("served" if rs else "not served" if rs is not None else "unknown"))
out.append("  crash-loop back-off: crashLoopBackOff.maxContainerRestartPeriod %s (first restart: no back-off)" % backoff)
out.append("")
for n in ("kpleg", "runtime", "direct"):
    a = runs[n]
    out.append("%s" % label[n])
    out.append("  death -> replacement started, first restart   %s" % fmt(a["first_restart_ms"]))
    out.append("  death -> replacement started, later restarts  %s" % fmt(a["later_restart_ms"]))
    out.append("  death -> kplegd emitted ContainerDied         %s" % fmt(a["kplegd_emitted_ms"]))
    out.append("  death -> kubelet noticed (GenericPLEG exited)  %s" % fmt(a["kubelet_noticed_ms"]))
    hint = a["hint_received_ms"]
    if hint.get("n", 0):
        out.append("  death -> kubelet got the STOPPED hint         %s" % fmt(hint))
    else:
        out.append("  death -> kubelet got the STOPPED hint         none (%s)" %
                   ("hint disabled after %d stream failures" % a["log"]["stream_failures"] if a["log"]["disabling"] else "no hint"))
    if a["kubelet_event_latency_mean_ms"] is not None:
        out.append("  kubelet_evented_pleg_connection_latency mean  %.1f ms over %d events (event CreatedAt -> kubelet)" %
                   (a["kubelet_event_latency_mean_ms"], a["kubelet_events_received"]))
    out.append("  deaths %d, restarts in the %.0f s window %d" % (a["deaths"], a["window_s"], a["restarts_in_window"]))
    if a.get("cpu_s_per_min"):
        out.append("  CPU s/min in the window: " + ", ".join("%s %.3f" % kv for kv in sorted(a["cpu_s_per_min"].items())))
    out.append("")
k, r = runs["kpleg"], runs["runtime"]
out.append("CRI calls per minute the kubelet made through kplegd (kpleg_cri_endpoint_calls_total by method):")
out.append("  quiet: the sleeper pod only (%s s windows); churn: sleeper + %s crash-looping pods (%.0f s windows;"
           % ("%.0f" % k["idle_window_s"] if k["idle_window_s"] else "no", crashers, k["window_s"]))
out.append("  restarts in the window: kpleg %d, runtime %d)" % (k["restarts_in_window"], r["restarts_in_window"]))
cols = [k["idle_calls_per_min"], r["idle_calls_per_min"], k["calls_per_min"], r["calls_per_min"]]
methods = sorted(set().union(*cols), key=lambda m: -sum(c.get(m, 0) for c in cols))
out.append("  %-34s %14s %14s %14s %14s" % ("method", "quiet kpleg", "quiet runtime", "churn kpleg", "churn runtime"))
for m in methods:
    out.append("  %-34s %14.1f %14.1f %14.1f %14.1f" % ((m,) + tuple(c.get(m, 0) for c in cols)))
out.append("  %-34s %14.1f %14.1f %14.1f %14.1f" % ("total", k["idle_calls_per_min_total"], r["idle_calls_per_min_total"],
                                                   k["calls_per_min_total"], r["calls_per_min_total"]))
out.append("")
dr = runs["direct"]
out.append("kplegd's own CRI calls per minute to the runtime (kpleg_cri_calls_total; the runtime serves these too)")
out.append("  %-34s %14s %14s %14s %14s %14s" % ("method", "quiet kpleg", "quiet runtime", "churn kpleg", "churn runtime", "churn direct"))
cols = [k["idle_own_calls_per_min"], r["idle_own_calls_per_min"], k["own_calls_per_min"], r["own_calls_per_min"], dr["own_calls_per_min"]]
methods = sorted(set().union(*cols), key=lambda m: -sum(c.get(m, 0) for c in cols))
for m in methods:
    out.append("  %-34s %14.1f %14.1f %14.1f %14.1f %14.1f" % ((m,) + tuple(c.get(m, 0) for c in cols)))
out.append("  %-34s %14.1f %14.1f %14.1f %14.1f %14.1f" % ("total", k["idle_own_calls_per_min_total"], r["idle_own_calls_per_min_total"],
                                                         k["own_calls_per_min_total"], r["own_calls_per_min_total"], dr["own_calls_per_min_total"]))
ok = lambda c: sum(v for m, v in c.items() if "(" not in m)
out.append("  %-34s %14.1f %14.1f %14.1f %14.1f %14.1f" % (("total answered OK",) + tuple(ok(c) for c in cols)))
out.append("  (NOT_FOUND: looks at containers this runtime does not know, i.e. of other runtimes or test beds on")
out.append("  the host under a kubepods root, given up after 3 s each; they depend on the host, not on the kubelet)")
out.append("")
out.append("The runtime's CRI calls per minute with the crash pods, the kubelet's and kplegd's answered OK:")
out.append("  kpleg %.0f + %.0f = %.0f;  runtime %.0f + %.0f = %.0f" % (
    k["calls_per_min_total"], ok(k["own_calls_per_min"]), k["calls_per_min_total"] + ok(k["own_calls_per_min"]),
    r["calls_per_min_total"], ok(r["own_calls_per_min"]), r["calls_per_min_total"] + ok(r["own_calls_per_min"])))
print("\n".join(out))
PY
) || fail "the report could not be made"
[ -z "$RELAY_RESTART_NOTE" ] || report+=$'\n\n'"kubelet -> kpleg-cri-relay -> runtime, kplegd killed $KILLS times (SIGKILL) and $KILLS times (SIGTERM): no kubelet call failed; $RELAY_USAGE_NOTE; $RELAY_RESTART_NOTE"
echo
echo "$report"
echo
if [ -n "$results" ]; then
  mkdir -p "$(dirname "$results")"
  echo "$report" >"$results"
  log "results written to $results"
fi
echo "PASS: the kubelet runs its static pods through kplegd's CRI endpoint, restarts crashing containers, and keeps its event stream through kplegd open with its hint firing"
