#!/usr/bin/env bash
# deploy/Dockerfile installs the runtime libraries of the image by Debian package name. This
# checks that those packages, with their dependencies and what the debian:12-slim base already
# has (the essential packages and apt), provide every shared library kplegd and kplegctl load.
# A missing one would make the image fail at start on every node.
#
#   image_libraries_test.sh <build bin dir>
# Exit status: 0 pass, 1 a library no package of the image provides, 77 cannot check here.
set -euo pipefail

bin=${1:?usage: image_libraries_test.sh <bin dir>}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dockerfile=$repo/deploy/Dockerfile

skip() {
  if [ "${KPLEG_REQUIRE_PRIVILEGED:-0}" = 1 ]; then
    echo "FAIL: $* (KPLEG_REQUIRE_PRIVILEGED=1 forbids skipping)"
    exit 1
  fi
  echo "SKIP: $*"
  exit 77
}
command -v dpkg-query >/dev/null && command -v apt-cache >/dev/null || skip "needs dpkg and apt"

# The packages the Dockerfile installs: the words after --no-install-recommends up to '&&'.
image_pkgs=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$dockerfile" |
  grep -o -- '--no-install-recommends[^&]*' | sed 's/--no-install-recommends//' | tr -s ' ' '\n' |
  sed '/^$/d' | sort -u)
[ -n "$image_pkgs" ] || { echo "FAIL: no 'apt-get install --no-install-recommends' list in $dockerfile"; exit 1; }

base_pkgs="apt $(dpkg-query -W -f='${Package} ${Essential}\n' | awk '$2 == "yes" {print $1}')"
# Everything those pull in (Depends and Pre-Depends only, as --no-install-recommends does).
# shellcheck disable=SC2086
provided=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
  --no-replaces --no-enhances $image_pkgs $base_pkgs 2>/dev/null | grep -v '^ ' | sed 's/:.*//' |
  sort -u)
for p in $image_pkgs; do
  grep -Fqx "$p" <<<"$provided" || { echo "FAIL: $dockerfile installs $p, which apt does not know (apt-get update not run?)"; exit 1; }
done

for b in kplegd kplegctl; do [ -x "$bin/$b" ] || { echo "FAIL: $bin/$b not built"; exit 1; }; done
# Every shared library either binary loads, once.
libs=$(ldd "$bin/kplegd" "$bin/kplegctl" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u)
status=0
checked=0
while read -r lib path; do
  owner=$(dpkg -S "$path" 2>/dev/null || dpkg -S "$(readlink -f "$path")" 2>/dev/null || true)
  owner=${owner%%:*}
  if [ -z "$owner" ]; then
    echo "FAIL: $lib ($path) is provided by no Debian package"
    status=1
    continue
  fi
  checked=$((checked + 1))
  if ! grep -Fqx "$owner" <<<"$provided"; then
    echo "FAIL: $lib comes from $owner, which deploy/Dockerfile does not install"
    status=1
  fi
done <<<"$libs"
[ "$checked" -gt 0 ] || { echo "FAIL: ldd found no shared libraries"; exit 1; }
[ "$status" = 0 ] && echo "PASS: the image's packages provide all $checked shared libraries of kplegd and kplegctl"
exit $status
