# shellcheck shell=bash disable=SC2034,SC2153  # variables shared with testbed.sh and its other parts
# The test bed's CRI-O steps, run by the core through rt. What docs/testbed.md ("CRI-O") found to
# work on this kind of host: cgroupfs, conmon in the pod cgroup, an infra (pause) container in
# every pod, pod events on, runc through tools/crio/runc-restrict-oom, and every directory CRI-O
# would otherwise create under /etc, /var/lib or /run moved under the test bed.

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
  # Its graceful stop waits for every open GetContainerEvents stream (kplegd, crictl events) and
  # then may panic: it gets this long after SIGTERM, then SIGKILL.
  DAEMON_STOP_TIMEOUT_S=$CRIO_STOP_TIMEOUT_S
  # An empty drop-in directory, so nothing in /etc/crio/crio.conf.d applies.
  DAEMON_ARGS=(--config "$CONFIG" --config-dir "$CRIO_CONF_D" --log-level info)
}

crio_check() {
  [ -x /usr/bin/conmon ] || die "/usr/bin/conmon missing (package conmon)"
  [ -x "$CRIO_BIN/pinns" ] || die "$CRIO_BIN/pinns missing; rebuild with scripts/runtimes.sh build crio"
}

# CRI-O is a CRI server and nothing else: the CRI Version call in wait_ready is its check.
crio_ready() { :; }

# A fresh start: the image goes into the storage before CRI-O opens it (the pause image must be
# there for the first pod).
crio_start() {
  mount_hugetlb_v1
  crio_import_image
  start_and_wait
  crio_has_image || die "CRI-O does not list $IMAGE after the import"
}

crio_write_config() {
  local mode=$1
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
  echo "$mode" >"$MODEFILE"
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

# conmon processes of this test bed, which take the place of shims: those whose --exit-dir is
# ours. Prints "pid crio id".
crio_shims() {
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

# conmon's sockets live under the bed (CRI-O's attach dir), removed with it.
crio_record_shims() { :; }

# CRI-O's run-time state (its storage, with the image, stays like containerd's root).
# $TB/seccomp: CRI-O's seccomp notifier directory, beside its socket.
crio_cleanup() { rm -rf "$CRIO_DIR"/{runroot,exits,attach,ns} "$TB/seccomp"; }

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
  [ -f "$TB/hugetlb-mounted" ] || return 0
  mountpoint -q "$HUGETLB_V1" || { rm -f "$TB/hugetlb-mounted"; return 0; }
  for _ in $(seq 50); do
    [ "$(hugetlb_field 3)" = 1 ] && break
    sleep 0.1  # dying cgroups go within milliseconds; no event announces it
  done
  if [ "$(hugetlb_field 3)" != 1 ]; then
    log "leaving $HUGETLB_V1 mounted: it still holds $(($(hugetlb_field 3) - 1)) cgroups"
    return 0
  fi
  umount "$HUGETLB_V1" || { log "warning: cannot unmount $HUGETLB_V1, which 'up' mounted"; return 0; }
  for _ in $(seq 50); do
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

