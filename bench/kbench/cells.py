"""The method: node CPU for tracking, each mode alone.

A cell is a pod count N and a workload (idle, or open-loop churn at a rate, in one pod or spread
over N/5 pods). A block is one mode -- no daemon ("none"), kplegd --mode=ebpf or --mode=relist --
running alone against the runtime through every workload of its N, one window each. The blocks
of an N are interleaved: repeat r runs none, ebpf, relist in an order rotated by r, so that what
else the machine does falls on every mode alike. A window's node CPU is the daemon's cgroup CPU +
its BPF programs' run time + the runtime's cgroup (containerd and its shims); what tracking costs
is that minus the no-daemon window of the same workload and repeat.
"""

import json
import os
import threading
import time

from .measure import (LoadMeter, bpf_map_memlock, bpf_prog_run_ns, log, now_ns, thread_breakdown, threads,
                      vm_rss_kib)
from .parts import Churn, Daemon, load_cmd, remove_gone_pod_cgroups, run_json_lines
from .truth import evaluate, expected_transitions, wait_settled

MODES = ("none", "ebpf", "relist")
# The Stats call wakes the daemon's server threads (and its timers twice more within ~0.3 s,
# measured): it comes a second before a window opens, so the window holds nothing of its making.
STATS_AFTERMATH_S = 1.0


def own_cpu(s0, s1, secs):
    """The daemon's CPU and its BPF programs' run time between two samples, in s per minute."""
    bpf_s = 0.0
    if s0["bpf"] and s1["bpf"]:
        bpf_s = per_min((s1["bpf"]["run_time_ns"] - s0["bpf"]["run_time_ns"]) / 1e9, secs)
    return per_min(s1["cpu_s"] - s0["cpu_s"], secs), bpf_s


def workloads(cfg, n):
    """The workloads of one N, in block order."""
    out = [{"name": "idle", "rate": 0, "pods": 0}]
    plan = getattr(cfg, "plan", {}).get(n)  # --plan: the rates of each layout at this N
    for layout in (plan.keys() if plan else cfg.layouts):
        pods = 1 if layout == "one" else max(1, n // 5)
        for r in (plan[layout] if plan else cfg.rates):
            if r > 0:
                out.append({"name": f"{layout}-{r:g}", "layout": layout, "rate": r, "pods": pods})
    return out


def sample(d, runtime):
    s = {"t_ns": now_ns(), "mono": time.monotonic(), "runtime_s": runtime.cgroup.usage_usec() / 1e6,
         "containerd_s": runtime.sample()["containerd_s"]}
    if d is not None:
        s.update({"cpu_s": d.cgroup.usage_usec() / 1e6, "rss_kib": vm_rss_kib(d.pid),
                  "bpf": bpf_prog_run_ns(d.pid) if d.mode == "ebpf" else None,
                  "bpf_map_bytes": bpf_map_memlock(d.pid) if d.mode == "ebpf" else None,
                  "threads": threads(d.pid)})
    return s


def per_min(delta, secs):
    return delta * 60.0 / secs if secs > 0 else None


def wait_relists(d, count, timeout):
    first = (d.request_stats() or {}).get("relists", 0)
    deadline = time.monotonic() + timeout
    while (d.request_stats() or {}).get("relists", 0) < first + count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)  # polling with a deadline
    return True


def settle(cfg, d, churn):
    """Until the daemon has reported what the churn made (ebpf), or has relisted twice since the
    churn ended (relist misses what lives shorter than its period: it cannot settle by count)."""
    if d is None or churn is None:
        return True
    if d.mode == "relist":
        return wait_relists(d, 2, cfg.settle_s)
    return wait_settled([d], churn, timeout=cfg.settle_s)


def window(cfg, d, runtime, n, wl, out_dir, label):
    """One window of one workload under one mode (d is None: no daemon)."""
    st0 = d.request_stats() if d else None
    if d:
        time.sleep(STATS_AFTERMATH_S)
    churn = None
    if wl["rate"] > 0:
        churn = Churn(cfg, wl["rate"], cfg.window, wl["pods"], os.path.join(out_dir, f"churn-{label}.jsonl"))
        if not churn.wait_ticking():
            raise RuntimeError(f"{label}: the churn's pods were not made within 120 s")
    s0 = sample(d, runtime)
    lm = LoadMeter()
    time.sleep(max(0.0, cfg.window - (time.monotonic() - s0["mono"])))  # the window itself
    s1 = sample(d, runtime)
    load = lm.read()
    ch = churn.finish(timeout=cfg.window + 180) if churn else None
    settled = settle(cfg, d, ch)
    t_end = now_ns()
    secs = s1["mono"] - s0["mono"]
    res = {"n": n, "workload": wl["name"], "layout": wl.get("layout", "idle"), "rate": wl["rate"],
           "churn_pods": wl["pods"], "mode": d.mode if d else "none", "label": label, "window_s": secs,
           "settled": settled, "load": load,
           "runtime_cpu_s_per_min": per_min(s1["runtime_s"] - s0["runtime_s"], secs),
           "containerd_cpu_s_per_min": per_min(s1["containerd_s"] - s0["containerd_s"], secs)}
    lifecycles = 0
    if ch:
        summ = next((l for l in ch["lines"] if l.get("op") == "churn"), {})
        res["churn"] = {"rc": ch["rc"], "achieved_rate": summ.get("achieved_rate"),
                        "late_ticks": summ.get("late_ticks"), "scheduled": summ.get("scheduled"),
                        "max_in_flight": summ.get("max_in_flight"), "errors": summ.get("errors")}
        lifecycles = len({cid for cid, _ in expected_transitions(ch)[0]})
    res["lifecycles"] = lifecycles
    daemon_s = bpf_s = 0.0
    if d:
        daemon_s, bpf_s = own_cpu(s0, s1, secs)
        res.update({"daemon_cpu_s_per_min": daemon_s, "bpf_cpu_s_per_min": bpf_s,
                    "rss_mib": (s1["rss_kib"] or 0) / 1024.0, "bpf_map_mib": (s1["bpf_map_bytes"] or 0) / (1 << 20),
                    "threads": thread_breakdown(s0["threads"], s1["threads"], secs), "alive": d.alive()})
        st1 = d.request_stats()
        if st0 and st1:
            calls = (st1.get("cri_calls") or 0) - (st0.get("cri_calls") or 0)
            m0, m1 = st0.get("cri_calls_by_method") or {}, st1.get("cri_calls_by_method") or {}
            by = {k: m1.get(k, 0) - m0.get(k, 0) for k in set(m0) | set(m1)}
            res["cri_calls"] = calls
            res["cri_calls_by_method"] = {k: v for k, v in sorted(by.items()) if v}
            res["relists"] = (st1.get("relists") or 0) - (st0.get("relists") or 0)
            retries = (st1.get("confirm_retries") or 0) - (st0.get("confirm_retries") or 0)
            w0, w1 = st0.get("loop_wakeups_by_cause") or {}, st1.get("loop_wakeups_by_cause") or {}
            woke = {k: w1.get(k, 0) - w0.get(k, 0) for k in set(w0) | set(w1)}
            res["loop_wakeups_by_cause"] = {k: v for k, v in sorted(woke.items()) if v}
            if lifecycles:
                res["loop_wakeups_per_lifecycle_by_cause"] = {
                    k: round(v / lifecycles, 3) for k, v in res["loop_wakeups_by_cause"].items()}
                looks = by.get("ContainerStatus", 0) + by.get("PodSandboxStatus", 0)
                res["cri_calls_per_lifecycle"] = calls / lifecycles
                res["looks_per_lifecycle"] = looks / lifecycles
                res["retries_per_lifecycle"] = retries / lifecycles
        if ch:
            ev = evaluate({d.mode: d.log.events_between(ch["t_begin_ns"], t_end)}, ch, set())[d.mode]
            res.update(ev)
    res["node_cpu_s_per_min"] = res["runtime_cpu_s_per_min"] + daemon_s + bpf_s
    return res


def start_daemon(cfg, mode, cgroups, out_dir, tag):
    d = Daemon(cfg, mode, cfg.endpoint, cgroups[mode], out_dir, tag)
    try:
        d.wait_ready(timeout=60 + 0.2 * cfg.current_n)
    except Exception:
        d.stop()
        raise
    return d


def warm_up(cfg, d, out_dir, label):
    """Churn a new daemon sees before its first window, not measured: kplegd learns from its first
    confirmations when the runtime reports a transition (pleg/lag_learner.h)."""
    if cfg.warmup_s <= 0 or d is None:
        return
    c = Churn(cfg, cfg.warmup_rate, cfg.warmup_s, 1, os.path.join(out_dir, f"churn-{label}-warmup.jsonl"),
              namespace="kpleg-bench-warmup")
    c.wait_ticking()
    settle(cfg, d, c.finish(timeout=cfg.warmup_s + 120))


def block(cfg, mode, runtime, cgroups, n, wls, out_dir, rep, sink):
    """One mode through every workload of its N."""
    tag = f"n{n}-r{rep}-{mode}"
    d = None if mode == "none" else start_daemon(cfg, mode, cgroups, out_dir, tag)
    try:
        warm_up(cfg, d, out_dir, tag)
        for wl in wls:
            w = window(cfg, d, runtime, n, wl, out_dir, f"{tag}-{wl['name']}")
            w["repeat"] = rep
            sink(w)
            log(f"  N={n} {wl['name']:>10} {mode:>6} r{rep}: node {w['node_cpu_s_per_min']:.3f} s/min"
                f" (daemon {w.get('daemon_cpu_s_per_min') or 0:.3f} + BPF {w.get('bpf_cpu_s_per_min') or 0:.4f});"
                + (f" achieved {w['churn']['achieved_rate']:.1f}/s" if w.get("churn") else "")
                + (f", missed {w.get('missed')} dup {w.get('duplicated')}" if "missed" in w else "")
                + f"; load {w['load']['busy_cpus']:.2f} CPUs")
    finally:
        if d:
            d.stop()


def run_n(cfg, runtime, cgroups, n, out_dir, sink):
    wls = workloads(cfg, n)
    for rep in range(cfg.repeats):
        order = MODES[rep % 3:] + MODES[:rep % 3]
        # Every other repeat runs the workloads backwards: a drift within a block falls on both ends.
        seq = wls if rep % 2 == 0 else list(reversed(wls))
        for mode in order:
            if mode in cfg.modes:
                block(cfg, mode, runtime, cgroups, n, seq, out_dir, rep, sink)


# --- the burst -----------------------------------------------------------------------------------

def burst(cfg, mode, runtime, cgroups, pods, out_dir, sink):
    """The N pods removed over cfg.burst_s seconds (scheduled, in parallel), then as many made
    again over as long: node CPU over a fixed window from the first removal, and the time until the
    daemon has reported every death and every new container's start (time to settle)."""
    n = len(pods.pods)
    tag = f"burst-n{n}-{mode}"
    d = None if mode == "none" else start_daemon(cfg, mode, cgroups, out_dir, tag)
    try:
        warm_up(cfg, d, out_dir, tag)
        if d:
            time.sleep(STATS_AFTERMATH_S)
        victims = list(pods.pods)
        s0 = sample(d, runtime)
        lm = LoadMeter()
        t0 = now_ns()

        def at(i, k, fn):
            time.sleep(max(0.0, s0["mono"] + cfg.burst_s * i / k - time.monotonic()))  # the schedule
            fn()
        ths = [threading.Thread(target=at, args=(i, len(victims), lambda p=p: run_json_lines(
            load_cmd(cfg, "remove-pod", p["sandbox_id"]), timeout=120))) for i, p in enumerate(victims)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        pods.pods = []
        batches = max(1, n // 5)
        made = []

        def make(i):
            rc, lines, _ = run_json_lines(load_cmd(cfg, "run", "--pods", "5", "--containers", "1", "--namespace",
                                                   "kpleg-bench", "--name-prefix", f"burst{i}"), timeout=300)
            made.extend(p for p in lines if "sandbox_id" in p)
        t_start = time.monotonic()
        ths = [threading.Thread(target=lambda i=i: (time.sleep(max(0.0, t_start + cfg.burst_s * i / batches
                                                                  - time.monotonic())), make(i)))
               for i in range(batches)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        pods.pods = made
        t_calls_done = now_ns()
        time.sleep(max(0.0, cfg.burst_window - (time.monotonic() - s0["mono"])))
        s1 = sample(d, runtime)
        load = lm.read()
        secs = s1["mono"] - s0["mono"]
        res = {"n": n, "workload": "burst", "layout": "burst", "rate": 0, "mode": mode, "window_s": secs,
               "load": load, "repeat": 0, "runtime_cpu_s_per_min": per_min(s1["runtime_s"] - s0["runtime_s"], secs),
               "calls_done_s": (t_calls_done - t0) / 1e9, "pods_made": len(made)}
        daemon_s = bpf_s = 0.0
        if d:
            daemon_s, bpf_s = own_cpu(s0, s1, secs)
            res.update({"daemon_cpu_s_per_min": daemon_s, "bpf_cpu_s_per_min": bpf_s,
                        "rss_mib": (s1["rss_kib"] or 0) / 1024.0})
            want = {(c["container_id"], "ContainerDied") for p in victims for c in p.get("containers", [])}
            want |= {(c["container_id"], "ContainerStarted") for p in made for c in p.get("containers", [])}
            deadline = time.monotonic() + cfg.settle_s
            last = None
            while time.monotonic() < deadline:
                ev = d.log.events_between(t0, now_ns())
                got = {(e["container_id"], e["type"]): e["recv_ts_ns"] for e in ev}
                if all(k in got for k in want):
                    last = max(got[k] for k in want)
                    break
                time.sleep(0.25)  # polling with a deadline
            res["settle_s"] = (last - t0) / 1e9 if last else None
            res["missing_after_settle"] = None if last else sum(1 for k in want if k not in got)
        res["node_cpu_s_per_min"] = res["runtime_cpu_s_per_min"] + daemon_s + bpf_s
        sink(res)
        remove_gone_pod_cgroups(cfg)  # the removed pods' (after the window, as a kubelet would)
        log(f"  burst N={n} {mode}: node {res['node_cpu_s_per_min']:.3f} s/min, calls done "
            f"{res['calls_done_s']:.1f} s, settled {res.get('settle_s')}")
    finally:
        if d:
            d.stop()


def save_jsonl(path):
    lock = threading.Lock()

    def sink(w):
        with lock, open(path, "a") as f:
            f.write(json.dumps(w) + "\n")
    return sink

