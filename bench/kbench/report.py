"""From the windows of a run to its summary: node CPU for tracking per cell (median and min-max
over the interleaved repeats), the break-even rates, memory, latency, the per-thread table, and
the .dat files bench/plots.gp draws."""

import os
import statistics

from .measure import percentile

MC = 1000.0 / 60.0  # CPU seconds per minute -> millicores


def fmt(v, digits=1):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def spread(vals):
    v = [x for x in vals if x is not None]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def fmt_spread(s, digits=1):
    if not s:
        return "–"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def cells(windows):
    """(n, workload) -> mode -> repeat -> window, in the order first measured."""
    out = {}
    for w in windows:
        if w.get("workload") == "burst":
            continue
        out.setdefault((w["n"], w["workload"]), {}).setdefault(w["mode"], {})[w["repeat"]] = w
    return out


def verdict(e, l):
    """ebpf against relist, by whether their min-max ranges overlap."""
    if not e or not l:
        return "–"
    if e["max"] < l["min"]:
        return "**ebpf cheaper**"
    if e["min"] > l["max"]:
        return "**ebpf costlier**"
    return "within the spread"


def cs_none(windows, row):
    return [w for w in windows if w["n"] == row["n"] and w.get("workload") == row["workload"] and w["mode"] == "none"]


def aggregate(windows):
    """Per cell and mode: node CPU above the no-daemon window of the same repeat (millicores),
    the daemon's own CPU, the achieved rate, the ground truth, the CRI calls."""
    rows = []
    cs = cells(windows)
    for (n, wl), by_mode in cs.items():
        none = by_mode.get("none", {})
        idle_none = cs.get((n, "idle"), {}).get("none", {})
        any_w = next(iter(next(iter(by_mode.values())).values()))
        row = {"n": n, "workload": wl, "layout": any_w["layout"], "rate": any_w["rate"],
               "churn_pods": any_w.get("churn_pods"), "modes": {}}
        row["none_node"] = spread([w["node_cpu_s_per_min"] * MC for w in none.values()])
        for mode in ("ebpf", "relist"):
            ws = by_mode.get(mode, {})
            if not ws:
                continue
            above = [w["node_cpu_s_per_min"] * MC - none[r]["node_cpu_s_per_min"] * MC
                     for r, w in ws.items() if r in none]
            # The churn a daemon's window achieved can fall short of the no-daemon window's (ticks
            # dropped while the runtime lags): the baseline's churn share scaled to the rate this
            # window achieved.
            adj = []
            for r, w in ws.items():
                b, i = none.get(r), idle_none.get(r)
                if not b or not i or not w.get("churn") or not b.get("churn") or not b["churn"].get("achieved_rate"):
                    continue
                f = (w["churn"]["achieved_rate"] or 0) / b["churn"]["achieved_rate"]
                base = i["node_cpu_s_per_min"] + (b["node_cpu_s_per_min"] - i["node_cpu_s_per_min"]) * f
                adj.append((w["node_cpu_s_per_min"] - base) * MC)
            v = list(ws.values())
            row["modes"][mode] = {
                "above": spread(above),
                "above_adj": spread(adj) if adj else spread(above),
                "node": spread([w["node_cpu_s_per_min"] * MC for w in v]),
                "daemon": spread([(w.get("daemon_cpu_s_per_min") or 0) * MC for w in v]),
                "bpf": spread([(w.get("bpf_cpu_s_per_min") or 0) * MC for w in v]),
                "own": spread([((w.get("daemon_cpu_s_per_min") or 0) + (w.get("bpf_cpu_s_per_min") or 0)) * MC
                               for w in v]),
                "runtime_above": spread([w["runtime_cpu_s_per_min"] * MC - none[r]["runtime_cpu_s_per_min"] * MC
                                         for r, w in ws.items() if r in none]),
                "achieved": spread([w["churn"]["achieved_rate"] for w in v if w.get("churn")]),
                "expected": sum(w.get("expected", 0) for w in v),
                "missed": sum(w.get("missed", 0) for w in v),
                "duplicated": sum(w.get("duplicated", 0) for w in v),
                "calls_per_lifecycle": spread([w.get("cri_calls_per_lifecycle") for w in v]),
                "cri_calls_per_min": spread([w.get("cri_calls", 0) * 60 / w["window_s"] for w in v]),
                "rss": spread([w.get("rss_mib") for w in v]),
                "bpf_map": spread([w.get("bpf_map_mib") for w in v]),
                "load": spread([w["load"]["busy_cpus"] for w in v]),
                "windows": v,
            }
        rows.append(row)
    return rows


def break_even(rows, n, layout, key="above"):
    """The rate at which ebpf's median node CPU above baseline meets relist's, interpolated
    between the rates measured; or which is cheaper throughout."""
    pts = sorted((r["rate"], r["modes"]["ebpf"][key]["median"] - r["modes"]["relist"][key]["median"])
                 for r in rows if r["n"] == n and r["layout"] in (layout, "idle")
                 and "ebpf" in r["modes"] and "relist" in r["modes"]
                 and r["modes"]["ebpf"][key] and r["modes"]["relist"][key])
    if not pts:
        return None
    for (r0, d0), (r1, d1) in zip(pts, pts[1:]):
        if (d0 < 0) != (d1 < 0):
            return f"≈{r0 + (r1 - r0) * (-d0) / (d1 - d0):.1f}/s (ebpf {'cheaper below' if d0 < 0 else 'costlier below'})"
    return "none: ebpf cheaper at every rate" if pts[0][1] < 0 else "none: relist cheaper at every rate"


def thread_table(rows, n, rate, layout):
    """Per thread name of each daemon: wake-ups per container lifecycle and CPU µs per lifecycle
    above the idle window of the same N and repeat (median over repeats)."""
    idle = next((r for r in rows if r["n"] == n and r["workload"] == "idle"), None)
    cell = next((r for r in rows if r["n"] == n and r["layout"] == layout and r["rate"] == rate), None)
    if not idle or not cell:
        return []
    out = []
    for mode in ("ebpf", "relist"):
        if mode not in cell["modes"] or mode not in idle["modes"]:
            continue
        idle_by_rep = {w["repeat"]: w for w in idle["modes"][mode]["windows"]}
        names = {}
        per_tr = []
        for w in cell["modes"][mode]["windows"]:
            i = idle_by_rep.get(w["repeat"])
            if not i or not w.get("lifecycles"):
                continue
            lc = w["lifecycles"]
            d_cpu = ((w.get("daemon_cpu_s_per_min") or 0) + (w.get("bpf_cpu_s_per_min") or 0)
                     - (i.get("daemon_cpu_s_per_min") or 0) - (i.get("bpf_cpu_s_per_min") or 0))
            ach = (w.get("churn") or {}).get("achieved_rate") or rate
            per_tr.append(d_cpu / 60.0 / ach * 1e6)
            for name, g in (w.get("threads") or {}).items():
                gi = (i.get("threads") or {}).get(name, {"wakeups_per_s": 0, "cpu_ms_per_min": 0})
                x = names.setdefault(name, {"threads": g["threads"], "wake": [], "cpu": [], "wake_s": [], "idle_s": [],
                                            "woken": [], "preempted": []})
                x["wake"].append((g["wakeups_per_s"] - gi["wakeups_per_s"]) * w["window_s"] / lc)
                for k, key in (("woken", "woken_per_s"), ("preempted", "preempted_per_s")):
                    if key in g:  # results written before the bench read voluntary switches lack them
                        x[k].append((g[key] - gi.get(key, 0)) * w["window_s"] / lc)
                x["cpu"].append((g["cpu_ms_per_min"] - gi["cpu_ms_per_min"]) / 60.0 * w["window_s"] * 1000 / lc)
                x["wake_s"].append(g["wakeups_per_s"])
                x["idle_s"].append(gi["wakeups_per_s"])
        out.append({"mode": mode, "us_per_transition": spread(per_tr),
                    "threads": {k: {"threads": v["threads"], "wake_per_lc": spread(v["wake"]),
                                    "woken_per_lc": spread(v["woken"]), "preempted_per_lc": spread(v["preempted"]),
                                    "cpu_us_per_lc": spread(v["cpu"]), "wake_s": spread(v["wake_s"]),
                                    "idle_wake_s": spread(v["idle_s"])} for k, v in names.items()}})
    return out


# The API's threads, which serve the Watch consumer: kplegd's own server on the unix socket
# (`kpleg-api`; the events themselves are written by the publishing thread, `kpleg-loop`), and
# grpc++'s sync server (`grpcpp_sync_ser`: on TCP, and on the unix socket in older results).
WATCH_THREADS = ("kpleg-api", "grpcpp_sync_ser")


def write_dat(out, rows, windows):
    ns = sorted({r["n"] for r in rows})
    for n in ns:
        for layout in ("one", "spread"):
            pts = sorted((r for r in rows if r["n"] == n and r["layout"] in (layout, "idle")), key=lambda r: r["rate"])
            if not any(r["layout"] == layout for r in pts):
                continue
            with open(os.path.join(out, f"node_cpu_n{n}_{layout}.dat"), "w") as f:
                f.write("# rate ebpf_med ebpf_min ebpf_max relist_med relist_min relist_max (millicores above no daemon, rate-adjusted)\n")
                for r in pts:
                    e, l = r["modes"].get("ebpf", {}).get("above_adj"), r["modes"].get("relist", {}).get("above_adj")
                    if not e or not l:
                        continue
                    f.write(f"{r['rate']} {e['median']:.3f} {e['min']:.3f} {e['max']:.3f} "
                            f"{l['median']:.3f} {l['min']:.3f} {l['max']:.3f}\n")
            with open(os.path.join(out, f"daemon_cpu_n{n}_{layout}.dat"), "w") as f:
                f.write("# rate ebpf_med ebpf_min ebpf_max relist_med relist_min relist_max (millicores, daemon + BPF)\n")
                for r in pts:
                    e, l = r["modes"].get("ebpf", {}).get("own"), r["modes"].get("relist", {}).get("own")
                    if e and l:
                        f.write(f"{r['rate']} {e['median']:.3f} {e['min']:.3f} {e['max']:.3f} "
                                f"{l['median']:.3f} {l['min']:.3f} {l['max']:.3f}\n")
    with open(os.path.join(out, "memory_vs_n.dat"), "w") as f:
        f.write("# n ebpf_rss_mib relist_rss_mib ebpf_bpf_maps_mib (idle windows, median)\n")
        for n in ns:
            r = next((r for r in rows if r["n"] == n and r["workload"] == "idle"), None)
            if not r:
                continue
            g = lambda m, k: (r["modes"].get(m, {}).get(k) or {}).get("median") or 0
            f.write(f"{n} {g('ebpf', 'rss'):.1f} {g('relist', 'rss'):.1f} {g('ebpf', 'bpf_map'):.2f}\n")
    for mode in ("ebpf", "relist"):
        for t, suffix in (("ContainerStarted", "started"), ("ContainerDied", "died")):
            vals = sorted(s["call_begin_ms"] for w in windows if w.get("mode") == mode for s in w.get("samples", [])
                          if s["type"] == t and s.get("call_begin_ms") is not None)
            with open(os.path.join(out, f"latency_{mode}_{suffix}.dat"), "w") as f:
                f.write(f"# ms from the start of the CRI call that made it to the consumer, {t}, every churn window\n")
                for i, v in enumerate(vals):
                    f.write(f"{max(v, 0.1):.3f} {(i + 1) / len(vals):.6f}\n")


def latency(windows, mode, t, key="call_begin_ms"):
    vals = sorted(s[key] for w in windows if w.get("mode") == mode for s in w.get("samples", [])
                  if s["type"] == t and s.get(key) is not None)
    return {"p50": percentile(vals, 50), "p99": percentile(vals, 99), "n": len(vals)}


def summary(results):
    windows = results["windows"]
    rows = aggregate(windows)
    m = results["meta"]["machine"]
    L = [f"# kpleg: what lifecycle tracking costs the node ({results['meta']['started']})\n",
         f"Command: `{results['meta']['command']}` ({results['meta'].get('elapsed_min', 0):.0f} min)  ",
         f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_total_gib']:.1f} GiB, Linux {m['kernel']}, "
         f"{m['containerd']}, {m['runc']}  "]
    loads = [w["load"]["busy_cpus"] for w in windows if w.get("load", {}).get("busy_cpus") is not None]
    if loads:
        L.append(f"Machine load during the windows (busy CPUs, everything on the machine): median "
                 f"{statistics.median(loads):.2f}, {min(loads):.2f}–{max(loads):.2f}; "
                 f"{results['meta']['config'].get('repeats')} interleaved repeats per cell, "
                 f"{results['meta']['config'].get('window'):g} s windows\n")
    if results.get("error"):
        L.append(f"**The run failed**: {results['error']}\n")
    L.append("## Node CPU for tracking (millicores above the same workload with no daemon)\n")
    L.append("Node CPU = daemon cgroup + its BPF programs + containerd and shims; minus the no-daemon window "
             "of the same repeat. Median (min–max) over the repeats. Rate: transitions/s scheduled (achieved, "
             "median); one = every churn container in one pod, spread = over N/5 pods.\n")
    L.append("*rate-adj.*: the same with the baseline's churn share scaled to the rate the daemon's window "
             "achieved (ebpf windows achieved less when the runtime lagged).\n")
    L.append("| N | workload | achieved/s ebpf, relist, none | ebpf | relist | ebpf rate-adj. | relist rate-adj. | "
             "verdict | ebpf daemon+BPF | relist daemon | ebpf missed/dup | relist missed | CRI calls/lifecycle ebpf, relist |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        e, l = r["modes"].get("ebpf"), r["modes"].get("relist")
        if not e or not l:
            continue
        eb = e["daemon"]["median"] + e["bpf"]["median"]
        nn = spread([w["churn"]["achieved_rate"] for w in cs_none(windows, r) if w.get("churn")])
        ach = "–" if not r["rate"] else (f"{fmt((e['achieved'] or {}).get('median'))}, "
                                         f"{fmt((l['achieved'] or {}).get('median'))}, {fmt((nn or {}).get('median'))}")
        L.append(f"| {r['n']} | {r['workload']} | {ach} | "
                 f"{fmt_spread(e['above'])} | {fmt_spread(l['above'])} | {fmt_spread(e['above_adj'])} | "
                 f"{fmt_spread(l['above_adj'])} | {verdict(e['above_adj'], l['above_adj'])} | {fmt(eb)} | "
                 f"{fmt(l['daemon']['median'])} | {e['missed']}/{e['duplicated']} of {e['expected']} | "
                 f"{l['missed']} of {l['expected']} | {fmt((e['calls_per_lifecycle'] or {}).get('median'), 2)}, "
                 f"{fmt((l['calls_per_lifecycle'] or {}).get('median'), 2)} |")
    L.append("\n### Break-even rate (where ebpf's median meets relist's; only as firm as the verdicts above)\n")
    for n in sorted({r["n"] for r in rows}):
        for layout in results["meta"]["config"].get("layouts", "one,spread").split(","):
            L.append(f"- N={n}, {layout}: node CPU (rate-adj.) {break_even(rows, n, layout, 'above_adj') or '–'}; "
                     f"the daemon's own CPU (cgroup + BPF) {break_even(rows, n, layout, 'own') or '–'}")
    b = [w for w in windows if w.get("workload") == "burst"]
    if b:
        base = next((w for w in b if w["mode"] == "none"), None)
        L.append(f"\n### Burst: N pods removed in {results['meta']['config'].get('burst_s'):g} s, then made again\n")
        L.append("| mode | node CPU m (window) | above no daemon | CRI calls done s | settled s (every death and start reported) |")
        L.append("|---|---|---|---|---|")
        for w in b:
            above = (w["node_cpu_s_per_min"] - base["node_cpu_s_per_min"]) * MC if base else None
            L.append(f"| {w['mode']} | {w['node_cpu_s_per_min'] * MC:.1f} | {fmt(above)} | {w['calls_done_s']:.1f} | "
                     f"{fmt(w.get('settle_s'))}{'' if w.get('settle_s') or w['mode'] == 'none' else ' (%s missing)' % w.get('missing_after_settle')} |")
    L.append("\n## Memory (idle windows, median)\n")
    L.append("| N | ebpf RSS MiB | relist RSS MiB | ebpf BPF maps MiB |")
    L.append("|---|---|---|---|")
    for r in rows:
        if r["workload"] != "idle":
            continue
        g = lambda mo, k: (r["modes"].get(mo, {}).get(k) or {}).get("median")
        L.append(f"| {r['n']} | {fmt(g('ebpf', 'rss'))} | {fmt(g('relist', 'rss'))} | {fmt(g('ebpf', 'bpf_map'), 2)} |")
    L.append("\n## Latency (ms from the start of the CRI call that made the transition to the Watch consumer)\n")
    L.append("| mode | Started p50 | Started p99 | Died p50 | Died p99 | samples |")
    L.append("|---|---|---|---|---|---|")
    for mode in ("ebpf", "relist"):
        s, d = latency(windows, mode, "ContainerStarted"), latency(windows, mode, "ContainerDied")
        L.append(f"| {mode} | {fmt(s['p50'])} | {fmt(s['p99'])} | {fmt(d['p50'])} | {fmt(d['p99'])} | {s['n'] + d['n']} |")
    s, d = latency(windows, "ebpf", "ContainerStarted", "kernel_ms"), latency(windows, "ebpf", "ContainerDied", "kernel_ms")
    if s["n"] + d["n"]:
        L.append("\nebpf, from the kernel's signal (the exec, the exit) to the Watch consumer: the daemon's own share; "
                 "a death waits for the runtime to record it.\n")
        L.append("| mode | Started p50 | Started p99 | Died p50 | Died p99 | samples |")
        L.append("|---|---|---|---|---|---|")
        L.append(f"| ebpf | {fmt(s['p50'])} | {fmt(s['p99'])} | {fmt(d['p50'])} | {fmt(d['p99'])} | {s['n'] + d['n']} |")
    L.append("\n## Per thread, per container lifecycle (above the idle window of the same N and repeat)\n")
    L.append("Wake-ups (times scheduled in, /proc/<pid>/task/*/schedstat), of them the sleeps a thread was woken "
             "from (voluntary switches, /proc/<pid>/task/*/status) and the times another task took its CPU "
             "(preempted), and CPU µs per container lifecycle (start, death, removal); the API's threads, which "
             "serve the Watch consumer (`kpleg-api`; `grpcpp_sync_ser` in older results), apart, then all "
             "together. Median over repeats.\n")
    rate = results["meta"]["config"].get("thread_rate", 10)
    for n in sorted({r["n"] for r in rows}):
        for layout in results["meta"]["config"].get("layouts", "one,spread").split(","):
            for t in thread_table(rows, n, rate, layout):
                L.append(f"**N={n}, {rate:g}/s, {layout}, {t['mode']}**: daemon + BPF CPU per transition "
                         f"{fmt_spread(t['us_per_transition'], 0)} µs\n")
                L.append("| thread ×n | wake-ups/s at rate | idle wake-ups/s | wake-ups per lifecycle | woken from a sleep "
                         "| preempted | CPU µs per lifecycle |")
                L.append("|---|---|---|---|---|---|---|")
                med = lambda v, k: (v[k] or {}).get("median", 0)
                items = sorted(t["threads"].items(), key=lambda kv: (kv[0] in WATCH_THREADS,
                                                                     -(kv[1]["cpu_us_per_lc"] or {}).get("median", 0)))
                ours = [v for k, v in items if k not in WATCH_THREADS]
                tot_w, tot_c = sum(med(v, "wake_per_lc") for v in ours), sum(med(v, "cpu_us_per_lc") for v in ours)
                tot_v, tot_p = sum(med(v, "woken_per_lc") for v in ours), sum(med(v, "preempted_per_lc") for v in ours)
                split = any(v["woken_per_lc"] for v in ours)  # older results lack the split
                total = (f"{tot_w:.1f} | {f'{tot_v:.1f}' if split else '–'} | {f'{tot_p:.1f}' if split else '–'} "
                         f"| {tot_c:.0f} |")
                quiet = [k for k, v in items if k not in WATCH_THREADS
                         and max((v["wake_s"] or {}).get("median", 0), (v["idle_wake_s"] or {}).get("median", 0)) < 0.05]
                items = [kv for kv in items if kv[0] not in quiet]
                shown_ours = False
                for k, v in items:
                    if k in WATCH_THREADS and not shown_ours:
                        L.append(f"| **all but the API's threads** | | | {total}")
                        shown_ours = True
                    L.append(f"| {k} ×{v['threads']} | {fmt((v['wake_s'] or {}).get('median'))} | "
                             f"{fmt((v['idle_wake_s'] or {}).get('median'))} | {fmt_spread(v['wake_per_lc'])} | "
                             f"{fmt_spread(v['woken_per_lc'])} | {fmt_spread(v['preempted_per_lc'])} | "
                             f"{fmt_spread(v['cpu_us_per_lc'], 0)} |")
                everything = [v for _, v in t["threads"].items()]
                all_w = sum(med(v, "wake_per_lc") for v in everything)
                all_c = sum(med(v, "cpu_us_per_lc") for v in everything)
                all_v = sum(med(v, "woken_per_lc") for v in everything)
                all_p = sum(med(v, "preempted_per_lc") for v in everything)
                L.append(f"| **all** | | | {all_w:.1f} | {f'{all_v:.1f}' if split else '–'} | "
                         f"{f'{all_p:.1f}' if split else '–'} | {all_c:.0f} |")
                if quiet:
                    L.append(f"| not woken in either window: {', '.join(quiet)} | 0 | 0 | 0 | 0 | 0 | 0 |")
                L.append("")
    L += bpf_section(results.get("bpf"))
    return "\n".join(L) + "\n", rows


def bpf_section(b):
    """kpleg-bench-bpf's result: what the BPF programs cost every process on the node."""
    if not b or "exec_storm" not in b:
        return []
    es, pc = b["exec_storm"], b["program_cost"]
    L = ["\n## BPF programs (kpleg-bench-bpf)\n",
         "| program | ns/run outside containers | ns/run in container lifecycles |", "|---|---|---|"]
    for p in sorted(pc["whole_phase"]["programs"]):
        o = pc["outside_containers"]["programs"].get(p, {})
        cl = pc["container_lifecycles"]["programs"].get(p, {})
        if p == "oom_mark_victim":
            cl = pc["oom_kill"]["programs"].get(p, {})
        L.append(f"| {p} | {fmt(o.get('ns_per_run'), 0)} | {fmt(cl.get('ns_per_run'), 0)} |")
    L.append(f"\nExec storm (fork+exec+exit of /bin/true, attached against detached, {len(es['rounds'])} rounds): "
             f"median slowdown {es['median_slowdown_percent']:.2f} % (ratios {es['min_wall_ratio']:.3f}–"
             f"{es['max_wall_ratio']:.3f}); from the kernel's statistics {es['bpf_ns_per_iteration_from_stats']:.0f} ns "
             f"per iteration = {es['slowdown_percent_from_stats']:.3f} %.")
    ss = b.get("syscall_storm")
    if ss and "error" not in ss:
        L.append(f"\nSyscall storm (getppid()): ns per syscall, nothing attached {ss['median_none_ns_per_syscall']:.1f}, "
                 f"kplegd's default programs {ss['median_default_ns_per_syscall']:.1f} "
                 f"({ss['median_default_extra_ns_per_syscall']:+.1f}), with `--removal-hints kernel`'s syscall "
                 f"tracepoints {ss['median_default_and_removal_hint_ns_per_syscall']:.1f} "
                 f"({ss['median_removal_hint_extra_ns_per_syscall']:+.1f}).")
    return L
