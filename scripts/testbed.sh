#!/usr/bin/env bash
# The local CRI runtime test bed: a private containerd (or CRI-O) + runc that kpleg's CRI, daemon
# and end-to-end tests talk to over a real CRI socket, with no registry and no systemd. This file
# holds the commands; scripts/testbed/ the shared core (core.sh), each runtime's steps
# (containerd.sh, crio.sh) and the image (image.sh). docs/testbed.md describes them.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/testbed.sh up [--cni] [--runtime containerd-1.6|containerd-2|crio] | down | status

  up      Install containerd/runc if missing, build the local image, start a private containerd
          and print one line on stdout:  KPLEG_RUNTIME_ENDPOINT=unix://<socket>
          (so `eval "$(scripts/testbed.sh up)"` sets it). Running it again while up only prints
          the endpoint again.
          Without --cni only host-network pod sandboxes run (NamespaceOption network = NODE);
          a pod-network sandbox fails with "cni config not initialized".
  --runtime NAME
          containerd-1.6 (default): Debian 12's containerd 1.6 and runc.
          containerd-2: containerd 2.x built by scripts/runtimes.sh (pinned, from the Go module
          proxy, cached outside the tree) with Debian's runc.
          crio: CRI-O built by scripts/runtimes.sh (pinned by tools/crio, cached outside the
          tree) with Debian's conmon and runc (through tools/crio/runc-restrict-oom); config,
          storage and socket (crio.sock) under the test bed's directory, image imported with
          skopeo. No --cni and no runc-hooked handler (containerd only); a pod-network sandbox
          does not fail at once but waits for a CNI config until the call's deadline.
          'up' with one runtime while the test bed is up with another fails; run 'down' first.
  --cni   Also give pods a network: a bridge (kpleg0) with host-local addresses from
          KPLEG_TESTBED_SUBNET (default 10.88.0.0/16), reachable only from this host; pods get
          no default route.
  down    Remove every pod sandbox and container, stop containerd and its shims, remove the
          pod cgroups, mounts and shim sockets they left. Exits 0 when nothing was up.
          CRI-O gets 10 s after SIGTERM (its graceful stop waits for open GetContainerEvents
          streams), then SIGKILL; its conmons take the place of shims.
  status  Print state, PID and endpoint; exit 0 when up, 3 when not.

environment:
  KPLEG_TESTBED_DIR     where everything lives (default <repo>/.testbed)
  KPLEG_TESTBED_RUNTIME runtime for 'up' when --runtime is not given (default containerd-1.6);
                        'down' and 'status' act on whichever runtime is up
  KPLEG_RUNTIMES_CACHE  where scripts/runtimes.sh keeps the runtimes it builds
  KPLEG_TESTBED_SUBNET  pod subnet for --cni (default 10.88.0.0/16)
  KPLEG_TESTBED_BRIDGE  host bridge for --cni (default kpleg0)
  KPLEG_LOAD            CRI client used for an extra Version check when present
                        (default <repo>/build/bin/kpleg-load)
  KPLEG_CRICTL          crictl for the test bed's own CRI calls (Version, StopPodSandbox,
                        RemovePodSandbox); default: built once by scripts/crictl.sh (Go and the
                        Go module proxy the first time, then cached)

The image localhost/kpleg/busybox:1 (busybox applets in /bin, a pause binary at /pause, default
command /pause) is the sandbox image and the image for test containers; nothing is ever pulled.
EOF
}

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HERE=$REPO/scripts/testbed
TB=${KPLEG_TESTBED_DIR:-$REPO/.testbed}
SUBNET=${KPLEG_TESTBED_SUBNET:-10.88.0.0/16}
IMAGE=localhost/kpleg/busybox:1
BRIDGE=${KPLEG_TESTBED_BRIDGE:-kpleg0}
NS=k8s.io
IMAGE_REBUILT=0
READY_TIMEOUT_S=30
RUNTIMES=(containerd-1.6 containerd-2 crio)
DEFAULT_RUNTIME=containerd-1.6
STOP_TIMEOUT_S=20
CRIO_STOP_TIMEOUT_S=10

# The selected runtime (use_runtime): its name, its family (the prefix of the steps rt runs:
# containerd_* in testbed/containerd.sh, crio_* in testbed/crio.sh), its daemon's binary (the
# variable keeps containerd's name for CRI-O's too) and ctr, and its root. Before use_runtime
# ('down' as non-root, 'status') containerd's paths apply.
RUNTIME=""
FAMILY=containerd
CONTAINERD=containerd
CTR=ctr
ROOT_DIR=""
DAEMON_ARGS=()
# The daemon's name in messages, and how long it gets after SIGTERM.
DAEMON=containerd
DAEMON_STOP_TIMEOUT_S=$STOP_TIMEOUT_S
# CRI-O's own directories (crio_paths).
CRIO_DIR=""
CRIO_BIN=""
CRICTL=""

# shellcheck source=scripts/testbed/core.sh
. "$HERE/core.sh"
# shellcheck source=scripts/testbed/containerd.sh
. "$HERE/containerd.sh"
# shellcheck source=scripts/testbed/crio.sh
. "$HERE/crio.sh"
# shellcheck source=scripts/testbed/image.sh
. "$HERE/image.sh"

cmd_up() {
  local mode=hostnet pid runtime=${KPLEG_TESTBED_RUNTIME:-$DEFAULT_RUNTIME} recorded
  while [ $# -gt 0 ]; do
    case $1 in
      --cni) mode=cni ;;
      --runtime) [ $# -ge 2 ] || die "--runtime needs a value (${RUNTIMES[*]})"; runtime=$2; shift ;;
      --runtime=*) runtime=${1#--runtime=} ;;
      -h | --help) usage; exit 0 ;;
      *) die "unknown option for up: $1 (usage: testbed.sh up [--cni] [--runtime NAME] | down | status)" ;;
    esac
    shift
  done
  valid_runtime "$runtime" || die "unknown runtime '$runtime' (one of: ${RUNTIMES[*]})"
  [ "$runtime" != crio ] || [ "$mode" != cni ] || die "--cni is not supported with --runtime crio yet"
  need_root
  mkdir -p "$TB"
  # Built (once, minutes) before taking the lock, so other callers are not kept waiting on it.
  use_runtime "$runtime"
  find_crictl || die "no crictl, which 'up' needs for its CRI readiness check (scripts/crictl.sh builds it; or set KPLEG_CRICTL)"
  take_lock

  # One runtime at a time: a daemon, shims or mounts of the other one still belong to it, and
  # only its own 'down' can remove them.
  recorded=$(recorded_runtime)
  if [ "$recorded" != "$runtime" ] &&
      { [ -n "$(daemon_pid)" ] || [ -n "$(rt shims)" ] || [ -n "$(our_mounts)" ]; }; then
    die "the test bed in $TB is up with $recorded; run 'testbed.sh down' first, then 'up --runtime $runtime'"
  fi

  ensure_packages "$mode"
  rt check
  [ -x "$(command -v "$CONTAINERD")" ] || die "$CONTAINERD not found"
  [ "$mode" != cni ] || [ -x /usr/lib/cni/bridge ] || die "/usr/lib/cni/bridge missing (containernetworking-plugins)"

  pid=$(daemon_pid)
  if [ -n "$pid" ]; then
    if [ "$mode" = cni ] && [ "$(cat "$MODEFILE" 2>/dev/null)" != cni ]; then
      die "already up without pod networking (pid $pid); run 'testbed.sh down' first, then 'up --cni'"
    fi
    repair_socket "$pid"
    wait_ready "$(daemon_pid)"
    # Repairs a bed whose first 'up' failed half way, or picks up a changed pause.c.
    build_image
    if ((IMAGE_REBUILT)) || ! rt has_image; then
      rt import_image
      rt has_image || die "$IMAGE imported but $DAEMON does not list it"
    fi
    echo "KPLEG_RUNTIME_ENDPOINT=$ENDPOINT"
    return 0
  fi
  if [ -f "$PIDFILE" ]; then
    log "stale PID file from an unclean stop; starting afresh"
    rm -f "$PIDFILE"
  fi

  build_image
  printf '%s\n%s\n' "$RUNTIME" "$(dirname "$(command -v "$CONTAINERD")")" >"$RUNTIMEFILE"
  rt write_config "$mode"
  rt start
  rt record_shims
  log "up: $(cri_version 2>/dev/null || echo CRI), image $IMAGE, pod network: $([ "$mode" = cni ] && echo "$BRIDGE $SUBNET" || echo "host only")"
  echo "KPLEG_RUNTIME_ENDPOINT=$ENDPOINT"
}

cmd_down() {
  local pid restarted=0
  [ $# -eq 0 ] || die "down takes no options"
  [ -d "$TB" ] || return 0
  if [ "$(id -u)" -ne 0 ]; then
    [ -z "$(daemon_pid)" ] && [ -z "$(rt shims)" ] && return 0
    need_root
  fi
  # Before the lock, as in 'up': the first build takes a while. Without crictl, down still stops
  # everything, through ctr (containerd_remove_workloads).
  find_crictl || log "warning: no crictl; down removes sandboxes through ctr only"
  take_lock
  use_runtime "$(recorded_runtime)" 0
  pid=$(daemon_pid)
  if [ -z "$pid" ] && [ -z "$(rt shims)" ] && [ -z "$(our_mounts)" ]; then
    # Nothing of ours runs and no 'up' is half way (it would hold the lock): stale files only.
    rm -f "$PIDFILE" "$SOCK" "$SOCK.ttrpc" "$RUNTIMEFILE"
    unmount_hugetlb_v1
    return 0
  fi
  if [ -z "$pid" ]; then
    # The daemon died but its shims (and their containers) or mounts live on: a daemon on the
    # same state reconnects to them, and then they can be removed the normal way.
    log "$DAEMON is gone but its shims (conmons) or mounts are not; restarting it to clean up"
    [ -f "$CONFIG" ] || die "$CONFIG missing; cannot reconnect to the shims of this test bed"
    start_and_wait
    pid=$(daemon_pid)
    restarted=1
  else
    repair_socket "$pid"
    pid=$(daemon_pid)
  fi
  log "stopping ($DAEMON pid $pid)"
  rt record_shims
  rt remove_workloads
  rt record_shims
  stop_daemon "$pid"
  # More than one only after an earlier version of this script raced with itself.
  for _ in 1 2 3; do
    pid=$(daemon_pid)
    [ -n "$pid" ] || break
    log "stopping another $DAEMON on this test bed (pid $pid)"
    stop_daemon "$pid"
  done
  wait_shims_gone
  remove_shim_sockets
  unmount_leftovers
  remove_cgroups
  unmount_hugetlb_v1
  remove_network
  rm -rf "$TB/state" "$RUNC_ROOT" "$TB/runc-v1" "$TB/cni/ipam"
  rt cleanup
  rm -f "$PIDFILE" "$SOCK" "$SOCK.ttrpc" "$RUNTIMEFILE"
  ((restarted == 0)) || log "cleaned up after an unclean stop"
  log "down"
}

cmd_status() {
  local pid ver
  [ $# -eq 0 ] || die "status takes no options"
  pid=""
  if [ "$(recorded_runtime)" = crio ]; then
    RUNTIME=crio FAMILY=crio
    crio_paths "$(sed -n 2p "$RUNTIMEFILE" 2>/dev/null)"
  fi
  [ -d "$TB" ] && pid=$(daemon_pid 2>/dev/null)
  if [ -z "$pid" ]; then
    echo "state: down"
    echo "dir: $TB"
    exit 3
  fi
  if ! find_crictl 2>/dev/null; then
    ver="unknown (no crictl: scripts/crictl.sh could not build it)"
  elif ! ver=$(cri_version 2>&1); then
    ver="not answering: $ver"
  fi
  echo "state: up"
  echo "pid: $pid"
  echo "endpoint: $ENDPOINT"
  echo "runtime: $ver"
  echo "testbed runtime: $(recorded_runtime) ($(sed -n 2p "$RUNTIMEFILE" 2>/dev/null || echo "containerd on PATH"))"
  echo "root: $(root_dir_of "$(recorded_runtime)")"
  echo "pod network: $([ "$(cat "$MODEFILE" 2>/dev/null)" = cni ] && echo "$BRIDGE $SUBNET" || echo "host only")"
  echo "dir: $TB"
  echo "log: $LOGFILE"
}

main() {
  local cmd=${1:-}
  [ $# -gt 0 ] && shift
  set_paths
  case $cmd in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status "$@" ;;
    -h | --help | help) usage ;;
    "") usage >&2; exit 2 ;;
    *) die "unknown command: $cmd (usage: testbed.sh up [--cni] [--runtime NAME] | down | status)" ;;
  esac
}

main "$@"
