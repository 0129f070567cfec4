#!/usr/bin/env python3
"""What lifecycle tracking costs the node: kplegd --mode=ebpf and --mode=relist, each alone
against a private containerd, against no daemon at all, under the same open-loop workloads.

For each pod count N (one container per pod) and each workload (idle; churn at each rate in one
pod, and spread over N/5 pods), the three modes run in blocks -- one mode through every workload
-- interleaved over --repeats repeats (see kbench/cells.py). Each window records the daemon's
cgroup CPU, its BPF programs' run time, containerd's and its shims' cgroup CPU, the machine's
load, the daemon's RSS and BPF maps, its CRI calls by method, its threads' CPU and wake-ups, and
every transition the churn made against what the daemon's Watch consumer received. Then, at
--burst-at pods, a burst: every pod removed within --burst-s seconds and as many made again.

Writes windows.jsonl (one line per window), results.json, summary.md and the .dat files
bench/plots.gp draws. `compare.py --rewrite-from DIR` makes summary.md and the .dat files again
from a run's windows.jsonl. Standard library only; run through bench/run.sh.
"""

import argparse
import datetime
import json
import os
import shutil
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kbench import cells, report  # noqa: E402
from kbench.measure import MiB, Cgroup, log, machine_info  # noqa: E402
from kbench.parts import Pods, Runtime, start_prefix_proxy  # noqa: E402


class Interrupted(Exception):
    pass


def on_signal(signum, _frame):
    raise Interrupted(f"signal {signum}")


def write_outputs(out, results):
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({k: v for k, v in results.items() if k != "windows"}, f, indent=1)
    text, rows = report.summary(results)
    report.write_dat(out, rows, results["windows"])
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)


def load_windows(out):
    ws = []
    with open(os.path.join(out, "windows.jsonl")) as f:
        for line in f:
            ws.append(json.loads(line))
    return ws


def rewrite(out):
    with open(os.path.join(out, "results.json")) as f:
        results = json.load(f)
    results["windows"] = load_windows(out)
    write_outputs(out, results)
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--rewrite-from":
        return rewrite(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--endpoint", required=True, help="CRI endpoint of the private test bed")
    ap.add_argument("--containerd-pid", type=int, required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--cgroup-root", required=True, help="cgroup2 directory for this run's cgroups (made here)")
    ap.add_argument("--cgroup-prefix-name", required=True,
                    help="top-level cgroup the benchmark's pods are created under (and the daemons track)")
    ap.add_argument("--pid-file", help="where to write the prefix forwarder's pid (for the caller's cleanup)")
    ap.add_argument("--counts", default="10,110", help="pod counts N")
    ap.add_argument("--rates", default="0,1,5,10,20", help="churn rates, transitions per second (0: idle)")
    ap.add_argument("--layouts", default="one,spread", help="one: churn in one pod; spread: over N/5 pods")
    ap.add_argument("--plan", default="",
                    help="rates per N and layout instead of --rates x --layouts, e.g. "
                         "'10=one:10;spread:10 110=one:1,5,10,20;spread:10,20'")
    ap.add_argument("--modes", default="none,ebpf,relist")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every cell")
    ap.add_argument("--window", type=float, default=15, help="seconds per window")
    ap.add_argument("--settle", type=float, default=8, dest="settle_s")
    ap.add_argument("--warmup", type=float, default=4, dest="warmup_s",
                    help="seconds of churn a daemon sees before its first window, not measured (0: none)")
    ap.add_argument("--warmup-rate", type=float, default=10)
    ap.add_argument("--max-live", type=int, default=4, help="churn containers running at once")
    ap.add_argument("--closed-loop", action="store_true",
                    help="each churn tick after the previous call returned (the quick run's CRI-call bound "
                         "was set so), not on its schedule")
    ap.add_argument("--burst-at", type=int, default=110, help="N of the burst (0: none)")
    ap.add_argument("--burst-s", type=float, default=5)
    ap.add_argument("--burst-window", type=float, default=45)
    ap.add_argument("--thread-rate", type=float, default=10, help="rate of the per-thread table")
    ap.add_argument("--relist-period", default="1s")
    ap.add_argument("--pod-mib", type=float, default=20, help="memory per pod to plan with")
    ap.add_argument("--mem-reserve-gib", type=float, default=2)
    ap.add_argument("--bpf-json", help="kpleg-bench-bpf result to fold into the results")
    ap.add_argument("--command", default=" ".join(sys.argv))
    cfg = ap.parse_args()
    cfg.kplegd = os.path.join(cfg.bin_dir, "kplegd")
    cfg.kpleg_load = os.path.join(cfg.bin_dir, "kpleg-load")
    cfg.watch = os.path.join(cfg.bin_dir, "kpleg-bench-watch")
    cfg.prefix_proxy = os.path.join(cfg.bin_dir, "kpleg-bench-cri-prefix")
    cfg.consumer = "watch"
    cfg.load_endpoint = cfg.endpoint
    cfg.pod_bytes = int(cfg.pod_mib * MiB)
    cfg.mem_reserve = int(cfg.mem_reserve_gib * (1 << 30))
    cfg.current_n = 0
    counts = [int(x) for x in cfg.counts.split(",") if x]
    cfg.rates = [float(x) for x in cfg.rates.split(",") if x]
    cfg.layouts = [x for x in cfg.layouts.split(",") if x]
    cfg.modes = [x for x in cfg.modes.split(",") if x]
    plan, cfg.plan = cfg.plan, {}
    for item in plan.split():
        n, _, layouts = item.partition("=")
        cfg.plan[int(n)] = {lay: [float(r) for r in rates.split(",") if r]
                            for lay, _, rates in (x.partition(":") for x in layouts.split(";") if x)}
    if cfg.plan:
        cfg.layouts = sorted({lay for p in cfg.plan.values() for lay in p}, key=["one", "spread"].index)
    os.makedirs(cfg.out_dir, exist_ok=True)
    raw = os.path.join(cfg.out_dir, "raw")
    os.makedirs(raw, exist_ok=True)
    cfg.sock_dir = os.path.join("/tmp", f"kpleg-bench-sock-{os.getpid()}")
    os.makedirs(cfg.sock_dir, mode=0o700, exist_ok=True)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    t_start = time.monotonic()
    conf = {k: v for k, v in vars(cfg).items() if isinstance(v, (int, float, str))}
    conf.update(layouts=",".join(cfg.layouts), rates=",".join(f"{r:g}" for r in cfg.rates))
    results = {"meta": {"started": datetime.datetime.now().isoformat(timespec="seconds"),
                        "command": cfg.command, "machine": machine_info(cfg.containerd_pid), "config": conf},
               "windows": []}
    windows_path = os.path.join(cfg.out_dir, "windows.jsonl")
    save = cells.save_jsonl(windows_path)

    def sink(w):
        results["windows"].append(w)
        save(w)
    cgroups = {m: Cgroup(os.path.join(cfg.cgroup_root, m)) for m in ("ebpf", "relist")}
    rt_cg = Cgroup(os.path.join(cfg.cgroup_root, "runtime"))
    rt_cg.add(cfg.containerd_pid)  # before any pod: every shim containerd starts follows it
    runtime = Runtime(cfg, rt_cg)
    pods = Pods(cfg)
    with open("/proc/sys/kernel/bpf_stats_enabled") as f:
        stats_before = f.read().strip()
    rc = 0
    prefix_proxy = None
    try:
        prefix_proxy = start_prefix_proxy(cfg, raw)
        with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
            f.write("1")
        for n in counts:
            reason = pods.grow_to(n)
            cfg.current_n = len(pods.pods)
            if reason:
                results["stopped_reason"] = f"wanted N={n}: {reason}"
                log(results["stopped_reason"])
                break
            log(f"N={n}: {len(pods.pods)} pods running; {cfg.repeats} repeats of {cfg.modes}")
            cells.run_n(cfg, runtime, cgroups, n, raw, sink)
            write_outputs(cfg.out_dir, results)
            if cfg.burst_at and n == cfg.burst_at:
                for mode in cfg.modes:
                    cells.burst(cfg, mode, runtime, cgroups, pods, raw, sink)
                write_outputs(cfg.out_dir, results)
    except Interrupted as e:
        log(f"interrupted ({e}); writing what was measured")
        rc = 130
    except Exception as e:  # keep partial results: they are the evidence of what went wrong
        log(f"failed: {e!r}")
        results["error"] = repr(e)
        rc = 1
    finally:
        with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
            f.write(stats_before)
        if cfg.bpf_json and os.path.exists(cfg.bpf_json):
            with open(cfg.bpf_json) as f:
                results["bpf"] = json.load(f)
        results["meta"]["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
        results["meta"]["elapsed_min"] = (time.monotonic() - t_start) / 60
        results["pods_reached"] = len(pods.pods)
        write_outputs(cfg.out_dir, results)
        if prefix_proxy is not None:
            prefix_proxy.send_signal(signal.SIGTERM)
            try:
                prefix_proxy.wait(timeout=10)
            except Exception:
                prefix_proxy.kill()
        shutil.rmtree(cfg.sock_dir, ignore_errors=True)
        for c in cgroups.values():
            c.remove()
    return rc


if __name__ == "__main__":
    sys.exit(main())
