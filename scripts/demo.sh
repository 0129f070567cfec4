#!/usr/bin/env bash
# The main job on a fresh machine: installs what is needed, builds, brings up the local
# containerd test bed, starts kplegd against it, runs a sample workload (pods that start, crash,
# get OOM-killed and are removed) and streams the events with `kplegctl watch`.
# Ctrl-C stops everything and removes what the demo made.
#
#   KPLEG_DEMO_SECONDS  stop by itself after this many seconds (default: run until Ctrl-C)
#   KPLEG_DEMO_OUTPUT   table (default) or json: the kplegctl watch output format
#   KPLEG_BUILD_DIR     build directory (default <repo>/build)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KPLEG_BUILD_DIR:-$repo/build}
seconds=${KPLEG_DEMO_SECONDS:-0}
format=${KPLEG_DEMO_OUTPUT:-table}
cd "$repo"

say() { printf '\033[1m[demo]\033[0m %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  echo "demo: run as root (kplegd loads BPF programs; the test bed runs containerd)" >&2
  exit 1
fi

say "installing dependencies (Debian packages) and building"
bash scripts/install-deps.sh >&2
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target kplegd kplegctl kpleg-load -j "$(nproc)" >&2

say "starting the local containerd test bed"
bed_was_up=0
bash scripts/testbed.sh status >/dev/null 2>&1 && bed_was_up=1
endpoint=$(bash scripts/testbed.sh up | sed -n 's/^KPLEG_RUNTIME_ENDPOINT=//p')
[ -n "$endpoint" ] || { echo "demo: the test bed did not start" >&2; exit 1; }

rundir=$(mktemp -d /tmp/kpleg-demo.XXXXXX)
socket=$rundir/kpleg.sock
ns=kpleg-demo
daemon_pid="" watch_pid="" workload_pid=""

cleanup() {
  trap - INT TERM EXIT
  say "stopping and cleaning up"
  # The workload's running kpleg-load too (a child, or a grandchild through $(...)): killing the
  # loop alone would leave it making a pod after the clean-up below. The loop is frozen first
  # so that it starts nothing new while its descendants are collected.
  local kids="" k
  descendants() { local c; for c in $(pgrep -P "$1" || true); do echo "$c"; descendants "$c"; done; }
  if [ -n "$workload_pid" ]; then
    kill -STOP "$workload_pid" 2>/dev/null || true
    kids=$(descendants "$workload_pid")
  fi
  for p in $workload_pid $watch_pid $kids; do kill "$p" 2>/dev/null || true; done
  [ -z "$workload_pid" ] || kill -CONT "$workload_pid" 2>/dev/null || true
  # Not children of this shell, so no wait(1): poll, for 5 s at most.
  for _ in $(seq 50); do
    alive=0
    for k in $kids; do kill -0 "$k" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  "$build/bin/kpleg-load" --runtime-endpoint "$endpoint" clean --namespace "$ns" >/dev/null 2>&1 || true
  if [ -n "$daemon_pid" ]; then
    kill "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  # A test bed that was already up before the demo is someone else's: leave it running.
  [ "$bed_was_up" = 1 ] || bash scripts/testbed.sh down >&2 || true
  rm -rf "$rundir"
}
trap cleanup INT TERM EXIT

say "starting kplegd (log: $rundir/kplegd.log)"
"$build/bin/kplegd" --runtime-endpoint "$endpoint" --socket "$socket" \
  --metrics-address 127.0.0.1:0 >"$rundir/kplegd.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do
  [ -S "$socket" ] && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$rundir/kplegd.log" >&2; exit 1; }
  sleep 0.1
done
[ -S "$socket" ] || { echo "demo: kplegd did not open $socket" >&2; cat "$rundir/kplegd.log" >&2; exit 1; }
grep -m1 "running in" "$rundir/kplegd.log" >&2 || true

load() { "$build/bin/kpleg-load" --runtime-endpoint "$endpoint" "$@"; }
workload() {
  local round=0
  while true; do
    round=$((round + 1))
    say "workload round $round: a web pod, a crashing pod, an OOM-killed pod"
    web=$(load run --namespace "$ns" --name-prefix "web-$round" --containers 2 --command "sleep 1000000")
    load run --namespace "$ns" --name-prefix "crash-$round" --command "sh -c 'sleep 2; exit 3'" >/dev/null
    load run --namespace "$ns" --name-prefix "oom-$round" --memory-limit 33554432 \
      --command "sh -c 'sleep 3; dd if=/dev/zero of=/dev/null bs=256M count=1'" >/dev/null
    sleep 6
    sandbox=$(printf '%s\n' "$web" | sed -n 's/.*"sandbox_id":"\([0-9a-f]*\)".*/\1/p' | head -1)
    say "workload round $round: removing the web pod"
    [ -n "$sandbox" ] && load remove-pod "$sandbox" >/dev/null
    load clean --namespace "$ns" >/dev/null
    sleep 4
  done
}
workload >&2 &
workload_pid=$!

say "streaming events (Ctrl-C to stop)"
if [ "$format" = json ]; then
  "$build/bin/kplegctl" --socket "$socket" watch -o json &
else
  "$build/bin/kplegctl" --socket "$socket" watch &
fi
watch_pid=$!

if [ "$seconds" -gt 0 ]; then
  sleep "$seconds"
else
  wait "$watch_pid"
fi
