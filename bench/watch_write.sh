#!/usr/bin/env bash
# What one Watch event costs the serving process, by writer and consumer
# (kpleg-bench-watch-write; see bench/watch_write_cost.cc): every writer (sync, callback, async,
# direct) with every reader (grpc, h2), --repeats times, one after another.
# Writes <out>/runs.jsonl (one JSON object per run) and <out>/summary.md (medians and ranges).
set -euo pipefail
usage() {
  echo "usage: bench/watch_write.sh --bin-dir DIR --out DIR [--repeats N] [--events N] [--gap-ms N]" >&2
  exit 2
}
BIN_DIR="" OUT="" REPEATS=3 EVENTS=200 GAP_MS=50
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin-dir) BIN_DIR="${2:?}"; shift 2 ;;
    --out) OUT="${2:?}"; shift 2 ;;
    --repeats) REPEATS="${2:?}"; shift 2 ;;
    --events) EVENTS="${2:?}"; shift 2 ;;
    --gap-ms) GAP_MS="${2:?}"; shift 2 ;;
    *) usage ;;
  esac
done
[[ -n "$BIN_DIR" && -n "$OUT" ]] || usage
[[ -x "$BIN_DIR/kpleg-bench-watch-write" ]] || { echo "bench/watch_write.sh: no $BIN_DIR/kpleg-bench-watch-write" >&2; exit 2; }
mkdir -p "$OUT"
: >"$OUT/runs.jsonl"
for ((i = 1; i <= REPEATS; i++)); do
  for writer in sync callback async direct; do
    for reader in grpc h2; do
      "$BIN_DIR/kpleg-bench-watch-write" --writer "$writer" --reader "$reader" --events "$EVENTS" \
        --gap-ms "$GAP_MS" >>"$OUT/runs.jsonl"
    done
  done
done
python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import collections, json, statistics, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
by = collections.defaultdict(list)
for r in rows:
    by[(r["writer"], r["reader"])].append(r)
def cell(rs, key, fmt):
    v = [r[key] for r in rs]
    return f"{fmt % statistics.median(v)} ({fmt % min(v)}–{fmt % max(v)})"
print(f"{rows[0]['events']} events {rows[0]['gap_ms']} ms apart per run; median (min–max) of the runs.\n")
print("| writer | reader | runs | all read | other threads: wakeups/event | other threads: µs/event "
      "| publisher: wakeups/event | publisher: µs/event | process: µs/event |")
print("|---|---|---|---|---|---|---|---|---|")
for w in ("sync", "callback", "async", "direct"):
    for rd in ("grpc", "h2"):
        rs = by[(w, rd)]
        if not rs:
            continue
        for r in rs:
            r["total"] = r["other_threads_cpu_us_per_event"] + r["publisher_cpu_us_per_event"]
        print(f"| {w} | {rd} | {len(rs)} | {'yes' if all(r['all_read'] for r in rs) else 'NO'} "
              f"| {cell(rs, 'other_threads_runs_per_event', '%.2f')} "
              f"| {cell(rs, 'other_threads_cpu_us_per_event', '%.0f')} "
              f"| {cell(rs, 'publisher_runs_per_event', '%.2f')} "
              f"| {cell(rs, 'publisher_cpu_us_per_event', '%.0f')} | {cell(rs, 'total', '%.0f')} |")
PY
