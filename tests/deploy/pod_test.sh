#!/usr/bin/env bash
# deploy/kplegd-daemonset.yaml run as shipped: the image scripts/image.sh assembles from the build
# (no container engine), imported into the test bed's containerd, and the DaemonSet's pod run
# through the CRI with crictl, as the kubelet would run it. tests/deploy/cri_from_manifest.py
# translates the manifest field by field (security contexts, host namespaces, hostPath volumes,
# args, resources), so the manifest is the only source; only node-specific values change: the
# runtime socket's and the API socket directory's host paths (the test bed's, a scratch
# directory), and the metrics port (a free one; the probes follow it).
#
# Acting as the kubelet, the test checks the hostPath types, runs the startup, readiness and
# liveness probes (exec in the container, as the kubelet's ExecSync), and then asserts that:
#  - the container runs with exactly the securityContext asked for (effective capabilities, no
#    new privileges, seccomp filter, read-only root and mounts), read from /proc on the node;
#  - kplegd reaches ebpf mode there, with its OOM tracepoint attached (tracefs read-only);
#  - `kplegd --self-test` passes inside the pod (crictl exec into the running container, its
#    scratch cgroups under the pod's own cgroup; where the runtime makes the cgroup mount
#    recursively read-only, in a second container of the pod with that mount writable);
#  - a container started in another pod is reported by kplegd, as a kernel event, to
#    `kplegctl watch` over the API socket the manifest shares with the node;
#  - the liveness probe passes at the end, and /livez, /readyz and /healthz answer 200 on the
#    metrics address.
# Then it removes both pods.
#
#   pod_test.sh <build bin dir>
# Exit status: 0 pass, 1 fail, 77 cannot run here (not root; KPLEG_REQUIRE_PRIVILEGED=1 makes
# that a failure). Environment: KPLEG_CRICTL (crictl to use; default crictl on PATH, else the one
# scripts/crictl.sh builds), and what scripts/testbed.sh reads (KPLEG_TESTBED_DIR, ...).
set -euo pipefail

bin=${1:?usage: pod_test.sh <bin dir>}
bin=$(cd "$bin" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
manifest=$repo/deploy/kplegd-daemonset.yaml
start=$SECONDS

fail() {
  echo "FAIL: $*"
  exit 1
}
skip() {
  [ "${KPLEG_REQUIRE_PRIVILEGED:-0}" = 1 ] && fail "$* (KPLEG_REQUIRE_PRIVILEGED=1 forbids skipping)"
  echo "SKIP: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "running pods needs root (the test bed's containerd, BPF)"
command -v python3 >/dev/null && python3 -c 'import yaml' 2>/dev/null || skip "needs python3-yaml"
for t in jq curl; do command -v "$t" >/dev/null || skip "needs $t"; done
for b in kplegd kplegctl kpleg-load; do [ -x "$bin/$b" ] || fail "$bin/$b not built"; done

tmp=$(mktemp -d /tmp/kpleg-pod.XXXXXX)
pod_id=""
load_pod=""
watch_pid=""
pod_cgroup=""
endpoint=""
cleanup() {
  set +e
  [ -n "$watch_pid" ] && kill "$watch_pid" 2>/dev/null && wait "$watch_pid" 2>/dev/null
  [ -n "$load_pod" ] && "$bin/kpleg-load" --runtime-endpoint "$endpoint" remove-pod "$load_pod" >/dev/null 2>&1
  if [ -n "$pod_id" ]; then
    cr stopp "$pod_id" >/dev/null 2>&1
    cr rmp "$pod_id" >/dev/null 2>&1
  fi
  # The kubelet removes a pod's cgroups after the runtime removed its containers.
  if [ -n "$pod_cgroup" ]; then
    for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
      [ -d "$h${pod_cgroup#/}" ] && find "$h${pod_cgroup#/}" -depth -type d -exec rmdir {} + 2>/dev/null
    done
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# --- the test bed, its ctr and a crictl -------------------------------------------------------
up=$(bash "$repo/scripts/testbed.sh" up) || fail "the test bed did not come up"
endpoint=${up#KPLEG_RUNTIME_ENDPOINT=}
sock=${endpoint#unix://}
[ -S "$sock" ] || fail "the test bed's socket $sock is missing"
# The ctr that comes with the test bed's containerd ("testbed runtime: NAME (BIN DIR)").
ctr=$(bash "$repo/scripts/testbed.sh" status 2>/dev/null | sed -n 's/^testbed runtime: [^ ]* (\(.*\))$/\1/p')
# containerd's CRI plugin root on the test bed (the manifest mounts the node's default one).
cri_root=$(bash "$repo/scripts/testbed.sh" status 2>/dev/null | sed -n 's/^root: //p')
[ -n "$cri_root" ] || fail "scripts/testbed.sh status names no root"
cri_root=$cri_root/io.containerd.grpc.v1.cri
mkdir -p "$cri_root"
if [ -n "$ctr" ] && [ -x "$ctr/ctr" ]; then ctr=$ctr/ctr; else ctr=$(command -v ctr) || fail "no ctr"; fi
if [ -n "${KPLEG_CRICTL:-}" ]; then
  crictl=$KPLEG_CRICTL
elif command -v crictl >/dev/null; then
  crictl=$(command -v crictl)
else
  crictl=$(bash "$repo/scripts/crictl.sh")/crictl || fail "no crictl (scripts/crictl.sh could not build it)"
fi
cr() { "$crictl" --config /dev/null --runtime-endpoint "$endpoint" --image-endpoint "$endpoint" --timeout 30s "$@"; }

# --- the translation -------------------------------------------------------------------------
uid=$(python3 -c 'import uuid; print(uuid.uuid4())')
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
metrics_arg=$(python3 - "$manifest" <<'PY'
import sys, yaml
ds = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") == "DaemonSet"][0]
c = ds["spec"]["template"]["spec"]["containers"][0]
print(next(a for a in c["args"] if a.startswith("--metrics-address=")))
PY
) || fail "the manifest has no --metrics-address=HOST:PORT argument"
metrics=${metrics_arg#--metrics-address=}
# Whether the default runtime handler (the pod's: it names none) supports recursive read-only
# mounts, from RuntimeStatus as the kubelet reads it (containerd >= 2.0 reports it; 1.6 nothing).
rro=$(cr info 2>/dev/null | jq -r '[.runtimeHandlers[]? | select((.name // "") == "") |
  .features.recursive_read_only_mounts // false] | any') || rro=false
node_ip=$(hostname -I 2>/dev/null | awk '{print $1}')
mkdir -p "$tmp/logs" "$tmp/run-kpleg"
translate=(python3 "$here/cri_from_manifest.py" "$manifest" "$tmp/cri"
  --host-path /run/containerd/containerd.sock "$sock" --host-path /run/kpleg "$tmp/run-kpleg"
  --host-path /var/lib/containerd/io.containerd.grpc.v1.cri "$cri_root"
  "--override-arg=--metrics-address=${metrics%:*}:$port" --port-replace "${metrics##*:}" "$port"
  --node-ip "${node_ip:-127.0.0.1}" --pod-uid "$uid" --log-dir "$tmp/logs" --self-test-container)
[ "$rro" = true ] && translate+=(--rro-supported)
"${translate[@]}" || fail "the manifest does not translate into CRI requests"
facts=$tmp/cri/pod.json
[ "$(jq '.containers | length' "$facts")" = 1 ] || fail "the pod should have one container (kplegd)"
cname=$(jq -r '.containers[0].name' "$facts")
image=$(jq -r '.containers[0].image' "$facts")
log=$(jq -r .log_directory "$facts")/$cname/0.log
echo "ok: manifest translated (pod $(jq -r '.namespace + "/" + .pod_name' "$facts"), uid $uid, metrics on port $port, recursive read-only mounts: $rro)"

# --- the image -------------------------------------------------------------------------------
KPLEG_BIN_DIR=$bin KPLEG_IMAGE=$image bash "$repo/scripts/image.sh" import --address "$sock" --ctr "$ctr" >/dev/null ||
  fail "scripts/image.sh could not build or import $image"
echo "ok: $image built from $bin and imported ($((SECONDS - start)) s)"

# --- what the kubelet checks and sets up before it starts the pod ------------------------------
while read -r name path type; do
  case $type in
    Directory) [ -d "$path" ] || fail "hostPath $path of volume $name is not a directory" ;;
    Socket) [ -S "$path" ] || fail "hostPath $path of volume $name is not a socket" ;;
    DirectoryOrCreate) mkdir -p -m 0755 "$path" ;;
    "") ;;
    *) fail "hostPath type $type of volume $name: not checked by this test" ;;
  esac
done < <(jq -r '.volumes[] | "\(.name) \(.host_path) \(.type)"' "$facts")
# The node mounts tracefs (kplegd, without CAP_SYS_ADMIN, cannot); systemd does on most nodes.
if jq -e '.volumes[] | select(.host_path == "/sys/kernel/tracing")' "$facts" >/dev/null &&
    [ ! -d /sys/kernel/tracing/events ]; then
  mount -t tracefs nodev /sys/kernel/tracing || fail "cannot mount tracefs at /sys/kernel/tracing"
  echo "ok: node setup: mounted tracefs at /sys/kernel/tracing"
fi

# --- the pod ---------------------------------------------------------------------------------
pod_id=$(cr runp "$tmp/cri/sandbox.json") || fail "RunPodSandbox failed"
pod_cgroup=$(jq -r .linux.cgroup_parent "$tmp/cri/sandbox.json")
cid=$(cr create "$pod_id" "$tmp/cri/$cname.json" "$tmp/cri/sandbox.json") || fail "CreateContainer failed"
cr start "$cid" >/dev/null || fail "StartContainer failed"

dump() {
  echo "--- $cname's log:"
  sed 's/^[^ ]* [^ ]* [^ ]* //' "$log" 2>/dev/null | tail -n 30
}
# A probe as the kubelet runs it: exec in the container (ExecSync), or an HTTP GET; 0 when it passes.
has_probe() { jq -e --arg k "$1" '.containers[0].probes[] | select(.kind == $k)' "$facts" >/dev/null; }
run_probe() {
  local p
  p=$(jq -c --arg k "$1" '.containers[0].probes[] | select(.kind == $k)' "$facts")
  if jq -e .exec <<<"$p" >/dev/null; then
    local cmd
    mapfile -t cmd < <(jq -r '.exec[]' <<<"$p")
    timeout "$(jq -r .timeout_seconds <<<"$p")" "$crictl" --config /dev/null --runtime-endpoint "$endpoint" \
      --image-endpoint "$endpoint" exec "$cid" "${cmd[@]}"
  else
    [ "$(curl -s --max-time "$(jq -r .timeout_seconds <<<"$p")" -o /dev/null -w '%{http_code}' "$(jq -r .url <<<"$p")")" = 200 ]
  fi
}
for k in startupProbe readinessProbe livenessProbe; do
  has_probe "$k" || fail "the container needs a $k"
done
for k in startupProbe readinessProbe; do
  deadline=$((SECONDS + 30))
  until out=$(run_probe "$k" 2>&1); do
    state=$(cr inspect "$cid" | jq -r .status.state)
    [ "$state" = CONTAINER_RUNNING ] || { dump; fail "$cname is $state before its $k passed"; }
    [ "$SECONDS" -lt "$deadline" ] || { echo "$out"; dump; fail "$k did not pass within 30 s"; }
    sleep 0.2
  done
  echo "ok: $k passes ($(jq -c --arg k "$k" '.containers[0].probes[] | select(.kind == $k) | .exec // .url' "$facts"))"
done
grep -q '"kplegd ready: ebpf mode"' "$log" || { dump; fail "kplegd in the pod did not reach ebpf mode"; }
echo "ok: kplegd in the pod runs in ebpf mode"
if grep -q 'oom:mark_victim tracepoint unavailable' "$log"; then
  dump
  fail "the OOM tracepoint did not attach through the read-only tracefs mount"
fi
echo "ok: the oom:mark_victim tracepoint attached through the read-only tracefs mount"
grep -q 'removal hint attached: exited containers' "$log" || {
  dump
  fail "the removal hint did not attach through the read-only mount of containerd's CRI root"
}
echo "ok: the removal hint watches containerd's directories through the read-only mount"

# --- the securityContext, as the kernel applied it --------------------------------------------
pid=$(cr inspect "$cid" | jq -r .info.pid)
[ -r "/proc/$pid/status" ] || fail "cannot read /proc/$pid/status of $cname"
python3 - "$facts" "/proc/$pid" <<'PY' || fail "the container does not run with the manifest's securityContext"
import json, sys
facts = json.load(open(sys.argv[1]))
c = facts["containers"][0]
proc = sys.argv[2]
CAPS = ["CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
        "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
        "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
        "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
        "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
        "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE"]
status = dict(l.split(":", 1) for l in open(proc + "/status") if ":" in l)
status = {k: v.strip() for k, v in status.items()}
bad = []
def names(mask):
    return sorted(CAPS[i] if i < len(CAPS) else str(i) for i in range(64) if mask >> i & 1)
caps = c["capabilities"]
if "ALL" in [x.upper() for x in caps.get("drop", [])]:
    want = sorted(x.upper().removeprefix("CAP_") for x in caps.get("add", []))
    for field in ("CapEff", "CapPrm", "CapBnd"):
        got = names(int(status[field], 16))
        if got != want:
            bad.append("%s is %s, the manifest asks for %s" % (field, got, want))
    print("ok: capabilities (effective, permitted, bounding): %s" % " ".join(want))
else:
    print("note: capabilities not dropped to a fixed set; effective: %s" % names(int(status["CapEff"], 16)))
if status.get("NoNewPrivs") != ("1" if c["no_new_privs"] else "0"):
    bad.append("NoNewPrivs is %s" % status.get("NoNewPrivs"))
want_seccomp = "2" if c["seccomp"] in ("RuntimeDefault", "Localhost") else "0"
if status.get("Seccomp") != want_seccomp:
    bad.append("Seccomp is %s, want %s (%s)" % (status.get("Seccomp"), want_seccomp, c["seccomp"]))
print("ok: no_new_privs %s, seccomp %s (mode %s), uid %s" % (status.get("NoNewPrivs"), c["seccomp"],
      status.get("Seccomp"), status["Uid"].split()[0]))
mounts = {}
for line in open(proc + "/mountinfo"):
    f = line.split()
    mounts[f[4]] = f[5].split(",")
def ro(path):
    return "ro" in mounts.get(path, [])
if c["readonly_rootfs"] and not ro("/"):
    bad.append("the root filesystem is not read-only")
for m in c["mounts"]:
    if m["container_path"] not in mounts:
        bad.append("%s is not mounted" % m["container_path"])
    elif m["readonly"] != ro(m["container_path"]):
        bad.append("%s is %s, the manifest says readOnly: %s" % (m["container_path"],
                   "ro" if ro(m["container_path"]) else "rw", m["readonly"]))
    if m["readonly"] and m.get("recursive_read_only"):
        under = [p for p in mounts if p.startswith(m["container_path"].rstrip("/") + "/") and not ro(p)]
        if under:
            bad.append("recursive read-only %s has writable mounts below: %s" % (m["container_path"], under))
print("ok: root filesystem %s; mounts as the manifest says (%s)" % (
    "read-only" if ro("/") else "writable",
    ", ".join("%s %s" % (m["container_path"], ("ro, recursively" if m.get("recursive_read_only") else "ro")
                         if m["readonly"] else "rw") for m in c["mounts"])))
writable_below = [p for p in mounts if p.startswith("/sys/fs/cgroup/") and not ro(p)]
if writable_below:
    print("note: the runtime mounts /sys/fs/cgroup read-only but not recursively: %d hierarchies "
          "below it are writable in the container (deploy/README.md)" % len(writable_below))
for b in bad:
    print("FAIL: " + b)
sys.exit(1 if bad else 0)
PY

# --- kplegd --self-test inside the pod --------------------------------------------------------
# Its scratch cgroups go under the pod's own cgroup2 directory: writable by the container's root
# without CAP_DAC_OVERRIDE (a hierarchy's root directory is mode 0555), and the kubelet's to remove.
if [ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ]; then cg2=/sys/fs/cgroup; else cg2=/sys/fs/cgroup/unified; fi
[ "$(stat -f -c %T "$cg2" 2>/dev/null)" = cgroup2fs ] || fail "no cgroup2 hierarchy on this node"
[ -d "$cg2$pod_cgroup" ] || fail "the pod's cgroup $cg2$pod_cgroup does not exist"
selftest=(/usr/local/bin/kplegd --self-test "--cgroup-fs=$cg2$pod_cgroup")
if [ "$rro" != true ]; then
  out=$(cr exec "$cid" "${selftest[@]}" 2>&1) || { echo "$out"; fail "kplegd --self-test failed in the pod (crictl exec)"; }
  how="crictl exec in $cname"
else
  # The cgroup mount is recursively read-only in kplegd's container: the same container again,
  # with that one mount writable, running the self-test.
  jq --argjson a "$(printf '%s\n' "${selftest[@]:1}" | jq -R . | jq -s .)" '.args = $a' \
    "$tmp/cri/$cname-selftest.json" >"$tmp/cri/selftest.json"
  sid=$(cr create "$pod_id" "$tmp/cri/selftest.json" "$tmp/cri/sandbox.json") || fail "CreateContainer (self-test) failed"
  cr start "$sid" >/dev/null || fail "StartContainer (self-test) failed"
  deadline=$((SECONDS + 60))
  until [ "$(cr inspect "$sid" | jq -r .status.state)" = CONTAINER_EXITED ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "the self-test container did not finish within 60 s"
    sleep 0.2
  done
  out=$(sed 's/^[^ ]* [^ ]* [^ ]* //' "$(jq -r .log_directory "$facts")/$cname-selftest/0.log")
  [ "$(cr inspect "$sid" | jq -r .status.exitCode)" = 0 ] || { echo "$out"; fail "kplegd --self-test failed in the pod (self-test container)"; }
  how="a second container of the pod, cgroup mount writable"
fi
grep -q 'PASS' <<<"$out" || { echo "$out"; fail "kplegd --self-test did not say PASS"; }
echo "ok: kplegd --self-test passes in the pod ($how): $(grep PASS <<<"$out" | tail -n1)"

# --- a container started in another pod, reported over the API socket ---------------------------
api=$(jq -r '.volumes[] | select(.manifest_path == "/run/kpleg") | .host_path' "$facts")/kpleg.sock
[ -S "$api" ] || { dump; fail "kplegd made no API socket at the hostPath $api"; }
"$bin/kplegctl" --socket "$api" health >/dev/null || fail "kplegctl health over $api failed"
ns=kpleg-deploy-test
snapshot=$("$bin/kplegctl" --socket "$api" list -o json) || fail "kplegctl list over $api failed"
seq=$(jq -r .seq <<<"$snapshot")
instance=$(jq -r .instance_id <<<"$snapshot")
"$bin/kplegctl" --socket "$api" watch -o json --namespace "$ns" --from-seq "$seq" \
  --instance-id "$instance" >"$tmp/watch.out" 2>"$tmp/watch.err" &
watch_pid=$!
load_out=$("$bin/kpleg-load" --runtime-endpoint "$endpoint" run --namespace "$ns" --name-prefix pod-test \
  --log-root "$tmp/load-logs" --command "sleep 1000000") || fail "kpleg-load run failed"
load_pod=$(jq -r '.sandbox_id // empty' <<<"$load_out" | head -n1)
load_ctr=$(jq -r '.containers[0].container_id // empty' <<<"$load_out" | head -n1)
[ -n "$load_pod" ] && [ -n "$load_ctr" ] || fail "kpleg-load printed no sandbox or container id: $load_out"
deadline=$((SECONDS + 20))
until jq -e --arg id "$load_ctr" 'select(.type == "ContainerStarted" and .container_id == $id and .source == "kernel")' \
    "$tmp/watch.out" >/dev/null 2>&1; do
  kill -0 "$watch_pid" 2>/dev/null || { cat "$tmp/watch.err"; fail "kplegctl watch ended"; }
  [ "$SECONDS" -lt "$deadline" ] || { cat "$tmp/watch.out"; dump; fail "no kernel ContainerStarted for the pod in $ns within 20 s"; }
  sleep 0.1
done
ev=$(jq -c --arg id "$load_ctr" 'select(.type == "ContainerStarted" and .container_id == $id)' "$tmp/watch.out" | head -n1)
echo "ok: kplegd reported a container started in another pod: $(jq -r '"\(.pod_namespace)/\(.pod_name) \(.container_name) \(.type) source=\(.source)"' <<<"$ev")"

out=$(run_probe livenessProbe 2>&1) || { echo "$out"; dump; fail "the livenessProbe fails"; }
echo "ok: livenessProbe passes"
for path in /livez /readyz /healthz; do
  code=$(curl -s --max-time 5 -o /dev/null -w '%{http_code}' "http://${metrics%:*}:$port$path")
  [ "$code" = 200 ] || { dump; fail "$path on the metrics address answered $code"; }
done
echo "ok: /livez, /readyz and /healthz answer 200 on ${metrics%:*}:$port"
state=$(cr inspect "$cid" | jq -r .status.state)
[ "$state" = CONTAINER_RUNNING ] || { dump; fail "$cname is $state at the end"; }

echo "PASS: the DaemonSet's pod runs through the CRI with its least-privilege securityContext ($((SECONDS - start)) s)"
