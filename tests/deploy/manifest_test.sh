#!/usr/bin/env bash
# deploy/kplegd-daemonset.yaml, checked without a cluster:
#  - it parses, and its kplegd container is consistent with itself: the probes' named port is
#    the port of --metrics-address; the runtime socket and the API socket lie in mounted volumes;
#  - kplegd accepts exactly its arguments (only the node-specific values are pointed at the test
#    bed: runtime endpoint, API socket path, metrics host), becomes ready, answers the liveness
#    and readiness probes' paths with 200 and serves the API socket; SIGTERM stops it cleanly.
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
ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
for probe in ("livenessProbe", "readinessProbe"):
    g = c[probe]["httpGet"]
    port = g["port"]
    print("probe", probe, g["path"], ports.get(port, port))
for m in c.get("volumeMounts", []):
    print("mount", m["mountPath"])
print("hostPID", pod.get("hostPID", False))
print("privileged", c.get("securityContext", {}).get("privileged", False))
PY
) || fail "$manifest does not parse as expected"

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
grep -qx "privileged True" <<<"$facts" || fail "the kplegd container must be privileged (BPF)"
endpoint=$(value_of --runtime-endpoint)
socket=$(value_of --socket)
metrics=$(value_of --metrics-address)
[ -n "$endpoint" ] && [ -n "$socket" ] && [ -n "$metrics" ] ||
  fail "the args must set --runtime-endpoint, --socket and --metrics-address"
under_mount "${endpoint#unix://}" || fail "runtime socket ${endpoint#unix://} is in no mounted volume"
under_mount "$(dirname "$socket")" || fail "API socket directory of $socket is in no mounted volume"
while read -r _ probe path port; do
  [ "$port" = "${metrics##*:}" ] || fail "$probe targets port $port, kplegd serves on ${metrics##*:}"
done < <(grep '^probe ' <<<"$facts")
echo "ok: manifest consistent (${#args[@]} args, probes on port ${metrics##*:})"

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
while read -r _ probe path _; do
  code=$(curl -s --max-time 10 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port$path")
  [ "$code" = 200 ] || { cat "$tmp/err"; fail "$probe $path answered $code, not 200"; }
  echo "ok: $probe $path answers 200"
done < <(grep '^probe ' <<<"$facts")
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
