#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in their own build directory and runs the cgroup path
# fuzzer for a bounded time. Exits non-zero when the fuzzer finds a crash, a sanitizer error or
# a broken invariant; the input that did it is kept under <build>/fuzz-work/*/artifacts/.
#
#   FUZZ_SECONDS   how long to fuzz (default 60)
#   FUZZ_BUILD_DIR build directory (default <repo>/build-fuzz)
#   FUZZ_JOBS      parallel build jobs (default 2)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$repo/build-fuzz}
seconds=${FUZZ_SECONDS:-60}

cmake -S "$repo" -B "$build" -G Ninja \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DKPLEG_FUZZ=ON >/dev/null
cmake --build "$build" --target cgroup_path_fuzz -j "${FUZZ_JOBS:-2}"

work=$build/fuzz-work/cgroup_path
mkdir -p "$work/corpus" "$work/artifacts"
# New inputs go to the first corpus directory (the build's), never into the checked-in seeds.
# max_len goes just past the parser's 4096-byte limit so both sides of it are exercised.
if ! "$build/fuzz/cgroup_path_fuzz" \
  -max_total_time="$seconds" -max_len=4160 -print_final_stats=1 \
  -dict="$repo/tests/fuzz/cgroup_path.dict" \
  -artifact_prefix="$work/artifacts/" \
  "$work/corpus" "$repo/tests/fuzz/corpus/cgroup_path"; then
  echo "fuzz.sh: cgroup_path_fuzz failed; reproducer(s) in $work/artifacts/" >&2
  exit 1
fi
echo "fuzz.sh: cgroup_path_fuzz ran ${seconds}s without a failure"
