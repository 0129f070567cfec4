#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for a bounded time, as many at once as
# there are CPUs: the cgroup path parser, the runtime event decoder against the generated
# protobuf parser, the ring-buffer decoder with sequences of kernel events applied to the
# cgroup index, and the consumer API's request handlers through the real gRPC server over a unix
# socket. Exits non-zero when a fuzzer finds a crash, a sanitizer error or a broken invariant;
# the input that did it is kept under <build>/fuzz-work/*/artifacts/.
#
#   FUZZ_SECONDS   how long to fuzz each target (default 60)
#   FUZZ_BUILD_DIR build directory (default <repo>/build-fuzz); one already configured with clang
#                  and -DKPLEG_FUZZ=ON (scripts/test.sh's) is used as it is, nothing built twice
#   FUZZ_JOBS      parallel build jobs and fuzzers at once (default: the number of CPUs)
#
#   scripts/fuzz.sh --minimize   instead of fuzzing, shrinks each checked-in seed corpus
#                                (tests/fuzz/corpus/<target>) to the smallest set of its inputs
#                                that keeps the same coverage (libFuzzer's -merge=1); run it after
#                                adding seeds, and commit the result.
set -euo pipefail

minimize=0
case ${1:-} in
  --minimize) minimize=1 ;;
  "") ;;
  *) echo "scripts/fuzz.sh: unknown argument '$1' (only --minimize)" >&2; exit 2 ;;
esac

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$repo/build-fuzz}
seconds=${FUZZ_SECONDS:-60}

jobs=${FUZZ_JOBS:-$(nproc)}

if ! grep -q '^KPLEG_FUZZ:BOOL=ON$' "$build/CMakeCache.txt" 2>/dev/null; then
  cmake -S "$repo" -B "$build" -G Ninja \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DKPLEG_FUZZ=ON >/dev/null
fi
cmake --build "$build" --target cgroup_path_fuzz event_decoder_fuzz kernel_events_fuzz \
  api_requests_fuzz cri_request_subject_fuzz h2_client_fuzz -j "$jobs"

# minimize_corpus NAME [libFuzzer flags...]: replaces NAME's seeds by a -merge=1 of them.
minimize_corpus() {
  local name=$1 seeds=$repo/tests/fuzz/corpus/$1 out
  shift
  out=$(mktemp -d)
  "$build/fuzz/${name}_fuzz" -merge=1 "$@" "$out" "$seeds" >"$out.log" 2>&1 ||
    { cat "$out.log" >&2; rm -rf "$out" "$out.log"; return 1; }
  echo "fuzz.sh: $name: $(ls "$seeds" | wc -l) seeds -> $(ls "$out" | wc -l)"
  # Nothing to drop: the seeds keep their names (some say what they are).
  if [ -n "$(ls "$out")" ] && [ "$(ls "$out" | wc -l)" -lt "$(ls "$seeds" | wc -l)" ]; then
    rm -rf "$seeds"
    mkdir -p "$seeds"
    cp "$out"/* "$seeds"/
  fi
  rm -rf "$out" "$out.log"
}
if [ "$minimize" = 1 ]; then
  minimize_corpus cgroup_path -dict="$repo/tests/fuzz/cgroup_path.dict"
  minimize_corpus event_decoder -close_fd_mask=2
  minimize_corpus kernel_events
  minimize_corpus api_requests -detect_leaks=0
  minimize_corpus cri_request_subject
  minimize_corpus h2_client -detect_leaks=0
  exit 0
fi

# run_fuzzer NAME [libFuzzer flags...]: fuzzes NAME for $seconds from its checked-in seeds, in
# the background (its output in its work directory); up to $jobs at once.
pids=()
names=()
run_fuzzer() {
  local name=$1 work
  shift
  work=$build/fuzz-work/$name
  mkdir -p "$work/corpus" "$work/artifacts"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 1; done
  # New inputs go to the first corpus directory (the build's), never into the checked-in seeds.
  "$build/fuzz/${name}_fuzz" \
    -max_total_time="$seconds" -print_final_stats=1 "$@" \
    -artifact_prefix="$work/artifacts/" \
    "$work/corpus" "$repo/tests/fuzz/corpus/$name" >"$work/output.log" 2>&1 &
  pids+=($!)
  names+=("$name")
}

# max_len goes just past the parser's 4096-byte limit so both sides of it are exercised.
run_fuzzer cgroup_path -max_len=4160 -dict="$repo/tests/fuzz/cgroup_path.dict"
# Runtime events are a few KiB; the generated parser's logging of invalid UTF-8 is noise here.
run_fuzzer event_decoder -max_len=8192 -close_fd_mask=2
# Ring-buffer records and event sequences: a cgroup record is 552 bytes; a few dozen make a
# sequence.
run_fuzzer kernel_events -max_len=16384
# Sequences of API requests: each is a few bytes, a raw one up to a bit past the server's
# 4096-byte request limit. Leak detection is off (gRPC's process-wide state; see the target).
# The target fails a call that takes 10 s itself; -timeout is the backstop for a hang elsewhere.
run_fuzzer api_requests -max_len=8192 -timeout=60 -detect_leaks=0
# The CRI endpoint's requests, read for the stuck-call watchdog: a request is a few hundred bytes.
run_fuzzer cri_request_subject -max_len=4096
# What a hostile runtime sends kplegd's HTTP/2 client: a call ends within its 100 ms deadline or
# at the connection's end, so -timeout only catches a hang.
run_fuzzer h2_client -max_len=4096 -timeout=20 -detect_leaks=0

failed=0
for i in "${!pids[@]}"; do
  name=${names[$i]}
  work=$build/fuzz-work/$name
  if wait "${pids[$i]}"; then
    echo "fuzz.sh: ${name}_fuzz ran ${seconds}s without a failure ($(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$work/output.log" | grep -o '[0-9]*$' || echo '?') runs)"
  else
    tail -n 40 "$work/output.log" >&2
    echo "fuzz.sh: ${name}_fuzz failed; its output in $work/output.log, reproducer(s) in $work/artifacts/" >&2
    failed=1
  fi
done
exit $failed
