# shellcheck shell=bash disable=SC2034,SC2153  # variables shared with testbed.sh and its other parts
# The test bed's containerd steps (containerd 1.6 from Debian, 2.x from scripts/runtimes.sh), run
# by the core through rt: config, image import, readiness, shims, workload removal.

ctr_() { "$CTR" --address "$SOCK" "$@"; }

containerd_check() {
  [ -x "$(command -v containerd-shim-runc-v2)" ] || die "containerd-shim-runc-v2 not on PATH"
}

# containerd's CRI plugin must be loaded and ok before its Version call means anything.
containerd_ready() {
  local plugins
  plugins=$(ctr_ plugins ls 2>/dev/null) || return 1
  [ "$(awk '$1 == "io.containerd.grpc.v1" && $2 == "cri" { print $NF }' <<<"$plugins")" = ok ]
}

# A fresh start: the image is imported through the running containerd.
containerd_start() {
  start_and_wait
  containerd_import_image
}

containerd_has_image() {
  local images
  images=$(ctr_ -n "$NS" images ls -q) || die "listing images failed"
  grep -qxF "$IMAGE" <<<"$images"
}

containerd_import_image() {
  local images
  ctr_ -n "$NS" images import "$IMAGE_DIR/image.tar" >&2 || die "importing $IMAGE failed"
  images=$(ctr_ -n "$NS" images ls -q) || die "listing images failed"
  grep -qxF "$IMAGE" <<<"$images" || die "$IMAGE missing after import; images: ${images//$'\n'/ }"
}

# Shims of this test bed: containerd-shim-runc-v2 processes whose -address is our socket.
# Prints "pid namespace id" lines.
containerd_shims() {
  local d pid ns id addr arg prev
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

# The shims' sockets, noted while the shims run so that 'down' can remove them afterwards.
containerd_record_shims() {
  local pid ns id h
  touch "$SHIMFILE"
  while read -r pid ns id; do
    shim_listen_sockets "$pid"
    if [ "$RUNTIME" = containerd-1.6 ]; then
      # 1.6's rule, for shims whose descriptors cannot be read any more.
      h=$(printf %s "$SOCK/$ns/$id" | sha256sum | cut -d' ' -f1)
      echo "/run/containerd/s/$h"
    fi
  done < <(containerd_shims) >>"$SHIMFILE"
  sort -u -o "$SHIMFILE" "$SHIMFILE"
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

# Sandboxes through CRI (crictl stopp, rmp), so the CRI plugin tears down their networks, netns
# and shm mounts; whatever is left (ctr-made containers, CRI leftovers) through ctr. Without
# crictl everything goes through ctr, and unmount_leftovers takes the netns and shm mounts.
containerd_remove_workloads() {
  local id ns deadline
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

# Nothing of containerd's own beyond what every runtime's 'down' removes.
containerd_cleanup() { :; }

# --- configuration --------------------------------------------------------------------------

containerd_write_config() {
  local mode=$1
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
    containerd-1.6) containerd_config 2 ;;
    containerd-2) containerd_config 3 ;;
  esac >"$CONFIG"
  echo "$mode" >"$MODEFILE"
}

# containerd_config VERSION: config.toml version 2 (containerd 1.6) or 3 (2.x). 2.x splits the CRI
# plugin into io.containerd.cri.v1.runtime (containers, CNI, runc options),
# io.containerd.cri.v1.images (snapshotter, pinned sandbox image, registry) and
# io.containerd.grpc.v1.cri (the server); every setting has the same reason in both.
containerd_config() {
  local v=$1 cri=plugins.\"io.containerd.grpc.v1.cri\" run images
  run=plugins.\"io.containerd.cri.v1.runtime\" images=plugins.\"io.containerd.cri.v1.images\"
  echo "# Written by scripts/testbed.sh; rewritten on every start."
  ((v == 2)) ||
    echo "# Version 3 is read by every containerd 2.x; 2.4 migrates it in memory (a warning in the log)."
  cat <<EOF
version = $v
root = "$ROOT_DIR"
state = "$TB/state"
# containerd may not lower its own score: CAP_SYS_RESOURCE is not always in the bounding set.
oom_score = 0
# Snapshotters that need btrfs/zfs/devmapper/aufs/a block file only add noise to the log.
disabled_plugins = [
EOF
  if ((v == 2)); then printf '  "io.containerd.snapshotter.v1.%s",\n' aufs btrfs devmapper zfs
  else printf '  "io.containerd.snapshotter.v1.%s",\n' btrfs devmapper zfs blockfile erofs; fi
  cat <<EOF
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

EOF
  if ((v == 2)); then
    cat <<EOF
  [plugins."io.containerd.runtime.v1.linux"]
    runtime_root = "$TB/runc-v1"

  [$cri]
    # Nothing is pulled: the sandbox image is built and imported locally.
    sandbox_image = "$IMAGE"
    systemd_cgroup = false
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
EOF
    run=$cri
  else
    echo "  [$run]"
  fi
  cat <<EOF
    # Without it runc cannot set the sandbox's oom_score_adj when CAP_SYS_RESOURCE is missing and
    # containerd only reports "can't get final child's PID from pipe: EOF".
    restrict_oom_score_adj = true
    disable_apparmor = true
    enable_selinux = false
    # Pod network namespaces under our state dir, not /var/run/netns.
    netns_mounts_under_state_dir = true
    disable_hugetlb_controller = true
    tolerate_missing_hugetlb_controller = true

    [$run.cni]
      $( ((v == 2)) && echo 'bin_dir = "/usr/lib/cni"' || echo 'bin_dirs = ["/usr/lib/cni"]')
      conf_dir = "$CNI_CONF_DIR"
      max_conf_num = 1

    [$run.containerd]
EOF
  ((v == 3)) || echo '      snapshotter = "overlayfs"'
  echo '      default_runtime_name = "runc"'
  containerd_runc_handler runc "$run"
  containerd_runc_handler runc-hooked "$run" "$HOOKED_SPEC"
  if ((v == 2)); then
    printf '\n    [%s.registry]\n      config_path = "%s"\n' "$cri" "$TB/certs.d"
    return
  fi
  cat <<EOF

  [$images]
    snapshotter = "overlayfs"

    # Nothing is pulled: the sandbox image is built and imported locally.
    [$images.pinned_images]
      sandbox = "$IMAGE"

    [$images.registry]
      config_path = "$TB/certs.d"

  [$cri]
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
EOF
}

# containerd_runc_handler NAME PLUGIN [BASE_SPEC]: a runtime handler NAME of runc; with BASE_SPEC
# (runc-hooked: runc with OCI hooks in every container, see containerd_write_config) its
# containers start from that OCI spec.
containerd_runc_handler() {
  local h=$2.containerd.runtimes.$1
  echo
  [ -z "${3:-}" ] || echo "      # runc with OCI hooks in every container (see containerd_write_config)."
  echo "      [$h]"
  echo '        runtime_type = "io.containerd.runc.v2"'
  [ -z "${3:-}" ] || echo "        base_runtime_spec = \"$3\""
  cat <<EOF

        [$h.options]
          Root = "$RUNC_ROOT"
          SystemdCgroup = false
EOF
}
