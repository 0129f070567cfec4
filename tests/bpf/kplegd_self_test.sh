#!/bin/sh
# `kplegd --self-test` on this host's kernel, run as an operator runs it (README.md,
# deploy/README.md): it must exit 0 and end with its PASS line. Without root it is skipped (77),
# unless KPLEG_REQUIRE_PRIVILEGED=1 makes that a failure, like the other BPF tests.
kplegd=${1:?usage: kplegd_self_test.sh <kplegd>}
if [ "$(id -u)" != 0 ]; then
  echo "kplegd --self-test needs root to load BPF programs and make cgroups"
  [ "${KPLEG_REQUIRE_PRIVILEGED:-}" = 1 ] && exit 1
  exit 77
fi
out=$("$kplegd" --self-test 2>&1)
rc=$?
printf '%s\n' "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: kplegd --self-test exited $rc"; exit 1; }
printf '%s\n' "$out" | tail -n 1 | grep -q '^kpleg self-test: kernel .*: PASS$' ||
  { echo "FAIL: no PASS line"; exit 1; }
