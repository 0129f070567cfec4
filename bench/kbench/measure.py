"""Measurement primitives: cgroup CPU, per-thread CPU and wake-ups, RSS, BPF run time and map
memory, the machine's load, percentiles. Standard library only."""

import os
import platform
import subprocess
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
MiB = 1 << 20


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def now_ns():
    return time.time_ns()  # CLOCK_REALTIME, the clock of kernel_ts_ns and of kpleg-load's traces


class Interrupted(Exception):
    pass


def on_signal(signum, _frame):
    raise Interrupted(f"signal {signum}")


# --- measurement primitives --------------------------------------------------------------------

class Cgroup:
    """A cgroup2 directory whose cpu.stat usage_usec covers every process ever in it."""

    def __init__(self, path):
        self.path = path
        os.makedirs(path, exist_ok=True)

    def usage_usec(self):
        with open(os.path.join(self.path, "cpu.stat")) as f:
            for line in f:
                k, v = line.split()
                if k == "usage_usec":
                    return int(v)
        return 0

    def add(self, pid):
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(pid))

    def join_fn(self):
        procs = os.path.join(self.path, "cgroup.procs")

        def join():
            with open(procs, "w") as f:
                f.write("0")
        return join

    def pids(self):
        with open(os.path.join(self.path, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]

    def remove(self):
        try:
            os.rmdir(self.path)
        except OSError:
            pass


def proc_cpu_s(pid):
    """utime+stime+cutime+cstime of a process, seconds (tick resolution)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def threads(pid):
    """Per thread: (name, ns on CPU, times scheduled in, times it slept and was woken, times it was
    preempted), from /proc/<pid>/task/*/schedstat and status. Times scheduled in is about the sum of
    the other two: a thread runs again after a sleep or after another task took its CPU."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                run_ns, _wait, slices = (int(x) for x in f.read().split()[:3])
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            switches = {}
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    k, _, v = line.partition(":")
                    if k in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                        switches[k] = int(v)
        except (OSError, ValueError):
            continue
        out[tid] = (name, run_ns, slices, switches.get("voluntary_ctxt_switches", 0),
                    switches.get("nonvoluntary_ctxt_switches", 0))
    return out


def threads_cpu_s(pid):
    """CPU of a process's live threads, nanosecond precision (a thread that exited is lost,
    which is rare in a Go runtime like containerd)."""
    return sum(v[1] for v in threads(pid).values()) / 1e9


def thread_breakdown(before, after, elapsed_s):
    """CPU ms per minute and wake-ups per second of each thread, grouped by thread name:
    `wakeups_per_s` counts the times scheduled in (schedstat), `woken_per_s` the sleeps it was woken
    from (voluntary switches) and `preempted_per_s` the times another task took its CPU."""
    groups = {}
    for tid, (name, ns, slices, vol, invol) in after.items():
        ns0, sl0, vol0, invol0 = before[tid][1:5] if tid in before else (0, 0, 0, 0)
        g = groups.setdefault(name, {"threads": 0, "cpu_ms_per_min": 0.0, "wakeups_per_s": 0.0,
                                     "woken_per_s": 0.0, "preempted_per_s": 0.0})
        g["threads"] += 1
        g["cpu_ms_per_min"] += (ns - ns0) / 1e6 * 60 / elapsed_s
        g["wakeups_per_s"] += (slices - sl0) / elapsed_s
        g["woken_per_s"] += (vol - vol0) / elapsed_s
        g["preempted_per_s"] += (invol - invol0) / elapsed_s
    return dict(sorted(groups.items(), key=lambda kv: -kv[1]["cpu_ms_per_min"]))


def vm_rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def fdinfos(pid):
    """Each open descriptor's /proc/<pid>/fdinfo as a dict; None when the process is gone."""
    try:
        fds = os.listdir(f"/proc/{pid}/fdinfo")
    except OSError:
        return None
    out = []
    for fd in fds:
        info = {}
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                for line in f:
                    k, _, v = line.partition(":")
                    info[k.strip()] = v.strip()
        except OSError:
            continue
        out.append(info)
    return out


def bpf_prog_run_ns(pid):
    """Sum of run_time_ns / run_cnt over the BPF programs a process holds (its fdinfo)."""
    infos = fdinfos(pid)
    if infos is None:
        return None
    seen, t, n = set(), 0, 0
    for info in infos:
        if "prog_id" in info and "run_time_ns" in info and info["prog_id"] not in seen:
            seen.add(info["prog_id"])
            t += int(info["run_time_ns"])
            n += int(info.get("run_cnt", 0))
    return {"run_time_ns": t, "run_cnt": n, "programs": len(seen)}


def mem_available_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def percentile(sorted_vals, p):
    if not sorted_vals:
        return None
    k = (len(sorted_vals) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


def summarize(vals):
    v = sorted(x for x in vals if x is not None)
    if not v:
        return {"n": 0, "p50": None, "p99": None, "max": None, "min": None}
    return {"n": len(v), "p50": percentile(v, 50), "p99": percentile(v, 99), "max": v[-1], "min": v[0]}


def bpf_map_memlock(pid):
    """Bytes of the BPF maps a process holds (memlock of each map's fdinfo, once per map id)."""
    infos = fdinfos(pid)
    if infos is None:
        return None
    seen, total = set(), 0
    for info in infos:
        if "map_id" in info and "memlock" in info and info["map_id"] not in seen:
            seen.add(info["map_id"])
            total += int(info["memlock"])
    return total


class LoadMeter:
    """The machine's busy CPU (all processes, from /proc/stat) over a window, in CPUs, and the
    1-minute load average at its end: how much else ran while a window was measured."""

    def __init__(self):
        self.t0, self.busy0 = time.monotonic(), self._busy()

    @staticmethod
    def _busy():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        return (sum(v[:8]) - idle) / CLK_TCK

    def read(self):
        dt = time.monotonic() - self.t0
        with open("/proc/loadavg") as f:
            la = float(f.read().split()[0])
        return {"busy_cpus": (self._busy() - self.busy0) / dt if dt > 0 else None, "loadavg_1m": la}


def machine_info(containerd_pid):
    def first_line(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "?"
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        total = int(f.readline().split()[1]) * 1024
    try:
        exe = os.readlink(f"/proc/{containerd_pid}/exe")
    except OSError:
        exe = "containerd"
    return {"nproc": os.cpu_count(), "cpu_model": model, "mem_total_gib": total / (1 << 30),
            "kernel": platform.release(), "containerd": first_line([exe, "--version"]),
            "runc": first_line(["runc", "--version"]), "loadavg_at_start": open("/proc/loadavg").read().strip()}
