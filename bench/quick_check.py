#!/usr/bin/env python3
"""bench/run.sh --quick's pass/fail: the run wrote its results, every mode was measured, and
ebpf mode had no missed or duplicated transitions and stayed within its CRI-call bound.

  quick_check.py <result dir>
"""
import json
import os
import sys

out = sys.argv[1]
problems = []
windows = []
try:
    with open(os.path.join(out, "windows.jsonl")) as f:
        windows = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(out, "results.json")) as f:
        r = json.load(f)
except (OSError, ValueError) as e:
    problems.append(f"no results ({e})")
    r = {}
if not windows:
    problems.append("no measurement windows")
for f in ("summary.md", "node_cpu_n3_one.dat"):
    p = os.path.join(out, f)
    if not os.path.exists(p) or not os.path.getsize(p):
        problems.append(f"{f} is missing or empty")
if "bpf" not in r or "exec_storm" not in r.get("bpf", {}):
    problems.append("no BPF benchmark result")
modes = {w["mode"] for w in windows}
if modes != {"none", "ebpf", "relist"}:
    problems.append(f"modes measured: {sorted(modes)} (want none, ebpf, relist)")
churn = [w for w in windows if w["rate"] > 0 and w["mode"] == "ebpf"]
if not churn:
    problems.append("no ebpf churn window")
runtime = os.environ.get("KPLEG_TESTBED_RUNTIME") or "containerd-1.6"
# A runtime that streams its events (containerd 2.x) confirms without calls (0.00-0.04 measured).
# containerd 1.6 has no event stream: one look per start and one per death is the floor, plus the
# removal sweep's lists. The looks repeated while the runtime lags behind the kernel are left out
# of the bound: they follow the machine's load (0.4-0.8 per lifecycle in one 10 s window on a
# shared 2-CPU machine), not the design; they are printed.
limit = float(os.environ.get("KPLEG_BENCH_MAX_CALLS_PER_LIFECYCLE", "3" if runtime == "containerd-1.6" else "2"))
for e in churn:
    where = f"N={e['n']} {e['workload']}"
    if not e.get("expected"):
        problems.append(f"{where}: the churn made no transitions")
    calls = e.get("cri_calls_per_lifecycle")
    repeated = e.get("retries_per_lifecycle") or 0.0
    if calls is None:
        problems.append(f"{where}: no CRI call count")
    elif calls - repeated > limit:
        problems.append(f"{where}: ebpf made {calls - repeated:.2f} CRI calls per container lifecycle "
                        f"besides {repeated:.2f} looks repeated while the runtime lagged (at most {limit:g})")
    # Without a stream, at most one first look per start and one per death: a look per removal,
    # or a second look per signal, shows here whatever the runtime's lag did to the retries.
    looks, retries = e.get("looks_per_lifecycle"), e.get("retries_per_lifecycle")
    if runtime == "containerd-1.6":
        if looks is None or retries is None:
            problems.append(f"{where}: no look count")
        elif looks - retries > 2.1:
            problems.append(f"{where}: ebpf made {looks - retries:.2f} first looks per container lifecycle "
                            f"(one per start and one per death: at most 2.1)")
    if e.get("missed") or e.get("duplicated"):
        problems.append(f"{where}: ebpf missed {e.get('missed')} {e.get('missed_detail')} duplicated "
                        f"{e.get('duplicated')} of {e.get('expected')}")
    print(f"bench quick: {where}: ebpf {e.get('expected')} transitions, missed {e.get('missed')}, duplicated "
          f"{e.get('duplicated')}, {calls if calls is None else round(calls, 2)} CRI calls per lifecycle "
          f"({round(repeated, 2)} of them repeated looks), achieved {(e.get('churn') or {}).get('achieved_rate')}/s", file=sys.stderr)
    woke = e.get("loop_wakeups_per_lifecycle_by_cause") or {}
    if woke:
        print(f"bench quick: {where}: ebpf event loop wakeups per lifecycle by cause: "
              + ", ".join(f"{k} {v:.2f}" for k, v in sorted(woke.items(), key=lambda kv: -kv[1])),
              file=sys.stderr)
if r.get("error"):
    problems.append("driver error: " + r["error"])
for p in problems:
    print("bench quick: FAIL:", p, file=sys.stderr)
print("bench quick:", "FAIL" if problems else "PASS", file=sys.stderr)
sys.exit(1 if problems else 0)
