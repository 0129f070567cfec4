# shellcheck shell=bash
# Pinned tools built once into a cache outside the source tree (scripts/crictl.sh, kubelet.sh,
# runtimes.sh, virtiofsd.sh). Sourced; the caller defines log and die.
#
# A tool lives in <cache>/<name>-<version>/bin and is complete once <cache>/<name>-<version>/ok
# exists: a build goes into a temporary directory beside it, renamed into place at the end, so an
# interrupted build never looks complete. Concurrent callers build once: the others wait on
# <cache>/.<name>-<version>.lock and then find the cache complete.

# find_go WHAT: the go command ($GO, go on PATH, else /usr/local/go/bin/go); WHAT says what needs
# it in the error when there is none.
find_go() {
  if [ -n "${GO:-}" ]; then
    command -v "$GO" >/dev/null || die "GO=$GO is not a command"
    command -v "$GO"
  elif command -v go >/dev/null; then
    command -v go
  elif [ -x /usr/local/go/bin/go ]; then
    echo /usr/local/go/bin/go
  else
    die "no Go toolchain (go on PATH or /usr/local/go/bin/go): $1; install Go, or set GO=/path/to/go"
  fi
}

# cached_build CACHE NAME VERSION "PROGRAMS" BUILDER ARGS...: prints the bin dir of NAME-VERSION,
# after running "BUILDER <tmp> ARGS..." to build PROGRAMS (space-separated) into <tmp>/bin when
# the cache lacks one of them. What BUILDER prints on stdout goes into the ok file. The lock is
# waited for TOOL_LOCK_WAIT_S seconds (default 1200).
cached_build() {
  local cache=$1 name=$2 version=$3 programs=$4 builder=$5 dir tmp start lock wait_s
  shift 5
  dir=$cache/$name-$version
  wait_s=${TOOL_LOCK_WAIT_S:-1200}
  if tool_complete "$dir" "$programs"; then
    echo "$dir/bin"
    return 0
  fi
  mkdir -p "$cache"
  exec {lock}>"$cache/.$name-$version.lock"
  flock -w "$wait_s" "$lock" || die "another build of $name $version held its lock for $wait_s s"
  if tool_complete "$dir" "$programs"; then
    echo "$dir/bin"
    return 0
  fi
  tmp=$(mktemp -d "$cache/.$name-$version.XXXXXX")
  chmod 0755 "$tmp"
  mkdir -p "$tmp/bin"
  # shellcheck disable=SC2064  # $tmp is fixed now
  trap "rm -rf '$tmp'" EXIT
  start=$SECONDS
  "$builder" "$tmp" "$@" >"$tmp/ok.part"
  tool_complete "$tmp" "$programs" x || die "the build of $name $version made no $programs"
  {
    echo "version $version"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    cat "$tmp/ok.part"
    echo "seconds $((SECONDS - start))"
  } >"$tmp/ok"
  rm -f "$tmp/ok.part"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT
  log "built $name $version in $dir in $((SECONDS - start)) s"
  echo "$dir/bin"
}

# tool_complete DIR "PROGRAMS" [x]: DIR/ok exists (unless a third argument is given) and every
# program is executable in DIR/bin.
tool_complete() {
  local p
  [ -n "${3:-}" ] || [ -f "$1/ok" ] || return 1
  for p in $2; do [ -x "$1/bin/$p" ] || return 1; done
}
