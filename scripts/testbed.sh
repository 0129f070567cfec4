#!/usr/bin/env bash
# The local CRI runtime test bed: a private containerd + runc that kpleg's CRI, daemon and
# end-to-end tests talk to over a real CRI socket, with no registry and no systemd.
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
# CRI-O's graceful stop waits for every open GetContainerEvents stream (kplegd, crictl events)
# and then may panic: it gets this long after SIGTERM, then SIGKILL.
CRIO_STOP_TIMEOUT_S=10

log() { echo "testbed: $*" >&2; }
die() { echo "testbed: error: $*" >&2; exit 1; }

need_root() { [ "$(id -u)" -eq 0 ] || die "must run as root (containerd, runc and cgroups need it)"; }

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

# The runtime's binaries, set by use_runtime: containerd 1.6 from Debian, or containerd 2.x from
# the cache of scripts/runtimes.sh. ctr comes with the containerd it talks to.
RUNTIME=""
CONTAINERD=containerd
CTR=ctr
ROOT_DIR=""
DAEMON_ARGS=()
# The daemon's name in messages.
DAEMON=containerd
# CRI-O's own directories (crio_paths).
CRIO_DIR=""

ctr_() { "$CTR" --address "$SOCK" "$@"; }

# The test bed's CRI calls go through crictl, the CRI client users type: $KPLEG_CRICTL, or the one
# scripts/crictl.sh builds (pinned by tools/crictl; once, then from its cache).
CRICTL=""
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

# Selects the binaries and root of runtime $1. containerd 2.x gets a root of its own: its
# metadata schema is newer than 1.6's, and a root it has upgraded is not one 1.6 should open.
# With build=0 (down, status) the containerd-2 binaries must already be in the cache.
use_runtime() {
  local build=${2:-1} bin
  RUNTIME=$1
  case $RUNTIME in
    containerd-1.6)
      CONTAINERD=containerd
      CTR=ctr
      ROOT_DIR=$(root_dir_of containerd-1.6)
      ;;
    containerd-2)
      if ((build)); then
        bin=$("$REPO/scripts/runtimes.sh" bin containerd-2) || die "building containerd 2.x failed"
      else
        bin=$(sed -n 2p "$RUNTIMEFILE" 2>/dev/null || true)
        [ -x "$bin/containerd" ] || bin=$("$REPO/scripts/runtimes.sh" bin containerd-2) ||
          die "containerd 2.x binaries missing; cannot act on this test bed"
      fi
      CONTAINERD=$bin/containerd
      CTR=$bin/ctr
      ROOT_DIR=$(root_dir_of containerd-2)
      # containerd looks its shim up on PATH before its own directory: without this it would
      # start Debian's 1.6 containerd-shim-runc-v2.
      export PATH=$bin:$PATH
      ;;
    crio)
      if ((build)); then
        # runtimes.sh only names missing build packages; install them as install-deps would.
        install_packages gcc libc6-dev pkg-config libseccomp-dev
        bin=$("$REPO/scripts/runtimes.sh" bin crio) || die "building CRI-O failed"
      else
        bin=$(sed -n 2p "$RUNTIMEFILE" 2>/dev/null || true)
        [ -x "$bin/crio" ] || bin=$("$REPO/scripts/runtimes.sh" bin crio) ||
          die "CRI-O binaries missing; cannot act on this test bed"
      fi
      CONTAINERD=$bin/crio
      CTR=""
      ROOT_DIR=$(root_dir_of crio)
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

# --- processes ------------------------------------------------------------------------------

cmdline_of() { tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" || true; }

# Our containerd is the one started with our config file; PIDs alone can be reused. A CRI-O
# started with the test bed's crio.conf is ours too, whichever runtime this command selected:
# then 'up' with another runtime sees that the bed is up and refuses.
is_our_containerd() {
  local cmd
  cmd=$(cmdline_of "$1")
  [[ $cmd == *containerd\ --config\ "$TB/config.toml"\ * ]] ||
    [[ $cmd == *crio\ --config\ "$TB/crio.conf"\ * ]]
}

# Prints the PID of this test bed's containerd, or nothing. Falls back to a /proc scan so a lost
# PID file does not leave an orphan that nothing can stop.
containerd_pid() {
  local pid=""
  if [ -f "$PIDFILE" ]; then
    pid=$(tr -dc 0-9 <"$PIDFILE")
    if [ -n "$pid" ] && is_our_containerd "$pid"; then
      echo "$pid"
      return 0
    fi
  fi
  for pid in /proc/[0-9]*; do
    pid=${pid#/proc/}
    if is_our_containerd "$pid"; then
      # Only a daemon of the selected runtime goes into its PID file.
      [[ $(cmdline_of "$pid") != *\ --config\ "$CONFIG"\ * ]] || echo "$pid" 2>/dev/null >"$PIDFILE" || true
      echo "$pid"
      return 0
    fi
  done
}

# Shims of this test bed: containerd-shim-runc-v2 processes whose -address is our socket.
# Prints "pid namespace id" lines.
our_shims() {
  local d pid ns id addr arg prev
  if [ "$RUNTIME" = crio ]; then
    our_conmons
    return 0
  fi
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    [ -r "$d/cmdline" ] || continue
    ns="" id="" addr="" prev=""
    while IFS= read -r -d '' arg; do
      case $prev in
        -namespace) ns=$arg ;;
        -id) id=$arg ;;
        -address) addr=$arg ;;
      esac
      prev=$arg
    done 2>/dev/null <"$d/cmdline" || continue
    [ "$addr" = "$SOCK" ] && [ -n "$id" ] && echo "$pid $ns $id"
  done
  return 0
}

# The unix sockets shim $1 listens on, read from the kernel rather than derived from a naming
# rule (containerd 1.6 uses /run/containerd/s/sha256(address/ns/id); 2.x hashes a grouping id and
# may add a debug socket): socket inodes among its descriptors, looked up in its net/unix.
shim_listen_sockets() {
  local pid=$1 fd link inodes=" "
  for fd in /proc/"$pid"/fd/*; do
    link=$(readlink "$fd" 2>/dev/null) || continue
    case $link in socket:\[*\]) inodes+="${link//[^0-9]/} " ;; esac
  done
  # /proc/net/unix: Num RefCount Protocol Flags Type St Inode Path; St 01 = listening.
  awk -v inodes="$inodes" '$6 == "01" && NF >= 8 && index(inodes, " " $7 " ") { print $8 }' \
    "/proc/$pid/net/unix" 2>/dev/null || true
}

record_shims() {
  local pid ns id h
  # conmon's sockets live under the bed (crio's attach dir), removed with it.
  [ "$RUNTIME" = crio ] && return 0
  touch "$SHIMFILE"
  while read -r pid ns id; do
    shim_listen_sockets "$pid"
    if [ "$RUNTIME" = containerd-1.6 ]; then
      # 1.6's rule, for shims whose descriptors cannot be read any more.
      h=$(printf %s "$SOCK/$ns/$id" | sha256sum | cut -d' ' -f1)
      echo "/run/containerd/s/$h"
    fi
  done < <(our_shims) >>"$SHIMFILE"
  sort -u -o "$SHIMFILE" "$SHIMFILE"
}

# --- CRI-O ----------------------------------------------------------------------------------
# What docs/testbed.md ("CRI-O") found to work on this kind of host: cgroupfs, conmon in the pod
# cgroup, an infra (pause) container in every pod, pod events on, runc through
# tools/crio/runc-restrict-oom, and every directory CRI-O would otherwise create under /etc,
# /var/lib or /run moved under the test bed.

# crio_paths BIN: the socket, config, PID file and directories of CRI-O (bin dir BIN).
crio_paths() {
  CRIO_BIN=$1
  DAEMON=crio
  CRIO_DIR=$TB/crio
  CONFIG=$TB/crio.conf
  CRIO_CONF_D=$TB/crio.conf.d
  SOCK=$TB/crio.sock
  PIDFILE=$TB/crio.pid
  LOGFILE=$TB/crio.log
  RUNC_ROOT=$CRIO_DIR/runc
  ENDPOINT=unix://$SOCK
  # An empty drop-in directory, so nothing in /etc/crio/crio.conf.d applies.
  DAEMON_ARGS=(--config "$CONFIG" --config-dir "$CRIO_CONF_D" --log-level info)
}

crio_write_config() {
  mkdir -p "$ROOT_DIR" "$CRIO_DIR"/{runroot,logs,exits,attach,ns,hooks.d,cdi,keys,policies,auth} \
    "$RUNC_ROOT" "$CRIO_CONF_D" "$CNI_CONF_DIR"
  rm -f "$CRIO_CONF_D"/* "$CNI_CONF_DIR"/*
  echo '{"default": [{"type": "insecureAcceptAnything"}]}' >"$CRIO_DIR/policy.json"
  # No runc-hooked handler: containerd's comes from a base OCI spec (base_runtime_spec); CRI-O
  # takes hooks from hooks_dir for every container alike, so it would need hook files matched on
  # an annotation instead. Not written yet.
  cat >"$CONFIG" <<EOF
# Written by scripts/testbed.sh; rewritten on every start.
[crio]
root = "$ROOT_DIR"
runroot = "$CRIO_DIR/runroot"
storage_driver = "overlay"
log_dir = "$CRIO_DIR/logs"
version_file = "$CRIO_DIR/version"
version_file_persist = "$CRIO_DIR/version-persist"
clean_shutdown_file = "$CRIO_DIR/clean.shutdown"

[crio.api]
listen = "$SOCK"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
# conmon in the pod's cgroup, not crio's.
conmon_cgroup = "pod"
selinux = false
container_exits_dir = "$CRIO_DIR/exits"
container_attach_socket_dir = "$CRIO_DIR/attach"
namespaces_dir = "$CRIO_DIR/ns"
pinns_path = "$CRIO_BIN/pinns"
hooks_dir = ["$CRIO_DIR/hooks.d"]
cdi_spec_dirs = ["$CRIO_DIR/cdi"]
decryption_keys_path = "$CRIO_DIR/keys"
irqbalance_config_file = ""
irqbalance_config_restore_file = ""
enable_criu_support = false
# GetContainerEvents.
enable_pod_events = true
# A pause process in every pod, as containerd runs, so the kernel sees every sandbox.
drop_infra_ctr = false

[crio.runtime.runtimes.runc]
# Raises the -998/-997 oom_score_adj runc cannot set without CAP_SYS_RESOURCE.
runtime_path = "$REPO/tools/crio/runc-restrict-oom"
runtime_type = "oci"
runtime_root = "$RUNC_ROOT"
monitor_path = "/usr/bin/conmon"
monitor_cgroup = "pod"

[crio.image]
# Nothing is pulled: the sandbox image is imported locally (and pinned by being the pause image).
pause_image = "$IMAGE"
pause_command = "/pause"
pause_image_auth_file = ""
signature_policy = "$CRIO_DIR/policy.json"
signature_policy_dir = "$CRIO_DIR/policies"
namespaced_auth_dir = "$CRIO_DIR/auth"

[crio.network]
# Empty: host-network pods only (no --cni with crio yet).
network_dir = "$CNI_CONF_DIR"
plugin_dirs = ["/usr/lib/cni"]

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = false
EOF
}

# The image archive into CRI-O's storage, with skopeo. skopeo (as root) keeps a blob-info cache in
# /var/lib/containers/cache; a private mount namespace with a tmpfs on /var/lib keeps it off the
# host (the storage itself is under the test bed).
crio_import_image() {
  mkdir -p "$ROOT_DIR" "$CRIO_DIR/runroot"
  [ -f "$CRIO_DIR/policy.json" ] ||
    echo '{"default": [{"type": "insecureAcceptAnything"}]}' >"$CRIO_DIR/policy.json"
  unshare --mount --propagation private sh -c 'mount -t tmpfs kpleg-skopeo /var/lib && exec "$@"' sh \
    skopeo --policy "$CRIO_DIR/policy.json" copy -q "oci-archive:$IMAGE_DIR/image.tar" \
    "containers-storage:[overlay@$ROOT_DIR+$CRIO_DIR/runroot]$IMAGE" >&2 ||
    die "importing $IMAGE into $ROOT_DIR with skopeo failed"
}

# Whether CRI-O has the image (only while it runs).
crio_has_image() { crictl_ 10s inspecti "$IMAGE" >/dev/null 2>&1; }

# conmon processes of this test bed: those whose --exit-dir is ours. Prints "pid crio id".
our_conmons() {
  local d pid id exitdir arg prev
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    [ "$(cat "$d/comm" 2>/dev/null)" = conmon ] || continue
    id="" exitdir="" prev=""
    while IFS= read -r -d '' arg; do
      case $prev in
        -c | --cid) id=$arg ;;
        --exit-dir) exitdir=$arg ;;
      esac
      prev=$arg
    done 2>/dev/null <"$d/cmdline" || continue
    [ "$exitdir" = "$CRIO_DIR/exits" ] && echo "$pid crio ${id:-?}"
  done
  return 0
}

# Every pod through CRI (the storage is the test bed's own, so every pod in it is ours); then any
# container still listed. Without crictl nothing can be removed this way: conmons are killed by
# wait_shims_gone and the mounts go in unmount_leftovers.
crio_remove_workloads() {
  local id
  if [ -z "$CRICTL" ]; then
    log "warning: no crictl; CRI-O's pods are not removed through CRI"
    return 0
  fi
  for id in $(crictl_ 10s pods -q 2>/dev/null); do
    crictl_ 30s stopp "$id" >/dev/null || log "warning: StopPodSandbox $id failed"
    crictl_ 30s rmp "$id" >/dev/null || log "warning: RemovePodSandbox $id failed"
  done
  for id in $(crictl_ 10s ps -aq 2>/dev/null); do
    crictl_ 30s rm -f "$id" >/dev/null || log "warning: RemoveContainer $id failed"
  done
}

# --- the image ------------------------------------------------------------------------------

oci_arch() {
  case $(dpkg --print-architecture) in
    amd64) echo amd64 ;; arm64) echo arm64 ;; armhf) echo arm ;; i386) echo 386 ;;
    ppc64el) echo ppc64le ;; s390x) echo s390x ;; riscv64) echo riscv64 ;;
    *) die "unsupported architecture $(dpkg --print-architecture)" ;;
  esac
}

# Builds $IMAGE_DIR/image.tar, an OCI image layout holding one uncompressed layer. Rebuilt only
# when pause.c, busybox or this script change. The layer tar is reproducible (sorted, fixed
# owners and times) so the image digest is stable across rebuilds.
build_image() {
  local busybox=/bin/busybox stamp arch rootfs oci layer_digest layer_size cfg cfg_digest
  local cfg_size manifest man_digest man_size a
  [ -x "$busybox" ] || die "$busybox missing (package busybox-static)"
  if ldd "$busybox" >/dev/null 2>&1; then
    die "$busybox is dynamically linked; install busybox-static"
  fi
  stamp=$(cat "$HERE/pause.c" "$busybox" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)
  if [ -f "$IMAGE_DIR/image.tar" ] && [ "$(cat "$IMAGE_DIR/stamp" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  IMAGE_REBUILT=1
  log "building image $IMAGE"
  arch=$(oci_arch)
  rm -rf "$IMAGE_DIR"
  rootfs=$IMAGE_DIR/rootfs
  oci=$IMAGE_DIR/oci
  mkdir -p "$rootfs"/{bin,dev,proc,sys,etc,root,run,var,tmp} "$oci/blobs/sha256"
  chmod 1777 "$rootfs/tmp"
  gcc -static -O2 -s -Wall -Wextra -Werror -o "$rootfs/pause" "$HERE/pause.c" ||
    die "compiling scripts/testbed/pause.c failed (needs gcc and libc6-dev)"
  cp "$busybox" "$rootfs/bin/busybox"
  for a in $("$busybox" --list); do
    [ "$a" = busybox ] || ln -s busybox "$rootfs/bin/$a"
  done
  for a in sh sleep true false kill cat echo dd head yes; do
    [ -e "$rootfs/bin/$a" ] || die "busybox has no applet '$a'"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"

  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
    -C "$rootfs" -cf "$IMAGE_DIR/layer.tar" .
  layer_digest=$(sha256sum "$IMAGE_DIR/layer.tar" | cut -d' ' -f1)
  layer_size=$(stat -c %s "$IMAGE_DIR/layer.tar")
  mv "$IMAGE_DIR/layer.tar" "$oci/blobs/sha256/$layer_digest"

  cfg=$IMAGE_DIR/config.json
  jq -cn --arg arch "$arch" --arg diff "sha256:$layer_digest" '{
      architecture: $arch, os: "linux",
      config: {
        Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        Cmd: ["/pause"], WorkingDir: "/"
      },
      rootfs: {type: "layers", diff_ids: [$diff]},
      history: [{created_by: "scripts/testbed.sh: busybox-static and pause"}]
    }' | tr -d '\n' >"$cfg"
  cfg_digest=$(sha256sum "$cfg" | cut -d' ' -f1)
  cfg_size=$(stat -c %s "$cfg")
  mv "$cfg" "$oci/blobs/sha256/$cfg_digest"

  manifest=$IMAGE_DIR/manifest.json
  jq -cn --arg cd "sha256:$cfg_digest" --argjson cs "$cfg_size" \
    --arg ld "sha256:$layer_digest" --argjson ls "$layer_size" '{
      schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $cd, size: $cs},
      layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar", digest: $ld, size: $ls}]
    }' | tr -d '\n' >"$manifest"
  man_digest=$(sha256sum "$manifest" | cut -d' ' -f1)
  man_size=$(stat -c %s "$manifest")
  mv "$manifest" "$oci/blobs/sha256/$man_digest"

  jq -cn --arg md "sha256:$man_digest" --argjson ms "$man_size" --arg arch "$arch" \
    --arg name "$IMAGE" --arg tag "${IMAGE##*:}" '{
      schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json",
      manifests: [{
        mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $md, size: $ms,
        platform: {architecture: $arch, os: "linux"},
        annotations: {"io.containerd.image.name": $name, "org.opencontainers.image.ref.name": $tag}
      }]
    }' >"$oci/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$oci/oci-layout"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
    -C "$oci" -cf "$IMAGE_DIR/image.tar" oci-layout index.json blobs
  echo "$stamp" >"$IMAGE_DIR/stamp"
}

import_image() {
  if [ "$RUNTIME" = crio ]; then
    crio_import_image
    return
  fi
  ctr_ -n "$NS" images import "$IMAGE_DIR/image.tar" >&2 || die "importing $IMAGE failed"
  local images
  images=$(ctr_ -n "$NS" images ls -q) || die "listing images failed"
  grep -qxF "$IMAGE" <<<"$images" || die "$IMAGE missing after import; images: ${images//$'\n'/ }"
}

# --- configuration --------------------------------------------------------------------------

write_config() {
  local mode=$1
  if [ "$RUNTIME" = crio ]; then
    crio_write_config
    echo "$mode" >"$MODEFILE"
    return
  fi
  mkdir -p "$ROOT_DIR" "$TB"/{state,opt,certs.d} "$RUNC_ROOT" "$CNI_CONF_DIR" "$TB/cni/ipam"
  # The CRI plugin watches this directory: it must hold exactly the network we want.
  rm -f "$CNI_CONF_DIR"/*
  if [ "$mode" = cni ]; then
    jq -n --arg bridge "$BRIDGE" --arg subnet "$SUBNET" --arg ipam "$TB/cni/ipam" '{
        cniVersion: "1.0.0", name: "kpleg-testbed",
        plugins: [{
          type: "bridge", bridge: $bridge, isGateway: true, ipMasq: false, hairpinMode: true,
          ipam: {type: "host-local", ranges: [[{subnet: $subnet}]], routes: [], dataDir: $ipam}
        }]
      }' >"$CNI_CONF_DIR/10-kpleg-testbed.conflist"
  fi
  # The runtime handler "runc-hooked" runs OCI hooks inside each container's cgroup before its
  # entrypoint, like NVIDIA's CDI hook: a createContainer hook (runc init runs it before
  # pivot_root, so /bin/sh is the host's) and a startContainer hook (after it, the image's).
  "$CTR" oci spec | jq '.hooks = {
      createContainer: [{path: "/bin/sh", args: ["sh", "-c", "sleep 0.3"]}],
      startContainer: [{path: "/bin/sh", args: ["sh", "-c", "sleep 0.3"]}]
    }' >"$HOOKED_SPEC" || die "writing the hooked runtime's base spec failed"
  case $RUNTIME in
    containerd-1.6) config_v2 ;;
    containerd-2) config_v3 ;;
  esac >"$CONFIG"
  echo "$mode" >"$MODEFILE"
}

# containerd 1.6.
config_v2() {
  cat <<EOF
# Written by scripts/testbed.sh; rewritten on every start.
version = 2
root = "$ROOT_DIR"
state = "$TB/state"
# containerd may not lower its own score: CAP_SYS_RESOURCE is not always in the bounding set.
oom_score = 0
# Snapshotters that need btrfs/zfs/devmapper/aufs only add noise to the log.
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = "$SOCK"

[ttrpc]
  address = ""

[debug]
  address = ""

[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$TB/opt"

  [plugins."io.containerd.runtime.v1.linux"]
    runtime_root = "$TB/runc-v1"

  [plugins."io.containerd.grpc.v1.cri"]
    # Nothing is pulled: the sandbox image is built and imported locally.
    sandbox_image = "$IMAGE"
    # Without it runc cannot set the sandbox's oom_score_adj when CAP_SYS_RESOURCE is missing and
    # containerd only reports "can't get final child's PID from pipe: EOF".
    restrict_oom_score_adj = true
    systemd_cgroup = false
    disable_apparmor = true
    enable_selinux = false
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    # Pod network namespaces under our state dir, not /var/run/netns.
    netns_mounts_under_state_dir = true
    disable_hugetlb_controller = true
    tolerate_missing_hugetlb_controller = true

    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "$CNI_CONF_DIR"
      max_conf_num = 1

    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          Root = "$RUNC_ROOT"
          SystemdCgroup = false

      # runc with OCI hooks in every container (see write_config).
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc-hooked]
        runtime_type = "io.containerd.runc.v2"
        base_runtime_spec = "$HOOKED_SPEC"

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc-hooked.options]
          Root = "$RUNC_ROOT"
          SystemdCgroup = false

    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "$TB/certs.d"
EOF
}

# containerd 2.x: the CRI plugin is split into io.containerd.cri.v1.runtime (containers, CNI,
# runc options), io.containerd.cri.v1.images (snapshotter, pinned sandbox image, registry) and
# io.containerd.grpc.v1.cri (the server), each with the same settings and reasons as config_v2.
config_v3() {
  cat <<EOF
# Written by scripts/testbed.sh; rewritten on every start.
# Version 3 is read by every containerd 2.x; 2.4 migrates it in memory (a warning in the log).
version = 3
root = "$ROOT_DIR"
state = "$TB/state"
# containerd may not lower its own score: CAP_SYS_RESOURCE is not always in the bounding set.
oom_score = 0
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
]

[grpc]
  address = "$SOCK"

[ttrpc]
  address = ""

[debug]
  address = ""

[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$TB/opt"

  [plugins."io.containerd.cri.v1.runtime"]
    # See config_v2: runc cannot set the sandbox's oom_score_adj without CAP_SYS_RESOURCE.
    restrict_oom_score_adj = true
    disable_apparmor = true
    enable_selinux = false
    netns_mounts_under_state_dir = true
    disable_hugetlb_controller = true
    tolerate_missing_hugetlb_controller = true

    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["/usr/lib/cni"]
      conf_dir = "$CNI_CONF_DIR"
      max_conf_num = 1

    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"

      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"

        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          Root = "$RUNC_ROOT"
          SystemdCgroup = false

      # runc with OCI hooks in every container (see write_config).
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc-hooked]
        runtime_type = "io.containerd.runc.v2"
        base_runtime_spec = "$HOOKED_SPEC"

        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc-hooked.options]
          Root = "$RUNC_ROOT"
          SystemdCgroup = false

  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "overlayfs"

    # Nothing is pulled: the sandbox image is built and imported locally.
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = "$IMAGE"

    [plugins."io.containerd.cri.v1.images".registry]
      config_path = "$TB/certs.d"

  [plugins."io.containerd.grpc.v1.cri"]
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
EOF
}

# --- start, readiness -----------------------------------------------------------------------

start_containerd() {
  local pid
  if [ -e "$SOCK" ]; then
    # Only stale if nothing answers on it: a containerd of this test bed in another PID
    # namespace would be invisible to containerd_pid but still own it.
    if curl -s --max-time 2 --unix-socket "$SOCK" http://localhost/ -o /dev/null 2>/dev/null ||
        [ $? -ne 7 ]; then
      die "something is serving on $SOCK but it is not a containerd of this test bed; not starting a second one"
    fi
    log "removing stale socket $SOCK"
    rm -f "$SOCK"
  fi
  rm -f "$SOCK.ttrpc"
  [ -f "$LOGFILE" ] && mv -f "$LOGFILE" "$LOGFILE.1"
  # setsid + closed descriptors: containerd must not hold the caller's pipes open (a caller doing
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

cri_plugin_ok() {
  local plugins
  # CRI-O is a CRI server and nothing else: the Version probe in wait_ready is its check.
  [ "$RUNTIME" = crio ] && return 0
  plugins=$(ctr_ plugins ls 2>/dev/null) || return 1
  [ "$(awk '$1 == "io.containerd.grpc.v1" && $2 == "cri" { print $NF }' <<<"$plugins")" = ok ]
}

kpleg_load() {
  local bin=${KPLEG_LOAD:-$REPO/build/bin/kpleg-load}
  [ -x "$bin" ] || return 2
  local help args=()
  help=$("$bin" --help 2>&1 || true)
  if grep -q -- '--runtime-endpoint' <<<"$help"; then
    args=(--runtime-endpoint "$ENDPOINT")
  elif grep -q -- '--endpoint' <<<"$help"; then
    args=(--endpoint "$ENDPOINT")
  fi
  KPLEG_RUNTIME_ENDPOINT=$ENDPOINT timeout 10 "$bin" "${args[@]}" "$@"
}

# A real CRI Version call (crictl version): the plugin registers before it has finished
# initialising and answers "server is not initialized yet" until then. Prints
# "<runtime> <version> (CRI <api version>)".
cri_version() {
  local out
  find_crictl || return 1
  out=$(crictl_ 3s version) || return 1
  awk '$1 == "RuntimeName:" { n = $2 } $1 == "RuntimeVersion:" { v = $2 }
    $1 == "RuntimeApiVersion:" { a = $2 } END { printf "%s %s (CRI %s)\n", n, v, a }' <<<"$out"
}

wait_ready() {
  local pid=$1 deadline=$((SECONDS + READY_TIMEOUT_S)) why=""
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      # setsid forks when it is a process group leader: then the PID we noted is not containerd's.
      local found
      found=$(containerd_pid)
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
    elif ! cri_plugin_ok; then
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
  local rc=0 out
  out=$(kpleg_load version 2>&1) || rc=$?
  case $rc in
    0) log "kpleg-load version: $(head -n1 <<<"$out")" ;;
    2) ;;
    *) log "warning: ${KPLEG_LOAD:-build/bin/kpleg-load} version failed (exit $rc): $(head -n3 <<<"$out")" ;;
  esac
}

# --- teardown -------------------------------------------------------------------------------

# Sandboxes through CRI (crictl stopp, rmp), so the CRI plugin tears down their networks, netns
# and shm mounts; whatever is left (ctr-made containers, CRI leftovers) through ctr. Without
# crictl everything goes through ctr, and unmount_leftovers takes the netns and shm mounts.
remove_workloads() {
  local id ns deadline
  if [ "$RUNTIME" = crio ]; then
    crio_remove_workloads
    return
  fi
  if [ -n "$CRICTL" ]; then
    for id in $(ctr_ -n "$NS" containers ls -q 'labels."io.cri-containerd.kind"==sandbox' 2>/dev/null); do
      crictl_ 30s stopp "$id" >/dev/null || log "warning: StopPodSandbox $id failed"
      crictl_ 30s rmp "$id" >/dev/null || log "warning: RemovePodSandbox $id failed"
    done
  fi
  for ns in $(ctr_ namespaces ls -q 2>/dev/null); do
    for id in $(ctr_ -n "$ns" tasks ls -q 2>/dev/null); do
      ctr_ -n "$ns" tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    deadline=$((SECONDS + 10))
    for id in $(ctr_ -n "$ns" tasks ls -q 2>/dev/null); do
      while ! ctr_ -n "$ns" tasks delete "$id" >/dev/null 2>&1; do
        grep -qxF "$id" <<<"$(ctr_ -n "$ns" tasks ls -q 2>/dev/null)" || break
        if ((SECONDS >= deadline)); then
          ctr_ -n "$ns" tasks delete -f "$id" >/dev/null 2>&1 || log "warning: task $ns/$id not deleted"
          break
        fi
        sleep 0.1
      done
    done
    for id in $(ctr_ -n "$ns" containers ls -q 2>/dev/null); do
      ctr_ -n "$ns" containers delete "$id" >/dev/null 2>&1 || log "warning: container $ns/$id not deleted"
    done
  done
}

stop_containerd() {
  local pid=$1 deadline timeout=$STOP_TIMEOUT_S
  [ "$RUNTIME" = crio ] && timeout=$CRIO_STOP_TIMEOUT_S
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

# Shims exit on their own once their tasks are deleted. A shim that outlives the deadline belongs
# to this test bed (its -address is our socket), so stopping it cannot hit anyone else's work.
wait_shims_gone() {
  local deadline=$((SECONDS + STOP_TIMEOUT_S)) left
  while :; do
    left=$(our_shims | cut -d' ' -f1 | tr '\n' ' ')
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

remove_shim_sockets() {
  local s
  [ -f "$SHIMFILE" ] || return 0
  while read -r s; do
    case $s in /run/containerd/s/*) rm -f "$s" ;; esac
  done <"$SHIMFILE"
  # /run/containerd/s itself is shared with any other containerd on the host: left in place.
  rm -f "$SHIMFILE"
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
# every empty directory under kubepods/ and k8s.io/ in each hierarchy, children first. rmdir
# fails on a cgroup that still has processes or children, so nothing in use is touched.
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

# On a hybrid cgroup host whose cgroup v1 hierarchies lack hugetlb (the kernel has it, nothing
# mounted it), CRI-O hands runc the hugepage limits the kubelet sets on every container, and runc
# fails each one: "cannot set hugetlb limit: container could not join or create cgroup".
# (containerd drops them when the controller is missing: tolerate_missing_hugetlb_controller.)
# 'up --runtime crio' mounts the controller where systemd would have, and 'down' unmounts what
# 'up' mounted (below: with care). Nothing is done on a cgroup2-only host, or when the cgroup2
# hierarchy uses it.
HUGETLB_V1=/sys/fs/cgroup/hugetlb
mount_hugetlb_v1() {
  mountpoint -q /sys/fs/cgroup/memory 2>/dev/null || return 0  # no v1 hierarchies
  awk '$1 == "hugetlb" && $4 == 1 { f = 1 } END { exit !f }' /proc/cgroups || return 0
  mountpoint -q "$HUGETLB_V1" && return 0
  if grep -qw hugetlb /sys/fs/cgroup/unified/cgroup.subtree_control 2>/dev/null; then
    log "warning: the hugetlb controller is in use on cgroup2; CRI-O's containers with hugepage limits will fail"
    return 0
  fi
  if mkdir -p "$HUGETLB_V1" && mount -t cgroup -o hugetlb cgroup "$HUGETLB_V1"; then
    touch "$TB/hugetlb-mounted"
    log "mounted the cgroup v1 hugetlb controller at $HUGETLB_V1 (runc sets the hugepage limits CRI-O passes on)"
  else
    log "warning: cannot mount the hugetlb controller at $HUGETLB_V1; CRI-O's containers with hugepage limits will fail"
  fi
}

# Unmounted while it still holds a cgroup (a dying one too), a v1 hierarchy lives on where
# nobody sees it, with hugetlb bound to it: containerd 1.6's cgroup library then failed every
# container's stats ("unexpected metrics response: []") and OOM watch (an OOM kill reported as
# "Error"). So 'down' waits (up to 5 s) for the hierarchy to hold its root only, unmounts it,
# and checks that the kernel let it go (hugetlb back on hierarchy 0 in /proc/cgroups); if not,
# it mounts it again, so that the controller stays where every runtime finds it.
hugetlb_field() { awk -v f="$1" '$1 == "hugetlb" { print $f }' /proc/cgroups; }
unmount_hugetlb_v1() {
  local i
  [ -f "$TB/hugetlb-mounted" ] || return 0
  mountpoint -q "$HUGETLB_V1" || { rm -f "$TB/hugetlb-mounted"; return 0; }
  for i in $(seq 50); do
    [ "$(hugetlb_field 3)" = 1 ] && break
    sleep 0.1  # dying cgroups go within milliseconds; no event announces it
  done
  if [ "$(hugetlb_field 3)" != 1 ]; then
    log "leaving $HUGETLB_V1 mounted: it still holds $(($(hugetlb_field 3) - 1)) cgroups"
    return 0
  fi
  umount "$HUGETLB_V1" || { log "warning: cannot unmount $HUGETLB_V1, which 'up' mounted"; return 0; }
  for i in $(seq 50); do
    [ "$(hugetlb_field 2)" = 0 ] && break
    sleep 0.1
  done
  if [ "$(hugetlb_field 2)" != 0 ]; then
    mount -t cgroup -o hugetlb cgroup "$HUGETLB_V1" ||
      log "warning: the kernel kept the hugetlb hierarchy after the unmount and it cannot be mounted again at $HUGETLB_V1"
    log "left $HUGETLB_V1 mounted: the kernel kept its hierarchy after the unmount"
    return 0
  fi
  rmdir "$HUGETLB_V1" 2>/dev/null || true
  rm -f "$TB/hugetlb-mounted"
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

# --- commands -------------------------------------------------------------------------------

# Every step that starts, stops or removes anything runs under this lock, so concurrent callers
# (parallel tests) never start a second containerd on the same state or remove a live socket.
take_lock() {
  exec {TB_LOCK_FD}>"$TB/.lock"
  flock -w 120 "$TB_LOCK_FD" || die "another testbed.sh held $TB/.lock for 120 s"
}

# Starts containerd and waits for it; one that never becomes ready is stopped again, so it cannot
# sit on the metadata database and block the next attempt.
start_and_wait() {
  local pid
  start_containerd
  pid=$(cat "$PIDFILE")
  if ! (wait_ready "$pid"); then
    pid=$(containerd_pid)
    if [ -n "$pid" ]; then
      log "stopping the $DAEMON that did not become ready (pid $pid)"
      stop_containerd "$pid"
    fi
    rm -f "$PIDFILE"
    die "$DAEMON did not become ready; see $LOGFILE.1 and $LOGFILE"
  fi
  containerd_pid >/dev/null
}

# A running containerd whose socket file was removed cannot be reached by anyone: restart it on
# the same state (it reattaches to its shims, so pods survive).
repair_socket() {
  local pid=$1
  [ -S "$SOCK" ] && return 0
  log "$DAEMON (pid $pid) has lost its socket $SOCK; restarting it"
  stop_containerd "$pid"
  start_and_wait
}

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

  # One runtime at a time: a containerd, shims or mounts of the other one still belong to it,
  # and only its own 'down' can remove them.
  recorded=$(recorded_runtime)
  if [ "$recorded" != "$runtime" ] &&
      { [ -n "$(containerd_pid)" ] || [ -n "$(our_shims)" ] || [ -n "$(our_mounts)" ]; }; then
    die "the test bed in $TB is up with $recorded; run 'testbed.sh down' first, then 'up --runtime $runtime'"
  fi

  ensure_packages "$mode"
  if [ "$RUNTIME" = crio ]; then
    [ -x /usr/bin/conmon ] || die "/usr/bin/conmon missing (package conmon)"
    [ -x "$CRIO_BIN/pinns" ] || die "$CRIO_BIN/pinns missing; rebuild with scripts/runtimes.sh build crio"
  else
    [ -x "$(command -v containerd-shim-runc-v2)" ] || die "containerd-shim-runc-v2 not on PATH"
  fi
  [ -x "$(command -v "$CONTAINERD")" ] || die "$CONTAINERD not found"
  [ "$mode" != cni ] || [ -x /usr/lib/cni/bridge ] || die "/usr/lib/cni/bridge missing (containernetworking-plugins)"

  pid=$(containerd_pid)
  if [ -n "$pid" ]; then
    if [ "$mode" = cni ] && [ "$(cat "$MODEFILE" 2>/dev/null)" != cni ]; then
      die "already up without pod networking (pid $pid); run 'testbed.sh down' first, then 'up --cni'"
    fi
    repair_socket "$pid"
    wait_ready "$(containerd_pid)"
    # Repairs a bed whose first 'up' failed half way, or picks up a changed pause.c.
    build_image
    local images
    if [ "$RUNTIME" = crio ]; then
      if ((IMAGE_REBUILT)) || ! crio_has_image; then
        import_image
        crio_has_image || die "$IMAGE imported but CRI-O does not list it"
      fi
      echo "KPLEG_RUNTIME_ENDPOINT=$ENDPOINT"
      return 0
    fi
    images=$(ctr_ -n "$NS" images ls -q) || die "listing images failed"
    if ((IMAGE_REBUILT)) || ! grep -qxF "$IMAGE" <<<"$images"; then
      import_image
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
  write_config "$mode"
  if [ "$RUNTIME" = crio ]; then
    mount_hugetlb_v1
    # Into the storage before CRI-O opens it; the pause image must be there for the first pod.
    import_image
    start_and_wait
    crio_has_image || die "CRI-O does not list $IMAGE after the import"
  else
    start_and_wait
    import_image
  fi
  record_shims
  log "up: $(cri_version 2>/dev/null || echo CRI), image $IMAGE, pod network: $([ "$mode" = cni ] && echo "$BRIDGE $SUBNET" || echo "host only")"
  echo "KPLEG_RUNTIME_ENDPOINT=$ENDPOINT"
}

cmd_down() {
  local pid restarted=0 n
  [ $# -eq 0 ] || die "down takes no options"
  [ -d "$TB" ] || return 0
  if [ "$(id -u)" -ne 0 ]; then
    [ -z "$(containerd_pid)" ] && [ -z "$(our_shims)" ] && return 0
    need_root
  fi
  # Before the lock, as in 'up': the first build takes a while. Without crictl, down still stops
  # everything, through ctr (remove_workloads).
  find_crictl || log "warning: no crictl; down removes sandboxes through ctr only"
  take_lock
  use_runtime "$(recorded_runtime)" 0
  pid=$(containerd_pid)
  if [ -z "$pid" ] && [ -z "$(our_shims)" ] && [ -z "$(our_mounts)" ]; then
    # Nothing of ours runs and no 'up' is half way (it would hold the lock): stale files only.
    rm -f "$PIDFILE" "$SOCK" "$SOCK.ttrpc" "$RUNTIMEFILE"
    unmount_hugetlb_v1
    return 0
  fi
  if [ -z "$pid" ]; then
    # containerd died but its shims (and their containers) or mounts live on: a containerd on the
    # same state reconnects to them, and then they can be removed the normal way.
    log "$DAEMON is gone but its shims (conmons) or mounts are not; restarting it to clean up"
    [ -f "$CONFIG" ] || die "$CONFIG missing; cannot reconnect to the shims of this test bed"
    start_and_wait
    pid=$(containerd_pid)
    restarted=1
  else
    repair_socket "$pid"
    pid=$(containerd_pid)
  fi
  log "stopping ($DAEMON pid $pid)"
  record_shims
  remove_workloads
  record_shims
  stop_containerd "$pid"
  # More than one only after an earlier version of this script raced with itself.
  for n in 1 2 3; do
    pid=$(containerd_pid)
    [ -n "$pid" ] || break
    log "stopping another containerd on this test bed (pid $pid)"
    stop_containerd "$pid"
  done
  wait_shims_gone
  remove_shim_sockets
  unmount_leftovers
  remove_cgroups
  unmount_hugetlb_v1
  remove_network
  rm -rf "$TB/state" "$RUNC_ROOT" "$TB/runc-v1" "$TB/cni/ipam"
  # CRI-O's run-time state (its storage, with the image, stays like containerd's root).
  # $TB/seccomp: CRI-O's seccomp notifier directory, beside its socket.
  [ "$RUNTIME" != crio ] || rm -rf "$CRIO_DIR"/{runroot,exits,attach,ns} "$TB/seccomp"
  rm -f "$PIDFILE" "$SOCK" "$SOCK.ttrpc" "$RUNTIMEFILE"
  ((restarted == 0)) || log "cleaned up after an unclean stop"
  log "down"
}

cmd_status() {
  local pid ver
  [ $# -eq 0 ] || die "status takes no options"
  pid=""
  if [ "$(recorded_runtime)" = crio ]; then
    RUNTIME=crio
    crio_paths "$(sed -n 2p "$RUNTIMEFILE" 2>/dev/null)"
  fi
  [ -d "$TB" ] && pid=$(containerd_pid 2>/dev/null)
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
