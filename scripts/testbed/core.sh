# shellcheck shell=bash disable=SC2034,SC2153  # variables shared with testbed.sh and its other parts
# The test bed's shared core, sourced by scripts/testbed.sh: paths, the runtime choice, packages,
# crictl, the daemon's process (start, readiness, stop) and the teardown steps every runtime
# needs. What differs per runtime is in containerd.sh and crio.sh, called through rt.

log() { echo "testbed: $*" >&2; }
die() { echo "testbed: error: $*" >&2; exit 1; }

need_root() { [ "$(id -u)" -eq 0 ] || die "must run as root (containerd, runc and cgroups need it)"; }

# rt STEP ARGS...: the selected runtime family's STEP (containerd_STEP or crio_STEP).
rt() { "${FAMILY}_$1" "${@:2}"; }

# The paths every runtime shares, and containerd's (crio_paths replaces the daemon's own).
set_paths() {
  case $TB in /*) ;; *) TB=$PWD/$TB ;; esac
  TB=${TB%/}
  CONFIG=$TB/config.toml
  SOCK=$TB/containerd.sock
  PIDFILE=$TB/containerd.pid
  LOGFILE=$TB/containerd.log
  MODEFILE=$TB/mode
  SHIMFILE=$TB/shims
  RUNC_ROOT=$TB/runc
  CNI_CONF_DIR=$TB/cni/net.d
  IMAGE_DIR=$TB/image
  RUNTIMEFILE=$TB/runtime
  HOOKED_SPEC=$TB/hooked-spec.json
  ENDPOINT=unix://$SOCK
  DAEMON_ARGS=(--config "$CONFIG" --log-level info)
  # sun_path holds 108 bytes; containerd fails later with a confusing bind error otherwise.
  [ "${#SOCK}" -lt 100 ] || die "socket path too long (${#SOCK} bytes): $SOCK; set a shorter KPLEG_TESTBED_DIR"
}

valid_runtime() {
  local r
  for r in "${RUNTIMES[@]}"; do [ "$1" = "$r" ] && return 0; done
  return 1
}

# The runtime this test bed was last brought up with (recorded by 'up', removed by 'down').
recorded_runtime() {
  local r
  r=$(sed -n 1p "$RUNTIMEFILE" 2>/dev/null || true)
  echo "${r:-$DEFAULT_RUNTIME}"
}

root_dir_of() {
  case $1 in
    containerd-1.6) echo "$TB/root" ;;
    crio) echo "$TB/crio/storage" ;;
    *) echo "$TB/root-$1" ;;
  esac
}

# runtime_bin NAME PROGRAM BUILD: the bin dir of NAME (scripts/runtimes.sh, which builds it once).
# With BUILD=0 (down, status) the one 'up' recorded, when PROGRAM is still there.
runtime_bin() {
  local bin
  if (($3)); then
    "$REPO/scripts/runtimes.sh" bin "$1" || die "building $1 failed"
    return
  fi
  bin=$(sed -n 2p "$RUNTIMEFILE" 2>/dev/null || true)
  [ -x "$bin/$2" ] || bin=$("$REPO/scripts/runtimes.sh" bin "$1") ||
    die "$1 binaries missing; cannot act on this test bed"
  echo "$bin"
}

# Selects the binaries, root and paths of runtime $1. containerd 2.x gets a root of its own: its
# metadata schema is newer than 1.6's, and a root it has upgraded is not one 1.6 should open.
# With build=0 (down, status) the binaries must already be in the cache.
use_runtime() {
  local build=${2:-1} bin
  RUNTIME=$1
  ROOT_DIR=$(root_dir_of "$RUNTIME")
  case $RUNTIME in
    containerd-1.6)
      FAMILY=containerd CONTAINERD=containerd CTR=ctr
      ;;
    containerd-2)
      bin=$(runtime_bin containerd-2 containerd "$build")
      FAMILY=containerd CONTAINERD=$bin/containerd CTR=$bin/ctr
      # containerd looks its shim up on PATH before its own directory: without this it would
      # start Debian's 1.6 containerd-shim-runc-v2.
      export PATH=$bin:$PATH
      ;;
    crio)
      # runtimes.sh only names missing build packages; install them as install-deps would.
      ((build == 0)) || install_packages gcc libc6-dev pkg-config libseccomp-dev
      bin=$(runtime_bin crio crio "$build")
      FAMILY=crio CONTAINERD=$bin/crio CTR=""
      crio_paths "$bin"
      ;;
    *) die "unknown runtime '$RUNTIME' (one of: ${RUNTIMES[*]})" ;;
  esac
}

# --- packages -------------------------------------------------------------------------------

ensure_packages() {
  local want=(runc busybox-static gcc libc6-dev jq curl)
  [ "$RUNTIME" = containerd-1.6 ] && want+=(containerd)
  [ "$RUNTIME" = crio ] && want+=(conmon skopeo util-linux)
  [ "${1:-}" = cni ] && want+=(containernetworking-plugins iproute2)
  install_packages "${want[@]}"
}

# install_packages PKG...: apt-get install those of PKG that are not installed.
install_packages() {
  local missing=() p
  for p in "$@"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" = "install ok installed" ] || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
    apt-get update -qq >&2 || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
      die "apt-get install ${missing[*]} failed"
  fi
}

# --- crictl ---------------------------------------------------------------------------------

# The test bed's CRI calls go through crictl, the CRI client users type: $KPLEG_CRICTL, or the one
# scripts/crictl.sh builds (pinned by tools/crictl; once, then from its cache).
find_crictl() {
  local bin
  [ -n "$CRICTL" ] && return 0
  if [ -n "${KPLEG_CRICTL:-}" ]; then
    [ -x "$KPLEG_CRICTL" ] || { log "KPLEG_CRICTL=$KPLEG_CRICTL is not executable"; return 1; }
    CRICTL=$KPLEG_CRICTL
  else
    bin=$("$REPO/scripts/crictl.sh") || return 1
    CRICTL=$bin/crictl
  fi
}

# crictl_ TIMEOUT ARGS...: crictl against this test bed. --config /dev/null: no /etc/crictl.yaml of
# the host applies (nor does crictl warn that it is missing). The timeout bounds the connection
# and the call.
crictl_() {
  local timeout=$1
  shift
  "$CRICTL" --config /dev/null --runtime-endpoint "$ENDPOINT" --image-endpoint "$ENDPOINT" \
    --timeout "$timeout" "$@"
}

# A real CRI Version call (crictl version): containerd's CRI plugin registers before it has
# finished initialising and answers "server is not initialized yet" until then. Prints
# "<runtime> <version> (CRI <api version>)".
cri_version() {
  local out
  find_crictl || return 1
  out=$(crictl_ 3s version) || return 1
  awk '$1 == "RuntimeName:" { n = $2 } $1 == "RuntimeVersion:" { v = $2 }
    $1 == "RuntimeApiVersion:" { a = $2 } END { printf "%s %s (CRI %s)\n", n, v, a }' <<<"$out"
}

kpleg_load() {
  local bin=${KPLEG_LOAD:-$REPO/build/bin/kpleg-load} help args=()
  [ -x "$bin" ] || return 2
  help=$("$bin" --help 2>&1 || true)
  if grep -q -- '--runtime-endpoint' <<<"$help"; then
    args=(--runtime-endpoint "$ENDPOINT")
  elif grep -q -- '--endpoint' <<<"$help"; then
    args=(--endpoint "$ENDPOINT")
  fi
  KPLEG_RUNTIME_ENDPOINT=$ENDPOINT timeout 10 "$bin" "${args[@]}" "$@"
}

# --- the daemon's process -------------------------------------------------------------------

cmdline_of() { tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" || true; }

# Our daemon is the one started with our config file; PIDs alone can be reused. A CRI-O started
# with the test bed's crio.conf is ours too, whichever runtime this command selected: then 'up'
# with another runtime sees that the bed is up and refuses.
is_our_daemon() {
  local cmd
  cmd=$(cmdline_of "$1")
  [[ $cmd == *containerd\ --config\ "$TB/config.toml"\ * ]] ||
    [[ $cmd == *crio\ --config\ "$TB/crio.conf"\ * ]]
}

# Prints the PID of this test bed's daemon, or nothing. Falls back to a /proc scan so a lost PID
# file does not leave an orphan that nothing can stop.
daemon_pid() {
  local pid=""
  if [ -f "$PIDFILE" ]; then
    pid=$(tr -dc 0-9 <"$PIDFILE")
    if [ -n "$pid" ] && is_our_daemon "$pid"; then
      echo "$pid"
      return 0
    fi
  fi
  for pid in /proc/[0-9]*; do
    pid=${pid#/proc/}
    if is_our_daemon "$pid"; then
      # Only a daemon of the selected runtime goes into its PID file.
      [[ $(cmdline_of "$pid") != *\ --config\ "$CONFIG"\ * ]] || echo "$pid" 2>/dev/null >"$PIDFILE" || true
      echo "$pid"
      return 0
    fi
  done
}

start_daemon() {
  local pid
  if [ -e "$SOCK" ]; then
    # Only stale if nothing answers on it: a daemon of this test bed in another PID namespace
    # would be invisible to daemon_pid but still own it.
    if curl -s --max-time 2 --unix-socket "$SOCK" http://localhost/ -o /dev/null 2>/dev/null ||
        [ $? -ne 7 ]; then
      die "something is serving on $SOCK but it is not a $DAEMON of this test bed; not starting a second one"
    fi
    log "removing stale socket $SOCK"
    rm -f "$SOCK"
  fi
  rm -f "$SOCK.ttrpc"
  [ -f "$LOGFILE" ] && mv -f "$LOGFILE" "$LOGFILE.1"
  # setsid + closed descriptors: the daemon must not hold the caller's pipes open (a caller doing
  # $(testbed.sh up) would otherwise wait forever) nor die with the caller's session.
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-"
    done
    exec nohup setsid "$CONTAINERD" "${DAEMON_ARGS[@]}" </dev/null >>"$LOGFILE" 2>&1
  ) &
  pid=$!
  echo "$pid" >"$PIDFILE"
  log "$DAEMON started, pid $pid, log $LOGFILE"
}

# Ready: the socket is there, the runtime's own check passes (containerd: its CRI plugin is ok)
# and a CRI Version call answers.
wait_ready() {
  local pid=$1 deadline=$((SECONDS + READY_TIMEOUT_S)) why="" found rc=0 out
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      # setsid forks when it is a process group leader: then the PID we noted is not the daemon's.
      found=$(daemon_pid)
      if [ -n "$found" ] && [ "$found" != "$pid" ]; then
        pid=$found
        continue
      fi
      log "$DAEMON (pid $pid) exited during start; last log lines:"
      tail -n 20 "$LOGFILE" >&2 || true
      rm -f "$PIDFILE"
      die "$DAEMON failed to start"
    fi
    if [ ! -S "$SOCK" ]; then
      why="socket $SOCK not there yet"
    elif ! rt ready; then
      why="CRI plugin io.containerd.grpc.v1.cri not ok in 'ctr plugins ls'"
    elif ! cri_version >/dev/null 2>"$TB/.probe"; then
      why="CRI Version: $(cat "$TB/.probe")"
    else
      break
    fi
    if ((SECONDS >= deadline)); then
      log "not ready after ${READY_TIMEOUT_S}s: $why; last log lines:"
      tail -n 20 "$LOGFILE" >&2 || true
      die "$DAEMON (pid $pid) did not become ready within ${READY_TIMEOUT_S}s"
    fi
    sleep 0.2
  done
  rm -f "$TB/.probe"
  out=$(kpleg_load version 2>&1) || rc=$?
  case $rc in
    0) log "kpleg-load version: $(head -n1 <<<"$out")" ;;
    2) ;;
    *) log "warning: ${KPLEG_LOAD:-build/bin/kpleg-load} version failed (exit $rc): $(head -n3 <<<"$out")" ;;
  esac
}

# Starts the daemon and waits for it; one that never becomes ready is stopped again, so it cannot
# sit on the metadata database and block the next attempt.
start_and_wait() {
  local pid
  start_daemon
  pid=$(cat "$PIDFILE")
  if ! (wait_ready "$pid"); then
    pid=$(daemon_pid)
    if [ -n "$pid" ]; then
      log "stopping the $DAEMON that did not become ready (pid $pid)"
      stop_daemon "$pid"
    fi
    rm -f "$PIDFILE"
    die "$DAEMON did not become ready; see $LOGFILE.1 and $LOGFILE"
  fi
  daemon_pid >/dev/null
}

# A running daemon whose socket file was removed cannot be reached by anyone: restart it on the
# same state (it reattaches to its shims, so pods survive).
repair_socket() {
  local pid=$1
  [ -S "$SOCK" ] && return 0
  log "$DAEMON (pid $pid) has lost its socket $SOCK; restarting it"
  stop_daemon "$pid"
  start_and_wait
}

stop_daemon() {
  local pid=$1 deadline timeout=$DAEMON_STOP_TIMEOUT_S
  kill -TERM "$pid" 2>/dev/null || return 0
  deadline=$((SECONDS + timeout))
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      log "$DAEMON (pid $pid) ignored SIGTERM for ${timeout}s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      deadline=$((SECONDS + 5))
      while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
      break
    fi
    sleep 0.1
  done
  # Zombie if it was our child; otherwise gone.
  wait "$pid" 2>/dev/null || true
}

# Every step that starts, stops or removes anything runs under this lock, so concurrent callers
# (parallel tests) never start a second daemon on the same state or remove a live socket.
take_lock() {
  exec {TB_LOCK_FD}>"$TB/.lock"
  flock -w 120 "$TB_LOCK_FD" || die "another testbed.sh held $TB/.lock for 120 s"
}

# --- teardown -------------------------------------------------------------------------------

# Shims (conmons) exit on their own once their tasks are deleted. One that outlives the deadline
# belongs to this test bed (rt shims matches it on our socket or exit dir), so stopping it cannot
# hit anyone else's work.
wait_shims_gone() {
  local deadline=$((SECONDS + STOP_TIMEOUT_S)) left
  while :; do
    left=$(rt shims | cut -d' ' -f1 | tr '\n' ' ')
    [ -z "${left// /}" ] && return 0
    if ((SECONDS >= deadline)); then
      log "warning: shims still running after ${STOP_TIMEOUT_S}s (pids $left); sending SIGKILL"
      # shellcheck disable=SC2086
      kill -KILL $left 2>/dev/null || true
      sleep 0.5
      return 0
    fi
    sleep 0.1
  done
}

# Mounts left under the test bed (rootfs overlays, netns and shm bind mounts of a sandbox that
# could not be removed through CRI), deepest first.
our_mounts() { awk -v tb="$TB/" 'index($5, tb) == 1 { print $5 }' /proc/self/mountinfo; }

unmount_leftovers() {
  local m
  our_mounts | sort -r |
    while read -r m; do
      m=$(printf '%b' "$m")
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "warning: cannot unmount $m"
    done
}

# runc removes container cgroups but not the pod-level parents the kubelet would remove; drop
# every empty directory under kubepods/, k8s.io/ and kpleg-crio/ in each hierarchy, children
# first. rmdir fails on a cgroup that still has processes or children, so nothing in use is
# touched.
remove_cgroups() {
  local mnt top left=""
  while read -r mnt; do
    for top in kubepods k8s.io kpleg-crio; do
      [ -d "$mnt/$top" ] || continue
      find "$mnt/$top" -depth -type d -exec rmdir {} \; 2>/dev/null || true
      [ -d "$mnt/$top" ] && [ -z "$left" ] && left=$(find "$mnt/$top" -depth -mindepth 1 -type d | head -n3 | tr '\n' ' ')
    done
  done < <(awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/self/mounts)
  # Another runtime on the host may have pods there too; they are not ours to remove.
  [ -z "$left" ] || log "cgroups still in use under kubepods/, k8s.io/ or kpleg-crio/ (not ours or not empty): $left"
  return 0
}

remove_network() {
  [ "$(cat "$MODEFILE" 2>/dev/null)" = cni ] || return 0
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link delete "$BRIDGE" || log "warning: cannot delete bridge $BRIDGE"
  fi
  # libcni's result cache; the CRI plugin of containerd 1.6 cannot move it. Empty once every
  # sandbox was removed through CRI.
  rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null || true
}
