#!/usr/bin/env bash
# The kubelet as users run it, on the benchmark's test bed: tests/kubelet/kubelet_e2e.sh's runs
# (an unmodified kubelet, standalone, EventedPLEG on, a sleeper pod and crash-looping pods) with
# each window's CPU of the kubelet, the runtime (containerd + shims) and kplegd:
#   direct   kubelet -> runtime (on containerd 1.6 the kubelet relists every second; on 2.x it
#            has the runtime's event stream, its own event path); kplegd beside only timestamps
#            deaths and starts, its CPU is not counted
#   kpleg    kubelet -> kplegd --cri-listen --cri-events kpleg -> runtime
#   runtime  the same with the runtime's own GetContainerEvents forwarded
#
#   bench/kubelet.sh <bin dir> <out dir>
# Needs KPLEG_RUNTIME_ENDPOINT (the test bed) and KPLEG_KUBELET_RUNTIME_CGROUP (a cgroup2
# directory holding the runtime and its shims); nothing else may use that runtime meanwhile (the
# kubelet stops every pod it did not start). Writes <out dir>/kubelet.json and kubelet.md.
set -euo pipefail
bin=${1:?usage: bench/kubelet.sh <bin dir> <out dir>}
out=${2:?usage: bench/kubelet.sh <bin dir> <out dir>}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$out/kubelet"
rc=0
KPLEG_KUBELET_PHASES="direct kpleg runtime" KPLEG_KUBELET_ANALYSIS_DIR=$out/kubelet \
  KPLEG_KUBELET_WINDOW=${KPLEG_BENCH_KUBELET_WINDOW:-40} \
  KPLEG_KUBELET_DIRECT_WINDOW=${KPLEG_BENCH_KUBELET_WINDOW:-40} \
  KPLEG_KUBELET_IDLE_WINDOW=${KPLEG_BENCH_KUBELET_IDLE_WINDOW:-20} \
  bash "$here/../tests/kubelet/kubelet_e2e.sh" "$bin" "$out/kubelet/report.txt" >"$out/kubelet/run.log" 2>&1 || rc=$?
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
runs = {}
for n in ("direct", "kpleg", "runtime"):
    try:
        runs[n] = json.load(open(os.path.join(out, "kubelet", n + ".json")))
    except (OSError, ValueError):
        pass
label = {"direct": "kubelet → runtime", "kpleg": "kubelet → kplegd --cri-listen (--cri-events kpleg) → runtime",
         "runtime": "kubelet → kplegd --cri-listen (--cri-events runtime) → runtime"}
L = ["| path | kubelet CPU m | runtime CPU m | kplegd CPU m | node CPU m | death → restart p50 ms (first / later) | "
     "death → kubelet noticed p50 ms | kubelet CRI calls/min | kplegd CRI calls/min |",
     "|---|---|---|---|---|---|---|---|---|"]
res = {}
for n, a in runs.items():
    c = {k: v * 1000 / 60 for k, v in (a.get("cpu_s_per_min") or {}).items()}
    kp = c.get("kplegd") if n != "direct" else None
    node = c.get("kubelet", 0) + c.get("runtime", 0) + (kp or 0)
    med = lambda k: (a.get(k) or {}).get("median")
    f = lambda v, d=0: "–" if v is None else f"{v:.{d}f}"
    calls = a.get("calls_per_min_total") if n != "direct" else None
    L.append(f"| {label[n]} | {f(c.get('kubelet'), 1)} | {f(c.get('runtime'), 1)} | {f(kp, 1)} | {f(node, 1)} | "
             f"{f(med('first_restart_ms'))} / {f(med('later_restart_ms'))} | {f(med('kubelet_noticed_ms'))} | "
             f"{f(calls)} | {f(a.get('own_calls_per_min_total'))} |")
    res[n] = {"cpu_millicores": c, "node_millicores": node, "first_restart_ms": a.get("first_restart_ms"),
              "later_restart_ms": a.get("later_restart_ms"), "kubelet_noticed_ms": a.get("kubelet_noticed_ms"),
              "hint_received_ms": a.get("hint_received_ms"), "kubelet_calls_per_min": calls,
              "kplegd_calls_per_min": a.get("own_calls_per_min_total"), "window_s": a.get("window_s"),
              "deaths": a.get("deaths")}
json.dump(res, open(os.path.join(out, "kubelet.json"), "w"), indent=1)
open(os.path.join(out, "kubelet.md"), "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
exit $rc
