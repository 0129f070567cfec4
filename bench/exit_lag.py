#!/usr/bin/env python3
"""The runtime's exit lag: for each StopContainer of a `kpleg-load churn`, the time from the
kernel's exit of the container's last process, and from the rmdir of its cgroup, to the end of
the StopContainer call (when the runtime has recorded the exit and answers).

usage: bench/exit_lag.py TRACE LOAD OFFSET_NS
  TRACE      output of `kplegd --trace-kernel` during the churn (ktime_ns: CLOCK_MONOTONIC)
  LOAD       output of `kpleg-load churn` (t_begin_ns/t_end_ns: CLOCK_REALTIME)
  OFFSET_NS  CLOCK_REALTIME - CLOCK_MONOTONIC in ns, measured while both ran, e.g. with
             python3 -c 'import time; print(time.clock_gettime_ns(time.CLOCK_REALTIME) -
             time.clock_gettime_ns(time.CLOCK_MONOTONIC))'

A container's cgroups are found by their mkdir events (the path ends in the container id; one
per hierarchy on hybrid hosts, and exits carry the cgroup2 one). Prints one JSON line per stop
and a summary line.
"""
import json
import statistics
import sys


def load_lines(path):
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    pass


def summary(values):
    if not values:
        return None
    values = sorted(values)
    return {
        "n": len(values),
        "min_ms": round(values[0], 2),
        "median_ms": round(statistics.median(values), 2),
        "p90_ms": round(values[min(len(values) - 1, int(0.9 * len(values)))], 2),
        "max_ms": round(values[-1], 2),
    }


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    trace, load, offset = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cgroups = {}  # container id -> set of cgroup ids
    exits = {}  # cgroup id -> [ktime_ns]
    rmdirs = {}  # cgroup id -> ktime_ns
    for ev in load_lines(trace):
        kind = ev.get("kind")
        if kind == "cgroup_mkdir":
            name = ev.get("path", "").rstrip("/").rsplit("/", 1)[-1]
            if len(name) == 64:
                cgroups.setdefault(name, set()).add(ev["cgroup_id"])
        elif kind == "exit":
            exits.setdefault(ev["cgroup_id"], []).append(ev["ktime_ns"])
        elif kind == "cgroup_rmdir":
            rmdirs[ev["cgroup_id"]] = ev["ktime_ns"]
    kinds = {ev.get("kind") for ev in load_lines(trace)}

    from_exit, from_rmdir, missing = [], [], 0
    for call in load_lines(load):
        if call.get("call") != "StopContainer" or not call.get("ok"):
            continue
        cid = call["container_id"]
        begin = call["t_begin_ns"] - offset
        end = call["t_end_ns"] - offset
        ids = cgroups.get(cid, set())
        exit_t = max((t for i in ids for t in exits.get(i, []) if begin <= t <= end), default=None)
        rmdir_t = min((rmdirs[i] for i in ids if i in rmdirs and rmdirs[i] >= begin), default=None)
        row = {"container_id": cid[:12], "stop_ms": round((end - begin) / 1e6, 2)}
        if exit_t is not None:
            row["end_after_exit_ms"] = round((end - exit_t) / 1e6, 2)
            from_exit.append((end - exit_t) / 1e6)
        if rmdir_t is not None:
            row["end_after_rmdir_ms"] = round((end - rmdir_t) / 1e6, 2)
            from_rmdir.append((end - rmdir_t) / 1e6)
        if exit_t is None or rmdir_t is None:
            missing += 1
        print(json.dumps(row))
    print(json.dumps({"summary": True, "end_after_exit": summary(from_exit),
                      "end_after_rmdir": summary(from_rmdir), "incomplete": missing,
                      "trace_kinds": sorted(k for k in kinds if k)}))


if __name__ == "__main__":
    main()
