#!/usr/bin/env bash
# End-to-end check of the test bed against the real containerd/runc: up, image present, a ctr
# container's exit status, pod sandboxes and containers through real CRI calls (crictl), an
# unclean stop, and a down that leaves no process, shim, socket, mount or cgroup behind.
# usage: scripts/testbed/selftest.sh [--cni]     (root)
# It runs its own test bed in a fresh directory (KPLEG_SELFTEST_DIR, default a new /tmp dir) with
# its own bridge and subnet, so the shared test bed of the CRI and end-to-end tests is not
# disturbed; it removes the directory when it passes.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TESTBED=$HERE/../testbed.sh
TB=${KPLEG_SELFTEST_DIR:-$(mktemp -d /tmp/kpleg-tb.XXXXXX)}
case $TB in /*) ;; *) TB=$PWD/$TB ;; esac
TB=${TB%/}
export KPLEG_TESTBED_DIR=$TB
export KPLEG_TESTBED_BRIDGE=kpleg-st0
export KPLEG_TESTBED_SUBNET=10.89.0.0/16
echo "selftest: test bed in $TB"
IMAGE=localhost/kpleg/busybox:1
CNI=0
[ "${1:-}" = --cni ] && CNI=1

passed=0 failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else fail "$what"; fi; }

# poll DEADLINE_S CMD...: true as soon as CMD succeeds, false after the deadline.
poll() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

up() {
  local line
  line=$("$TESTBED" up "$@") || return 1
  [[ $line == KPLEG_RUNTIME_ENDPOINT=unix://* && $line != *$'\n'* ]] ||
    { echo "up must print exactly one line KPLEG_RUNTIME_ENDPOINT=unix://..., got: $line"; return 1; }
  SOCK=${line#KPLEG_RUNTIME_ENDPOINT=unix://}
}

# The CRI client: crictl, as testbed.sh itself uses it ($KPLEG_CRICTL, or built by
# scripts/crictl.sh). Pod and container configs are JSON files (crictl runp/create read them).
if [ -n "${KPLEG_CRICTL:-}" ]; then
  CRICTL=$KPLEG_CRICTL
else
  CRICTL=$("$HERE/../crictl.sh")/crictl || { echo "selftest: no crictl (scripts/crictl.sh failed)"; exit 1; }
fi
crictl_() {
  "$CRICTL" --config /dev/null --runtime-endpoint "unix://$SOCK" --image-endpoint "unix://$SOCK" \
    --timeout 60s "$@"
}

# The test bed runs the runtime KPLEG_TESTBED_RUNTIME names; ctr must be the one that comes with it.
if [ "${KPLEG_TESTBED_RUNTIME:-containerd-1.6}" = containerd-2 ]; then
  PATH=$("$HERE/../runtimes.sh" bin containerd-2):$PATH
fi
echo "selftest: runtime ${KPLEG_TESTBED_RUNTIME:-containerd-1.6}, ctr $(command -v ctr), crictl $CRICTL"

# Writes the PodSandboxConfig of pod $1 (uid $2, network mode $3: 0 pod, 2 node) to
# $TB/pod-$1.json and prints its path.
pod_config() {
  local file=$TB/pod-$1.json
  # A host-network sandbox shares the host's UTS namespace: runc refuses to set a hostname there.
  jq -n --arg name "$1" --arg uid "$2" --argjson mode "$3" '{
      metadata: {name: $name, uid: $uid, namespace: "selftest"},
      linux: {
        cgroup_parent: "/kubepods/besteffort/pod\($uid)",
        security_context: {namespace_options: {network: $mode}}
      }
    } + (if $mode == 0 then {hostname: $name} else {} end)' >"$file" || return 1
  echo "$file"
}

run_pod() { # name uid mode -> sandbox id
  local cfg
  cfg=$(pod_config "$@") || return 1
  crictl_ runp "$cfg"
}

create_container() { # sandbox-id pod-name pod-uid mode name shell-command -> container id
  local pod cfg=$TB/container-$5.json
  pod=$(pod_config "$2" "$3" "$4") || return 1
  jq -n --arg name "$5" --arg image "$IMAGE" --arg cmd "$6" \
    '{metadata: {name: $name}, image: {image: $image}, command: ["/bin/sh", "-c", $cmd]}' >"$cfg" ||
    return 1
  crictl_ create --no-pull "$1" "$cfg" "$pod"
}

start_container() { crictl_ start "$1" >/dev/null; }

# Prints "STATE exit_code" (CONTAINER_CREATED, CONTAINER_RUNNING, CONTAINER_EXITED) from
# ContainerStatus.
container_state() {
  local out
  out=$(crictl_ inspect -o json "$1") || return 1
  jq -r '"\(.status.state) \(.status.exitCode // 0)"' <<<"$out"
}

exited_with() { [ "$(container_state "$1")" = "CONTAINER_EXITED $2" ]; }
running() { [ "$(container_state "$1")" = "CONTAINER_RUNNING 0" ]; }

pod_ip() {
  local out
  out=$(crictl_ inspectp -o json "$1") || return 1
  jq -er '.status.network.ip | select(. != "")' <<<"$out"
}

our_shims() {
  local d
  for d in /proc/[0-9]*; do
    tr '\0' ' ' 2>/dev/null <"$d/cmdline" | grep -q -- "-address $SOCK " && echo "${d#/proc/}"
  done
  return 0
}
no_shims() { [ -z "$(our_shims)" ]; }
no_containerd() {
  local d
  for d in /proc/[0-9]*; do
    tr '\0' ' ' 2>/dev/null <"$d/cmdline" | grep -q -- "containerd --config $TB/config.toml " && return 1
  done
  return 0
}
# Only the cgroups of this run's pods and ctr container: another runtime on the host may use
# /kubepods too.
POD_UIDS=()
no_cgroups() {
  local mnt left="" uid
  while read -r mnt; do
    for uid in "${POD_UIDS[@]}"; do
      [ -d "$mnt/kubepods/besteffort/pod$uid" ] && left+=" $mnt/kubepods/besteffort/pod$uid"
    done
    [ -d "$mnt/k8s.io/selftest-ctr" ] && left+=" $mnt/k8s.io/selftest-ctr"
  done < <(awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/self/mounts)
  [ -z "$left" ] || { echo "left:$left"; return 1; }
}
no_mounts() { ! awk -v tb="$TB/" 'index($5, tb) == 1' /proc/self/mountinfo | grep -q .; }
cgroup_exists() { [ -d "$1" ]; }
shim_sockets_gone() {
  local s
  for s in "${SHIM_SOCKETS[@]}"; do [ ! -e "$s" ] || return 1; done
}
# The sockets our shims listen on, from the kernel (socket inodes among their descriptors, looked
# up in their net/unix): containerd 1.6 and 2.x name them differently.
collect_shim_sockets() {
  local pid fd link inodes s
  SHIM_SOCKETS=()
  for pid in $(our_shims); do
    inodes=" "
    for fd in /proc/"$pid"/fd/*; do
      link=$(readlink "$fd" 2>/dev/null) || continue
      case $link in socket:\[*\]) inodes+="${link//[^0-9]/} " ;; esac
    done
    while read -r s; do
      SHIM_SOCKETS+=("$s")
    done < <(awk -v inodes="$inodes" '$6 == "01" && NF >= 8 && index(inodes, " " $7 " ") { print $8 }' \
      "/proc/$pid/net/unix")
  done
}

cleanup_checks() {
  check "containerd gone" poll 5 no_containerd
  check "shims gone" poll 5 no_shims
  check "shim sockets gone (${#SHIM_SOCKETS[@]} recorded)" shim_sockets_gone
  check "no pod or container cgroups left (${#POD_UIDS[@]} pods)" no_cgroups
  check "no mounts left under $TB" no_mounts
  check "status says down (exit 3)" bash -c "'$TESTBED' status >/dev/null; [ \$? -eq 3 ]"
}

"$TESTBED" down
check "down when not up exits 0 quietly" bash -c "[ -z \"\$('$TESTBED' down 2>&1)\" ]"

# --- host-network run ---
if ((CNI)); then check "up --cni" up --cni; else check "up" up; fi
[ -n "${SOCK:-}" ] || { echo "up failed; see $TB/containerd.log"; exit 1; }
check "up again is idempotent" bash -c "[ \"\$('$TESTBED' up 2>/dev/null)\" = 'KPLEG_RUNTIME_ENDPOINT=unix://$SOCK' ]"
check "status exits 0" "$TESTBED" status
images=$(ctr --address "$SOCK" -n k8s.io images ls -q)
check "image imported" grep -qxF "$IMAGE" <<<"$images"
plugins=$(ctr --address "$SOCK" plugins ls)
check "CRI plugin ok" test "$(awk '$1 == "io.containerd.grpc.v1" && $2 == "cri" { print $NF }' <<<"$plugins")" = ok

rc=0
ctr --address "$SOCK" -n k8s.io run --rm --runc-root "$TB/runc" "$IMAGE" selftest-ctr \
  /bin/sh -c 'exit 3' || rc=$?
check "ctr run exit status 3 (got $rc)" test "$rc" -eq 3

uid=aaaaaaaa-0000-4000-8000-$(printf %012d $$)

POD_UIDS+=("$uid")
sb=$(run_pod host-pod "$uid" 2) || true
check "RunPodSandbox (host network)" test -n "$sb"
if [ -n "$sb" ]; then
  check "pod cgroup created" cgroup_exists "/sys/fs/cgroup/unified/kubepods/besteffort/pod$uid/$sb"
  c1=$(create_container "$sb" host-pod "$uid" 2 exits 'exit 7') || true
  check "CreateContainer" test -n "$c1"
  check "StartContainer" start_container "$c1"
  check "container exits with 7 (ContainerStatus)" poll 10 exited_with "$c1" 7
  c2=$(create_container "$sb" host-pod "$uid" 2 sleeper 'exec sleep 1000') || true
  check "second container starts" start_container "$c2"
  check "second container running" poll 10 running "$c2"
fi

if ((CNI)); then
  uid2=bbbbbbbb-0000-4000-8000-$(printf %012d $$)
  POD_UIDS+=("$uid2")
  sb2=$(run_pod net-pod "$uid2" 0) || true
  check "RunPodSandbox (pod network)" test -n "$sb2"
  ip=$(pod_ip "$sb2" || true)
  check "pod got an address in $KPLEG_TESTBED_SUBNET ($ip)" test "${ip%.*.*}" = 10.89
fi

# Look-alikes of a foreign containerd and a foreign shim: down must leave them running.
DECOYS=()
stop_decoys() { ((${#DECOYS[@]} == 0)) || kill "${DECOYS[@]}" 2>/dev/null || true; }
trap stop_decoys EXIT
(exec -a containerd "$TB/image/rootfs/pause" --config /nonexistent/config.toml) &
DECOYS+=($!)
(exec -a containerd-shim-runc-v2 "$TB/image/rootfs/pause" -namespace k8s.io -id decoy \
  -address /nonexistent/containerd.sock) &
DECOYS+=($!)

collect_shim_sockets
check "down" "$TESTBED" down
cleanup_checks
check "processes the test bed did not start survive down" kill -0 "${DECOYS[@]}"
stop_decoys
DECOYS=()

# --- unclean stop: containerd killed with pods running, then down and up again ---
if check "up after down" up; then
  uid3=cccccccc-0000-4000-8000-$(printf %012d $$)
  POD_UIDS+=("$uid3")
  sb3=$(run_pod crash-pod "$uid3" 2) || true
  check "RunPodSandbox before the crash" test -n "$sb3"
  collect_shim_sockets
  kill -KILL "$(cat "$TB/containerd.pid")"
  check "containerd killed" poll 5 no_containerd
  check "status says down after the crash" bash -c "'$TESTBED' status >/dev/null; [ \$? -eq 3 ]"
  check "down after an unclean stop" "$TESTBED" down
  cleanup_checks
  check "up after an unclean stop" up
  check "down" "$TESTBED" down
  cleanup_checks
fi

# --- unclean stop, then up: the new containerd adopts the running pod ---
if check "up" up; then
  uid4=dddddddd-0000-4000-8000-$(printf %012d $$)
  POD_UIDS+=("$uid4")
  sb4=$(run_pod adopted-pod "$uid4" 2) || true
  c4=$(create_container "$sb4" adopted-pod "$uid4" 2 sleeper 'exec sleep 1000') || true
  if start_container "$c4" && poll 10 running "$c4"; then
    ok "container running before the crash"
  else
    fail "container running before the crash"
  fi
  collect_shim_sockets
  kill -KILL "$(cat "$TB/containerd.pid")"
  check "containerd killed" poll 5 no_containerd
  check "up with a stale PID file and socket" up
  check "container still running after the restart" poll 10 running "$c4"
  check "down" "$TESTBED" down
  cleanup_checks
fi

if ((CNI)); then
  check "bridge $KPLEG_TESTBED_BRIDGE removed" bash -c "! ip link show $KPLEG_TESTBED_BRIDGE >/dev/null 2>&1"
fi

echo "selftest: $passed passed, $failed failed"
if [ "$failed" -eq 0 ] && [ -z "${KPLEG_SELFTEST_DIR:-}" ]; then
  "$TESTBED" down
  rm -rf "$TB"
fi
[ "$failed" -eq 0 ]
