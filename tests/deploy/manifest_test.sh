#!/usr/bin/env bash
# deploy/kplegd-daemonset.yaml, checked without a cluster:
#  - it parses, and its kplegd container is consistent with itself: its startup, liveness and
#    readiness probes exec kplegctl through the API socket of --socket (no port, no network); the
#    runtime socket and the API socket lie in mounted volumes;
#  - it asks for least privilege: not privileged, every capability dropped but CAP_BPF and
#    CAP_PERFMON, no privilege escalation, a read-only root filesystem, the runtime's default
#    seccomp profile, no service account token, metrics on loopback, every host mount read-only
#    but the API socket's directory, the runtime's socket mounted alone; and deploy/README.md
#    names every privilege it asks for (each capability, host namespace and host path);
#  - kplegd accepts exactly its arguments (only the node-specific values are pointed at the test
#    bed: runtime endpoint, API socket path, metrics host), becomes ready, passes its three probes'
#    commands, answers /livez, /readyz and /healthz with 200 and serves the API socket; SIGTERM
#    stops it cleanly.
#
#   manifest_test.sh <build bin dir>
# Exit status: 0 pass, 1 fail, 77 cannot run here (not root; KPLEG_REQUIRE_PRIVILEGED=1 makes
# that a failure).
set -euo pipefail

bin=${1:?usage: manifest_test.sh <bin dir>}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
manifest=$repo/deploy/kplegd-daemonset.yaml

fail() { echo "FAIL: $*"; exit 1; }
skip() {
  [ "${KPLEG_REQUIRE_PRIVILEGED:-0}" = 1 ] && fail "$* (KPLEG_REQUIRE_PRIVILEGED=1 forbids skipping)"
  echo "SKIP: $*"
  exit 77
}
command -v python3 >/dev/null && python3 -c 'import yaml' 2>/dev/null || skip "needs python3-yaml"
command -v jq >/dev/null || skip "needs jq"

# One line per fact: args (one per line after 'arg '), probes, ports, mounts.
facts=$(python3 - "$manifest" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
ds = [d for d in docs if d.get("kind") == "DaemonSet"]
if len(ds) != 1:
    sys.exit("expected one DaemonSet, found %d" % len(ds))
pod = ds[0]["spec"]["template"]["spec"]
c = [c for c in pod["containers"] if c["name"] == "kplegd"]
if len(c) != 1:
    sys.exit("expected one container named kplegd")
c = c[0]
for a in c.get("args", []):
    print("arg", a)
import json
ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
    if probe not in c:
        sys.exit("the kplegd container has no %s" % probe)
    if "exec" in c[probe]:
        print("probe", probe, "exec", json.dumps(c[probe]["exec"]["command"]))
    else:
        g = c[probe]["httpGet"]
        port = g["port"]
        print("probe", probe, "http", g["path"], ports.get(port, port))
for m in c.get("volumeMounts", []):
    print("mount", m["mountPath"])
print("hostPID", pod.get("hostPID", False))
PY
) || fail "$manifest does not parse as expected"

# Least privilege, and every privilege named in deploy/README.md.
python3 - "$manifest" "$repo/deploy/README.md" <<'PY' || fail "the DaemonSet asks for more than least privilege, or deploy/README.md does not name it"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
pod = [d for d in docs if d.get("kind") == "DaemonSet"][0]["spec"]["template"]["spec"]
c = [c for c in pod["containers"] if c["name"] == "kplegd"][0]
readme = open(sys.argv[2]).read()
sc = c.get("securityContext", {}) or {}
psc = pod.get("securityContext", {}) or {}
bad = []
# What kplegd's kernel path needs (deploy/README.md says why, and what each missing one costs).
NEEDED_CAPS = {"BPF", "PERFMON"}
if sc.get("privileged"):
    bad.append("the container is privileged")
caps = sc.get("capabilities", {}) or {}
if [x.upper() for x in caps.get("drop", [])] != ["ALL"]:
    bad.append("capabilities.drop is %s, not [ALL]" % caps.get("drop"))
added = {x.upper().removeprefix("CAP_") for x in caps.get("add", [])}
if added - NEEDED_CAPS:
    bad.append("capabilities.add has %s beyond %s" % (sorted(added - NEEDED_CAPS), sorted(NEEDED_CAPS)))
if sc.get("allowPrivilegeEscalation") is not False:
    bad.append("allowPrivilegeEscalation is not false")
if sc.get("readOnlyRootFilesystem") is not True:
    bad.append("readOnlyRootFilesystem is not true")
seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
if seccomp != "RuntimeDefault":
    bad.append("seccompProfile is %s, not RuntimeDefault" % seccomp)
if pod.get("automountServiceAccountToken") is not False:
    bad.append("automountServiceAccountToken is not false")
if pod.get("hostIPC"):
    bad.append("hostIPC is true")
args = dict(a.split("=", 1) for a in c.get("args", []) if a.startswith("--") and "=" in a)
metrics = args.get("--metrics-address", "")
if metrics.rsplit(":", 1)[0] not in ("127.0.0.1", "[::1]", "localhost"):
    bad.append("--metrics-address %s is not on loopback" % metrics)
# The probes exec kplegctl through the API socket: nothing on the network can starve them, and
# they need no port.
socket_arg = args.get("--socket", "/run/kpleg/kpleg.sock")
for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
    cmd = (c.get(probe, {}).get("exec") or {}).get("command") or []
    if not cmd or not cmd[0].endswith("kplegctl") or "probe" not in cmd:
        bad.append("%s is not an exec of kplegctl probe" % probe)
    elif "--socket=" + socket_arg not in cmd:
        bad.append("%s does not go through the API socket %s" % (probe, socket_arg))
volumes = {v["name"]: v for v in pod.get("volumes", [])}
socket_dir = args.get("--socket", "/run/kpleg/kpleg.sock").rsplit("/", 1)[0]
endpoint = args.get("--runtime-endpoint", "").removeprefix("unix://")
for m in c.get("volumeMounts", []):
    hp = volumes[m["name"]].get("hostPath")
    if hp is None:
        continue
    if m["mountPath"] == socket_dir:
        if m.get("readOnly"):
            bad.append("the API socket's directory %s is read-only: kplegd cannot create its socket" % socket_dir)
    elif not m.get("readOnly"):
        bad.append("hostPath %s is mounted writable" % hp["path"])
    if m["mountPath"] == endpoint and hp.get("type") != "Socket":
        bad.append("the runtime socket's hostPath is of type %s, not Socket" % hp.get("type"))
    if "`%s`" % hp["path"] not in readme:
        bad.append("deploy/README.md does not name the host path `%s`" % hp["path"])
if endpoint not in [m["mountPath"] for m in c.get("volumeMounts", [])]:
    bad.append("the runtime socket %s is not mounted alone (its own hostPath of type Socket)" % endpoint)
for cap in sorted(added):
    if "`CAP_%s`" % cap not in readme:
        bad.append("deploy/README.md does not name `CAP_%s`" % cap)
for ns in ("hostPID", "hostNetwork", "hostIPC"):
    if pod.get(ns) and "`%s`" % ns not in readme:
        bad.append("deploy/README.md does not name `%s`" % ns)
for b in bad:
    print("FAIL: " + b)
if bad:
    sys.exit(1)
print("ok: least privilege (capabilities %s, no privilege escalation, read-only root, %s seccomp, "
      "read-only host mounts but %s), every privilege named in deploy/README.md"
      % (" ".join("CAP_" + x for x in sorted(added)), seccomp, socket_dir))
PY

mapfile -t args < <(sed -n 's/^arg //p' <<<"$facts")
[ "${#args[@]}" -gt 0 ] || fail "the kplegd container has no args"
for a in "${args[@]}"; do
  # Only --flag=value: the run below rewrites the node-specific values in that form.
  case $a in --*=*) ;; *) fail "argument '$a' is not in --flag=value form" ;; esac
done
value_of() {
  local a
  for a in "${args[@]}"; do
    case $a in "$1="*) echo "${a#*=}"; return ;; esac
  done
}
under_mount() {
  local p=$1 m
  while read -r m; do
    case $p/ in "${m%/}"/*) return 0 ;; esac
  done < <(sed -n 's/^mount //p' <<<"$facts")
  return 1
}

grep -qx "hostPID True" <<<"$facts" || fail "hostPID must be true (kernel events carry node pids)"
endpoint=$(value_of --runtime-endpoint)
socket=$(value_of --socket)
metrics=$(value_of --metrics-address)
[ -n "$endpoint" ] && [ -n "$socket" ] && [ -n "$metrics" ] ||
  fail "the args must set --runtime-endpoint, --socket and --metrics-address"
under_mount "${endpoint#unix://}" || fail "runtime socket ${endpoint#unix://} is in no mounted volume"
under_mount "$(dirname "$socket")" || fail "API socket directory of $socket is in no mounted volume"
while read -r _ probe kind path port; do
  [ "$kind" = http ] || continue
  [ "$port" = "${metrics##*:}" ] || fail "$probe targets port $port, kplegd serves on ${metrics##*:}"
done < <(grep '^probe ' <<<"$facts")
echo "ok: manifest consistent (${#args[@]} args, probes exec kplegctl through $socket)"

[ "$(id -u)" = 0 ] || skip "running kplegd needs root (BPF, the test bed's containerd)"

# The same args, with the node-specific values pointed at this machine.
tmp=$(mktemp -d /tmp/kpleg-manifest.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
up=$(bash "$repo/scripts/testbed.sh" up) || fail "the test bed did not come up"
tb_endpoint=${up#KPLEG_RUNTIME_ENDPOINT=}
run_args=()
for a in "${args[@]}"; do
  case $a in
    --runtime-endpoint=*) a=--runtime-endpoint=$tb_endpoint ;;
    --socket=*) a=--socket=$tmp/kpleg.sock ;;
    --metrics-address=*) a=--metrics-address=127.0.0.1:0 ;;
  esac
  run_args+=("$a")
done
"$bin/kplegd" "${run_args[@]}" >"$tmp/out" 2>"$tmp/err" &
pid=$!
deadline=$((SECONDS + 30))
until grep -q 'kplegd ready' "$tmp/err"; do
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/err"; fail "kplegd exited with the manifest's args"; }
  [ "$SECONDS" -lt "$deadline" ] || { cat "$tmp/err"; fail "kplegd not ready within 30 s"; }
  sleep 0.1
done
if [ "${KPLEG_REQUIRE_PRIVILEGED:-0}" = 1 ] && ! grep -q 'kplegd ready: ebpf mode' "$tmp/err"; then
  cat "$tmp/err"
  fail "--mode=auto fell back to relist mode where the kernel path must work"
fi
port=$(grep -o 'on 127\.0\.0\.1:[0-9]*' "$tmp/err" | head -1 | sed 's/.*://')
[ -n "$port" ] || { cat "$tmp/err"; fail "kplegd did not say where it serves its probes"; }
while read -r _ probe kind rest; do
  case $kind in
    exec)
      # The probe's command, with the image's kplegctl and socket path pointed at this run's.
      mapfile -t cmd < <(jq -r '.[]' <<<"$rest")
      run=("$bin/kplegctl")
      for a in "${cmd[@]:1}"; do
        case $a in --socket=*) a=--socket=$tmp/kpleg.sock ;; esac
        run+=("$a")
      done
      out=$("${run[@]}" 2>&1) || { echo "$out"; cat "$tmp/err"; fail "$probe (${cmd[*]}) fails"; }
      echo "ok: $probe (${cmd[*]:1}) passes"
      ;;
    http)
      path=${rest%% *}
      code=$(curl -s --max-time 10 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port$path")
      [ "$code" = 200 ] || { cat "$tmp/err"; fail "$probe $path answered $code, not 200"; }
      echo "ok: $probe $path answers 200"
      ;;
  esac
done < <(grep '^probe ' <<<"$facts")
for path in /livez /readyz /healthz; do
  code=$(curl -s --max-time 10 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port$path")
  [ "$code" = 200 ] || { cat "$tmp/err"; fail "$path answered $code, not 200"; }
done
echo "ok: /livez, /readyz and /healthz answer 200"
"$bin/kplegctl" --socket "$tmp/kpleg.sock" health >/dev/null ||
  fail "kplegctl health over the API socket failed"
echo "ok: API socket serves (kplegctl health)"
kill -TERM "$pid"
status=0
timeout 15 tail --pid="$pid" -f /dev/null || fail "kplegd did not stop within 15 s of SIGTERM"
wait "$pid" || status=$?
pid=
[ "$status" = 0 ] || { cat "$tmp/err"; fail "kplegd exited $status on SIGTERM"; }
echo "PASS: kplegd runs with the DaemonSet's arguments and answers its probes"
