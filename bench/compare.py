#!/usr/bin/env python3
"""kplegd --mode=ebpf against kplegd --mode=relist, side by side on the same containerd.

For each pod count N (one container per pod, as the kubelet's 110-pod default counts them) and
each churn rate, both daemons run at the same time against the same private containerd, and
for a fixed window this measures:

  - CPU of each daemon (its own cgroup2 cpu.stat, so dead threads and children count, in
    microseconds), of containerd, of its shims (a cgroup2 directory the runtime was moved into
    before any pod existed), and the in-kernel time of the ebpf daemon's BPF programs (their
    run_time_ns, with kernel.bpf_stats_enabled=1 for the run and restored after);
  - detection latency of every transition kpleg-load churn made, at a Watch consumer: from the
    kernel's timestamp of the transition (kernel_ts_ns, taken from the ebpf daemon's event for the
    same container and transition, so both modes are measured against the same instant), and,
    as a cross-check, from the driver's own clock around the CRI call;
  - missed and duplicated transitions against the ground truth (the churn's CRI calls, each
    confirmed by the runtime's answer, plus the pod teardown), and events nobody asked for;
  - daemon RSS, the ebpf daemon's correction counter, the relist daemon's relists.

Then, at N=110, each mode alone and no daemon at all (the idle comparison: both daemons load
the same containerd in the shared runs), and a slow-runtime scenario when kpleg-cri-proxy is
built: one pod's CRI calls hang.

Standard library only. Run through bench/run.sh, which brings up the private test bed.
"""

import argparse
import bisect
import csv
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
MiB = 1 << 20
TYPES = ("ContainerStarted", "ContainerDied", "ContainerRemoved")
CALL_TO_TYPE = {"started": "ContainerStarted", "died": "ContainerDied", "removed": "ContainerRemoved"}
MODES = ("ebpf", "relist")


def log(msg):
    print(f"compare: {msg}", file=sys.stderr, flush=True)


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
    """Per thread: (name, ns on CPU, times scheduled in), from /proc/<pid>/task/*/schedstat."""
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
        except (OSError, ValueError):
            continue
        out[tid] = (name, run_ns, slices)
    return out


def threads_cpu_s(pid):
    """CPU of a process's live threads, nanosecond precision (a thread that exited is lost,
    which is rare in a Go runtime like containerd)."""
    return sum(v[1] for v in threads(pid).values()) / 1e9


def thread_breakdown(before, after, elapsed_s):
    """CPU ms per minute and wake-ups per second of each thread, grouped by thread name."""
    groups = {}
    for tid, (name, ns, slices) in after.items():
        ns0, sl0 = (before[tid][1], before[tid][2]) if tid in before else (0, 0)
        g = groups.setdefault(name, {"threads": 0, "cpu_ms_per_min": 0.0, "wakeups_per_s": 0.0})
        g["threads"] += 1
        g["cpu_ms_per_min"] += (ns - ns0) / 1e6 * 60 / elapsed_s
        g["wakeups_per_s"] += (slices - sl0) / elapsed_s
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


def bpf_prog_run_ns(pid):
    """Sum of run_time_ns / run_cnt over the BPF programs a process holds (its fdinfo)."""
    seen, t, n = set(), 0, 0
    try:
        fds = os.listdir(f"/proc/{pid}/fdinfo")
    except OSError:
        return None
    for fd in fds:
        info = {}
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                for line in f:
                    k, _, v = line.partition(":")
                    info[k.strip()] = v.strip()
        except OSError:
            continue
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


# --- the daemons and their consumers -----------------------------------------------------------

class EventLog:
    """Lines of one consumer, parsed, each with the time it arrived."""

    def __init__(self, raw_path):
        self.lock = threading.Lock()
        self.events = []   # kind == event
        self.stats = []    # kind == stats (Watch consumer only)
        self.ready = threading.Event()
        self.raw = open(raw_path, "a")

    def feed(self, obj):
        with self.lock:
            self.raw.write(json.dumps(obj, separators=(",", ":")) + "\n")
            kind = obj.get("kind", "event")
            if kind == "event":
                self.events.append(obj)
            elif kind == "stats":
                self.stats.append(obj)
            elif kind == "ready":
                self.ready.set()

    def last_recv_ns(self):
        with self.lock:
            return self.events[-1]["recv_ts_ns"] if self.events else 0

    def events_between(self, t0, t1):
        with self.lock:
            return [e for e in self.events if t0 <= e["recv_ts_ns"] <= t1]

    def close(self):
        with self.lock:
            self.raw.close()


class Daemon:
    """One kplegd, in its own cgroup, and its consumer.

    With kplegd's API socket, the consumer is kpleg-bench-watch (a kpleg.v1 Watch client that
    stamps arrival times and samples Stats). Without it, kplegd's --print-events json stdout is
    read here and stamped on arrival."""

    def __init__(self, cfg, mode, endpoint, cgroup, out_dir, tag, consumer=None):
        self.cfg, self.mode, self.cgroup = cfg, mode, cgroup
        consumer = consumer or cfg.consumer
        self.tag = tag
        self.log = EventLog(os.path.join(out_dir, f"events-{tag}.jsonl"))
        self.stderr = open(os.path.join(out_dir, f"kplegd-{tag}.log"), "a")
        # No metrics server: two daemons would contend for its default port, and nothing scrapes.
        args = [cfg.kplegd, "--mode", mode, "--runtime-endpoint", endpoint, "--log-level", "warn",
                "--relist-period", cfg.relist_period, "--metrics-address", "",
                "--cgroup-root", cfg.cgroup_prefix_name]
        self.socket = None
        if consumer == "watch":
            self.socket = os.path.join(cfg.sock_dir, f"{tag}.sock")
            args += ["--socket", self.socket]
        elif consumer == "stdout":
            args += ["--print-events", "json", "--socket", ""]
        else:  # the API socket, but nobody watching: the daemon's floor without a consumer
            args += ["--socket", os.path.join(cfg.sock_dir, f"{tag}.sock")]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE if consumer == "stdout" else subprocess.DEVNULL,
                                     stderr=self.stderr, preexec_fn=cgroup.join_fn(), text=True, bufsize=1)
        self.watch = None
        if consumer == "none":
            self.reader = threading.Thread(target=lambda: None)
            self.reader.start()
            self.log.ready.set()
        elif consumer == "stdout":
            self.reader = threading.Thread(target=self._read_stdout, daemon=True)
            self.reader.start()
            self.log.ready.set()  # printing starts from the daemon's first event
        else:
            self.watch = subprocess.Popen([cfg.watch, "--socket", self.socket, "--connect-timeout", "60"],
                                          stdout=subprocess.PIPE, stderr=self.stderr, text=True, bufsize=1)
            self.reader = threading.Thread(target=self._read_watch, daemon=True)
            self.reader.start()

    def _read_stdout(self):
        for line in self.proc.stdout:
            recv = now_ns()
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            obj["kind"] = "event"
            obj["recv_ts_ns"] = recv
            self.log.feed(obj)

    def _read_watch(self):
        for line in self.watch.stdout:
            try:
                self.log.feed(json.loads(line))
            except ValueError:
                continue

    def request_stats(self, timeout=5.0):
        """A fresh Stats sample from the consumer (SIGUSR1), waited for with a deadline."""
        if self.watch is None or self.watch.poll() is not None:
            return None
        with self.log.lock:
            have = len(self.log.stats)
        self.watch.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.log.lock:
                if len(self.log.stats) > have:
                    return self.log.stats[-1]
            time.sleep(0.02)  # polling with a deadline
        return None

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def wait_ready(self, timeout):
        """Up, subscribed, and done with its initial sync (no event for 2 s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"kplegd --mode={self.mode} exited with {self.proc.returncode}; "
                                   f"see {self.stderr.name}")
            if self.log.ready.is_set():
                last = self.log.last_recv_ns()
                started = getattr(self, "_ready_since", None)
                if started is None:
                    self._ready_since = now_ns()
                elif now_ns() - max(last, started) > 2e9:
                    return
            time.sleep(0.2)  # polling with a deadline
        raise RuntimeError(f"kplegd --mode={self.mode} not ready within {timeout:.0f} s")

    def stop(self):
        for p in (self.proc, self.watch):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in (self.proc, self.watch):
            if p is None:
                continue
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.reader.join(timeout=5)
        self.log.close()
        self.stderr.close()


# --- the runtime ---------------------------------------------------------------------------------

class Runtime:
    def __init__(self, cfg, cgroup):
        self.cfg = cfg
        self.cgroup = cgroup
        self.containerd_pid = cfg.containerd_pid

    def sample(self):
        return {"total_s": self.cgroup.usage_usec() / 1e6,
                "containerd_s": threads_cpu_s(self.containerd_pid),
                "processes": len(self.cgroup.pids())}


def load_cmd(cfg, *args, endpoint=None):
    # Through the prefixing forwarder: the pods land under the benchmark's own cgroup prefix.
    return [cfg.kpleg_load, "--runtime-endpoint", endpoint or cfg.load_endpoint, *args]


def start_prefix_proxy(cfg, out_dir):
    """kpleg-bench-cri-prefix between kpleg-load and containerd (see cgroup_prefix_proxy.cc)."""
    sock = os.path.join(cfg.sock_dir, "load.sock")
    err = open(os.path.join(out_dir, "cri-prefix.log"), "a")
    p = subprocess.Popen([cfg.prefix_proxy, "--listen", f"unix://{sock}", "--upstream", cfg.endpoint,
                          "--prefix", "/" + cfg.cgroup_prefix_name], stdout=err, stderr=err)
    if cfg.pid_file:
        with open(cfg.pid_file, "w") as f:
            f.write(str(p.pid))
    cfg.load_endpoint = f"unix://{sock}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"kpleg-bench-cri-prefix exited with {p.returncode}: see {err.name}")
        rc, lines, _ = run_json_lines(load_cmd(cfg, "version"), timeout=10)
        if rc == 0 and lines:
            return p
        time.sleep(0.1)  # polling with a deadline
    raise RuntimeError("kpleg-bench-cri-prefix did not answer within 10 s")


def run_json_lines(cmd, timeout):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = []
    for line in p.stdout.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            pass
    return p.returncode, lines, p.stderr


class Pods:
    """The steady population: N pods with one long-running container each."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.pods = []

    def grow_to(self, n, batch=25):
        """Returns None when n pods run, else why it stopped short."""
        while len(self.pods) < n:
            k = min(batch, n - len(self.pods))
            need = k * self.cfg.pod_bytes + self.cfg.mem_reserve
            avail = mem_available_bytes()
            if avail < need:
                return (f"stopped at {len(self.pods)} pods: MemAvailable {avail / MiB:.0f} MiB, another "
                        f"{k} pods at ~{self.cfg.pod_bytes / MiB:.0f} MiB each would leave less than the "
                        f"{self.cfg.mem_reserve / MiB:.0f} MiB reserve")
            rc, lines, err = run_json_lines(
                load_cmd(self.cfg, "run", "--pods", str(k), "--containers", "1", "--namespace", "kpleg-bench",
                         "--name-prefix", f"base{len(self.pods)}"), timeout=60 + 5 * k)
            self.pods += [p for p in lines if "sandbox_id" in p]
            if rc != 0:
                return f"stopped at {len(self.pods)} pods: kpleg-load run failed: {err.strip()[-300:]}"
        return None

    def remove(self, pod):
        run_json_lines(load_cmd(self.cfg, "remove-pod", pod["sandbox_id"]), timeout=60)
        self.pods.remove(pod)


# --- ground truth and evaluation -----------------------------------------------------------------

def run_churn(cfg, rate, duration, out_path, namespace="kpleg-bench-churn"):
    cmd = load_cmd(cfg, "churn", "--rate", str(rate), "--duration", str(duration), "--pods", str(cfg.churn_pods),
                   "--max-live", "4", "--namespace", namespace, "--name-prefix", "churn")
    t0 = now_ns()
    rc, lines, err = run_json_lines(cmd, timeout=duration + 120)
    t1 = now_ns()
    with open(out_path, "a") as f:
        for l in lines:
            f.write(json.dumps(l) + "\n")
    if rc != 0:
        log(f"churn exited {rc}: {err.strip()[-300:]}")
    return {"rc": rc, "lines": lines, "t_begin_ns": t0, "t_end_ns": t1, "stderr": err[-500:]}


def expected_transitions(churn):
    """(container id, event type) -> trace of the CRI call that made it (None: made by the pod
    teardown at the end, untimed), and the pod uids involved."""
    exp, pods, sandboxes = {}, set(), {}
    for l in churn["lines"]:
        if l.get("op") == "pod":
            pods.add(l["pod_uid"])
            sandboxes[l["sandbox_id"]] = l["pod_uid"]
        if "call" not in l or not l.get("ok"):
            continue
        cid = l["container_id"]
        if l["call"] == "CreateContainer":
            # Every created container dies and is removed by the end: in the churn or at teardown.
            exp.setdefault((cid, "ContainerDied"), None)
            exp.setdefault((cid, "ContainerRemoved"), None)
        elif l.get("transition") in CALL_TO_TYPE:
            exp[(cid, CALL_TO_TYPE[l["transition"]])] = l
    for sid in sandboxes:  # the churn pod's sandbox: started, died and removed within the window
        for t in TYPES:
            exp.setdefault((sid, t), None)
    return exp, pods


def evaluate(events_by_mode, churn, base_uids):
    """Per mode: missed, duplicated, out-of-order, unexpected; latencies per transition."""
    exp, churn_pods = expected_transitions(churn) if churn else ({}, set())
    kernel_ts = {}
    for e in events_by_mode.get("ebpf", []):
        if e.get("kernel_ts_ns") and e["type"] in TYPES:
            kernel_ts.setdefault((e["container_id"], e["type"]), e["kernel_ts_ns"])
    out = {}
    for mode, events in events_by_mode.items():
        seen = {}
        unexpected, order_violations, corrections, resyncs = 0, 0, 0, 0
        first_of = {}
        for e in events:
            if e["type"] == "Resync":
                resyncs += 1
                continue
            if e.get("correction"):
                corrections += 1
            key = (e["container_id"], e["type"])
            if key in exp:
                seen[key] = seen.get(key, 0) + 1
                first_of.setdefault(key, e)
            elif e["type"] in TYPES:
                unexpected += 1
        missed = [k for k in exp if k not in seen]
        dups = sum(n - 1 for n in seen.values() if n > 1)
        for (cid, t), e in first_of.items():
            if t == "ContainerStarted":
                d = first_of.get((cid, "ContainerDied"))
                if d is not None and d["seq"] < e["seq"]:
                    order_violations += 1
        lat = {t: {"kernel": [], "call_begin": [], "call_end": []} for t in TYPES}
        samples = []
        for key, e in first_of.items():
            cid, t = key
            trace = exp[key]
            k = kernel_ts.get(key)
            lk = (e["recv_ts_ns"] - k) / 1e6 if k else None
            lb = (e["recv_ts_ns"] - trace["t_begin_ns"]) / 1e6 if trace else None
            le = (e["recv_ts_ns"] - trace["t_end_ns"]) / 1e6 if trace else None
            if trace is None:
                continue  # teardown transitions: counted, not timed
            lat[t]["kernel"].append(lk)
            lat[t]["call_begin"].append(lb)
            lat[t]["call_end"].append(le)
            emit = e.get("emit_ts_ns") or None
            # A kernel timestamp from before the CRI call that made the transition began cannot
            # be that transition's: the kernel signal came from something else in the cgroup.
            samples.append({"type": t, "container_id": cid, "kernel_ms": lk, "call_begin_ms": lb,
                            "kernel_before_call": bool(k and k < trace["t_begin_ns"]),
                            "call_end_ms": le, "source": e.get("source"),
                            "kernel_to_emit_ms": (emit - k) / 1e6 if k and emit else None,
                            "emit_to_consumer_ms": (e["recv_ts_ns"] - emit) / 1e6 if emit else None})
        kernel_driven = lat["ContainerStarted"]["kernel"] + lat["ContainerDied"]["kernel"]
        plausible = [x["kernel_ms"] for x in samples
                     if x["type"] != "ContainerRemoved" and not x["kernel_before_call"]]
        out[mode] = {
            "expected": len(exp),
            "timed": sum(1 for v in exp.values() if v is not None),
            "missed": len(missed),
            "missed_detail": [f"{t}:{c[:12]}" for c, t in missed][:20],
            "duplicated": dups,
            "died_before_started": order_violations,
            "unexpected": unexpected,
            "corrections_in_events": corrections,
            "resyncs": resyncs,
            "kernel_ts_before_call": sum(1 for x in samples if x["kernel_before_call"]),
            "latency_ms": {
                "started_died_from_kernel": summarize(kernel_driven),
                "started_died_from_kernel_plausible_ts": summarize(plausible),
                **{f"{t}_from_call_begin": summarize(lat[t]["call_begin"]) for t in TYPES},
                **{f"{t}_from_call_end": summarize(lat[t]["call_end"]) for t in TYPES},
                **{f"{t}_from_kernel": summarize(lat[t]["kernel"]) for t in TYPES[:2]},
                # Where the time goes: the daemon waiting for the runtime to report the state the
                # kernel saw (kernel -> emit), and the Watch stream (emit -> consumer).
                "started_died_kernel_to_emit": summarize(
                    [x["kernel_to_emit_ms"] for x in samples if x["type"] != "ContainerRemoved"]),
                "all_emit_to_consumer": summarize([x["emit_to_consumer_ms"] for x in samples]),
            },
            "samples": samples,
        }
    return out


def wait_settled(daemons, churn, timeout):
    """Polls until every expected transition reached every consumer, or the deadline."""
    exp, _ = expected_transitions(churn)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = True
        for d in daemons:
            keys = {(e["container_id"], e["type"]) for e in d.log.events_between(churn["t_begin_ns"], now_ns())}
            if not all(k in keys for k in exp):
                done = False
                break
        if done:
            return True
        time.sleep(0.25)  # polling with a deadline
    return False


# --- windows -------------------------------------------------------------------------------------

STATS_AFTERMATH_S = 1.0


def take_sample(daemons, runtime, with_stats=False):
    # The Stats call (a gRPC round trip that wakes the daemon's server threads, and its timer
    # threads twice more within ~0.3 s, measured) comes a second before the CPU readings, so that
    # it is outside the window that starts here: an idle window then holds nothing of the bench's
    # own making. The window's closing Stats is asked after its settling.
    stats = {d.tag: d.request_stats() for d in daemons} if with_stats else {}
    if stats:
        time.sleep(STATS_AFTERMATH_S)
    s = {"t_ns": now_ns(), "mono": time.monotonic(), "runtime": runtime.sample(), "daemons": {}}
    for d in daemons:
        s["daemons"][d.tag] = {"cpu_s": d.cgroup.usage_usec() / 1e6, "rss_kib": vm_rss_kib(d.pid),
                               "bpf": bpf_prog_run_ns(d.pid) if d.mode == "ebpf" else None,
                               "threads": threads(d.pid), "stats": stats.get(d.tag)}
    return s


def per_minute(delta_s, elapsed_s):
    return delta_s * 60.0 / elapsed_s if elapsed_s > 0 else None


def warm_up(cfg, daemons, out_dir, label):
    """Churn before a daemon pair's first churn window, not measured. kplegd learns from its first
    confirmations when the runtime reports a transition (pleg/lag_learner.h); until it has, its
    looks come early and are repeated. That start-up cost is paid once per daemon, so the windows
    measure the steady state; what the warm-up itself cost is recorded beside them."""
    log(f"{label}: warm-up, {cfg.warmup_s:g} s of churn at {cfg.warmup_rate:g}/s (not measured)")
    st0 = {d.tag: d.request_stats() for d in daemons}
    churn = run_churn(cfg, cfg.warmup_rate, cfg.warmup_s, os.path.join(out_dir, f"churn-{label}-warmup.jsonl"),
                      namespace="kpleg-bench-warmup")
    # Settled: the ebpf daemon has every transition; the relist daemon, which misses what lives
    # shorter than its period, has relisted twice since (its last events are out before a window).
    settled = wait_settled([d for d in daemons if d.mode != "relist"], churn, timeout=cfg.settle_s)
    for d in daemons:
        if d.mode != "relist":
            continue
        first = (d.request_stats() or {}).get("relists", 0)
        deadline = time.monotonic() + cfg.settle_s
        while (d.request_stats() or {}).get("relists", 0) < first + 2:
            if time.monotonic() > deadline:
                settled = False
                break
            time.sleep(0.25)  # polling with a deadline
    lifecycles = len({cid for cid, _ in expected_transitions(churn)[0]})
    out = {"label": label, "seconds": cfg.warmup_s, "rate": cfg.warmup_rate, "settled": settled,
           "lifecycles": lifecycles, "daemons": {}}
    for d in daemons:
        a, b = st0.get(d.tag), d.request_stats()
        if a and b:
            calls = (b.get("cri_calls") or 0) - (a.get("cri_calls") or 0)
            out["daemons"][d.mode] = {
                "cri_calls": calls,
                "confirm_retries": (b.get("confirm_retries") or 0) - (a.get("confirm_retries") or 0),
                "cri_calls_per_lifecycle": calls / lifecycles if lifecycles else None}
    e = out["daemons"].get("ebpf", {})
    log(f"  warm-up: {lifecycles} lifecycles, ebpf {fmt(e.get('cri_calls_per_lifecycle'), 2)} CRI calls per "
        f"lifecycle ({e.get('confirm_retries')} retries){'' if settled else ', NOT settled'}")
    return out


def window(cfg, daemons, runtime, rate, seconds, out_dir, label, base_uids):
    """One measurement window: idle or churn at `rate`, then settle, then evaluate."""
    s0 = take_sample(daemons, runtime, with_stats=True)
    churn = None
    if rate > 0:
        churn = run_churn(cfg, rate, seconds, os.path.join(out_dir, f"churn-{label}.jsonl"))
    else:
        time.sleep(seconds)  # the idle window itself
    s1 = take_sample(daemons, runtime)
    settled = True
    if churn:
        settled = wait_settled(daemons, churn, timeout=cfg.settle_s)
    t_end = now_ns()
    elapsed = s1["mono"] - s0["mono"]
    r0, r1 = s0["runtime"], s1["runtime"]
    with open("/proc/loadavg") as f:
        loadavg = f.read().split()[0]  # the machine is shared: how busy it was, for the record
    res = {"label": label, "rate": rate, "window_s": elapsed, "settled": settled, "loadavg_1m": float(loadavg),
           "t_begin_ns": s0["t_ns"], "t_end_ns": t_end,
           "runtime": {"total_s_per_min": per_minute(r1["total_s"] - r0["total_s"], elapsed),
                       "containerd_s_per_min": per_minute(r1["containerd_s"] - r0["containerd_s"], elapsed),
                       "shims_s_per_min": per_minute((r1["total_s"] - r1["containerd_s"]) -
                                                     (r0["total_s"] - r0["containerd_s"]), elapsed),
                       "processes": r1["processes"]},
           "daemons": {}}
    if churn:
        res["churn"] = {"rc": churn["rc"],
                        "summary": next((l for l in churn["lines"] if l.get("op") == "churn"), None)}
    events = {d.mode: d.log.events_between(s0["t_ns"], t_end) for d in daemons}
    ev = evaluate(events, churn, base_uids)
    lifecycles = len({cid for cid, _ in expected_transitions(churn)[0]}) if churn else 0
    res["lifecycles"] = lifecycles
    for d in daemons:
        a, b = s0["daemons"][d.tag], s1["daemons"][d.tag]
        dres = {"cpu_s_per_min": per_minute(b["cpu_s"] - a["cpu_s"], elapsed),
                "rss_mib": (b["rss_kib"] or 0) / 1024.0,
                "alive": d.alive()}
        if a["bpf"] and b["bpf"]:
            dres["bpf_s_per_min"] = per_minute((b["bpf"]["run_time_ns"] - a["bpf"]["run_time_ns"]) / 1e9, elapsed)
            dres["bpf_runs"] = b["bpf"]["run_cnt"] - a["bpf"]["run_cnt"]
            dres["bpf_programs"] = b["bpf"]["programs"]
        dres["threads"] = thread_breakdown(a["threads"], b["threads"], elapsed)
        st0, st1 = a["stats"], d.request_stats()
        if st0 and st1:
            dres["stats"] = {k: st1.get(k) for k in ("mode", "healthy", "health_reasons", "corrections",
                                                     "relists", "kernel_events", "lost_kernel_events",
                                                     "pods", "containers", "cri_calls")}
            # From the window's start to the end of its settling: the calls the window's
            # lifecycles (start, death, removal) cost, per container or sandbox that the churn
            # made.
            dres["cri_calls_delta"] = (st1.get("cri_calls") or 0) - (st0.get("cri_calls") or 0)
            if lifecycles:
                dres["cri_calls_per_lifecycle"] = dres["cri_calls_delta"] / lifecycles
            # The same calls by kind: the targeted looks (ContainerStatus, PodSandboxStatus), of
            # them the ones that found the runtime behind the kernel (retries), and the lists
            # (the removal sweep's, the reconcile's, the relist's).
            m0, m1 = st0.get("cri_calls_by_method") or {}, st1.get("cri_calls_by_method") or {}
            by_method = {k: m1.get(k, 0) - m0.get(k, 0) for k in set(m0) | set(m1)}
            dres["cri_calls_by_method"] = {k: v for k, v in sorted(by_method.items()) if v}
            dres["confirm_retries_delta"] = (st1.get("confirm_retries") or 0) - (st0.get("confirm_retries") or 0)
            if lifecycles:
                looks = by_method.get("ContainerStatus", 0) + by_method.get("PodSandboxStatus", 0)
                lists = by_method.get("ListContainers", 0) + by_method.get("ListPodSandbox", 0)
                dres["looks_per_lifecycle"] = looks / lifecycles
                dres["retries_per_lifecycle"] = dres["confirm_retries_delta"] / lifecycles
                dres["lists_per_lifecycle"] = lists / lifecycles
            dres["corrections_delta"] = (st1.get("corrections") or 0) - (st0.get("corrections") or 0)
            dr = (st1.get("relists") or 0) - (st0.get("relists") or 0)
            span = (st1["ts_ns"] - st0["ts_ns"]) / 1e9
            dres["relists_delta"] = dr
            dres["mean_relist_interval_s"] = span / dr if dr > 0 else None
        if d.mode in ev:
            dres.update(ev[d.mode])
        res["daemons"][d.mode] = dres
    return res


# --- the report files ----------------------------------------------------------------------------

CSV_FIELDS = ["n", "rate", "mode", "window_s", "daemon_cpu_s_per_min", "bpf_s_per_min",
              "runtime_total_s_per_min", "containerd_s_per_min", "shims_s_per_min", "rss_mib",
              "expected", "missed", "duplicated", "died_before_started", "unexpected", "corrections",
              "relists", "mean_relist_interval_s", "cri_calls", "cri_calls_per_lifecycle",
              "lat_kernel_p50_ms", "lat_kernel_p99_ms", "lat_kernel_max_ms",
              "started_call_end_p50_ms", "started_call_end_p99_ms",
              "died_call_end_p50_ms", "died_call_end_p99_ms",
              "removed_call_end_p50_ms", "removed_call_end_p99_ms", "removed_call_end_max_ms",
              "looks_per_lifecycle", "retries_per_lifecycle", "lists_per_lifecycle"]


def csv_row(n, w, mode):
    d = w["daemons"][mode]
    lat = d.get("latency_ms", {})
    g = lambda k, f: (lat.get(k) or {}).get(f)
    return {"n": n, "rate": w["rate"], "mode": mode, "window_s": round(w["window_s"], 2),
            "daemon_cpu_s_per_min": d["cpu_s_per_min"], "bpf_s_per_min": d.get("bpf_s_per_min"),
            "runtime_total_s_per_min": w["runtime"]["total_s_per_min"],
            "containerd_s_per_min": w["runtime"]["containerd_s_per_min"],
            "shims_s_per_min": w["runtime"]["shims_s_per_min"], "rss_mib": round(d["rss_mib"], 1),
            "expected": d.get("expected"), "missed": d.get("missed"), "duplicated": d.get("duplicated"),
            "died_before_started": d.get("died_before_started"), "unexpected": d.get("unexpected"),
            "corrections": d.get("corrections_delta", d.get("corrections_in_events")),
            "relists": d.get("relists_delta"), "mean_relist_interval_s": d.get("mean_relist_interval_s"),
            "cri_calls": d.get("cri_calls_delta"), "cri_calls_per_lifecycle": d.get("cri_calls_per_lifecycle"),
            "lat_kernel_p50_ms": g("started_died_from_kernel", "p50"),
            "lat_kernel_p99_ms": g("started_died_from_kernel", "p99"),
            "lat_kernel_max_ms": g("started_died_from_kernel", "max"),
            "started_call_end_p50_ms": g("ContainerStarted_from_call_end", "p50"),
            "started_call_end_p99_ms": g("ContainerStarted_from_call_end", "p99"),
            "died_call_end_p50_ms": g("ContainerDied_from_call_end", "p50"),
            "died_call_end_p99_ms": g("ContainerDied_from_call_end", "p99"),
            "removed_call_end_p50_ms": g("ContainerRemoved_from_call_end", "p50"),
            "removed_call_end_p99_ms": g("ContainerRemoved_from_call_end", "p99"),
            "removed_call_end_max_ms": g("ContainerRemoved_from_call_end", "max"),
            "looks_per_lifecycle": d.get("looks_per_lifecycle"),
            "retries_per_lifecycle": d.get("retries_per_lifecycle"),
            "lists_per_lifecycle": d.get("lists_per_lifecycle")}


def fmt(v, digits=2):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def write_outputs(cfg, results, write_json=True):
    out = cfg.out_dir
    cells = results["cells"]
    if write_json:
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    rows = [csv_row(c["n"], c, m) for c in cells for m in MODES if m in c["daemons"]]
    with open(os.path.join(out, "cells.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(out, "latency_samples.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scenario", "n", "rate", "mode", "type", "kernel_ms", "call_begin_ms", "call_end_ms"])
        for c in cells + ([results["slow_runtime"]["stalled"]] if results.get("slow_runtime", {}).get("stalled") else []):
            for m, d in c["daemons"].items():
                for s in d.get("samples", []):
                    w.writerow([c.get("scenario", "shared"), c.get("n"), c["rate"], m, s["type"],
                                s["kernel_ms"], s["call_begin_ms"], s["call_end_ms"]])
    # gnuplot inputs: CPU vs N (rate 0) per mode, and latency CDFs (all churn cells pooled).
    for rate in sorted({c["rate"] for c in cells}):
        name = "cpu_vs_n.dat" if rate == 0 else f"cpu_vs_n_r{rate}.dat"
        with open(os.path.join(out, name), "w") as f:
            f.write(f"# churn {rate}/s: n ebpf_daemon ebpf_daemon_plus_bpf relist_daemon runtime_shared "
                    "ebpf_rss_mib relist_rss_mib\n")
            for c in cells:
                if c["rate"] != rate or "ebpf" not in c["daemons"] or "relist" not in c["daemons"]:
                    continue
                e, r = c["daemons"]["ebpf"], c["daemons"]["relist"]
                f.write(f"{c['n']} {e['cpu_s_per_min']:.6f} {e['cpu_s_per_min'] + (e.get('bpf_s_per_min') or 0):.6f} "
                        f"{r['cpu_s_per_min']:.6f} {c['runtime']['total_s_per_min']:.6f} "
                        f"{e['rss_mib']:.1f} {r['rss_mib']:.1f}\n")
    for mode in MODES:
        for suffix, types in (("", ("ContainerStarted", "ContainerDied")), ("_started", ("ContainerStarted",)),
                              ("_died", ("ContainerDied",))):
            vals = sorted(s["kernel_ms"] for c in cells if c["rate"] > 0 for s in
                          c["daemons"].get(mode, {}).get("samples", [])
                          if s["kernel_ms"] is not None and s["type"] in types)
            with open(os.path.join(out, f"latency_cdf_{mode}{suffix}.dat"), "w") as f:
                f.write(f"# latency_ms_from_kernel cumulative_fraction ({'+'.join(types)}, all churn cells)\n")
                for i, v in enumerate(vals):
                    f.write(f"{max(v, 0.001):.4f} {(i + 1) / len(vals):.6f}\n")
    # How far each event trails the runtime's own answer: from the end of the CRI call that made
    # the transition (StartContainer returns once containerd has the container running,
    # StopContainer once it has recorded the exit). <= 0: the event arrived before the call
    # returned; drawn at 0.1 ms on the log axis.
    for mode in MODES:
        for t, suffix in (("ContainerStarted", "started"), ("ContainerDied", "died"), ("ContainerRemoved", "removed")):
            vals = sorted(s["call_end_ms"] for c in cells if c["rate"] > 0 for s in
                          c["daemons"].get(mode, {}).get("samples", [])
                          if s["call_end_ms"] is not None and s["type"] == t)
            with open(os.path.join(out, f"lag_cdf_{mode}_{suffix}.dat"), "w") as f:
                f.write(f"# ms from the end of the CRI call to the consumer, {t}, all churn cells\n")
                for i, v in enumerate(vals):
                    f.write(f"{max(v, 0.1):.4f} {(i + 1) / len(vals):.6f}\n")
    write_summary(cfg, results)


def churn_rows(results):
    """(cell, mode, daemon result) of every churn window, in report order."""
    for c in results["cells"]:
        if c["rate"] == 0:
            continue
        for mode in MODES:
            d = c["daemons"].get(mode)
            if d:
                yield c, mode, d


def write_summary(cfg, results):
    L = []
    L.append(f"# kpleg benchmark results ({results['meta']['started']})\n")
    L.append(f"Command: `{results['meta']['command']}`  ")
    L.append(f"Consumer: {results['meta']['consumer_note']}\n")
    m = results["meta"]["machine"]
    L.append(f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_total_gib']:.1f} GiB, Linux {m['kernel']}, "
             f"{m['containerd']}, {m['runc']}\n")
    if results.get("stopped_reason"):
        L.append(f"**Pod count stopped early**: {results['stopped_reason']}\n")
    L.append("## Shared runs (both daemons at once, same containerd)\n")
    L.append("CPU in seconds per minute; runtime = containerd + shims, loaded by both daemons at once. "
             "Latency from the kernel's timestamp of the transition to arrival at the consumer "
             "(ContainerStarted + ContainerDied); Removed from the end of the RemoveContainer call.\n")
    L.append("| N | rate/s | mode | daemon CPU | BPF CPU | runtime CPU | RSS MiB | expected | missed | dup | unexp. | corr. | lat p50 ms | lat p99 ms | lat max ms | Removed p50/p99 ms |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in results["cells"]:
        for mode in MODES:
            if mode not in c["daemons"]:
                continue
            r = csv_row(c["n"], c, mode)
            L.append(f"| {c['n']} | {c['rate']} | {mode} | {fmt(r['daemon_cpu_s_per_min'], 3)} | "
                     f"{fmt(r['bpf_s_per_min'], 4)} | {fmt(r['runtime_total_s_per_min'], 2)} | {fmt(r['rss_mib'], 1)} | "
                     f"{fmt(r['expected'])} | {fmt(r['missed'])} | {fmt(r['duplicated'])} | {fmt(r['unexpected'])} | "
                     f"{fmt(r['corrections'])} | {fmt(r['lat_kernel_p50_ms'], 1)} | {fmt(r['lat_kernel_p99_ms'], 1)} | "
                     f"{fmt(r['lat_kernel_max_ms'], 1)} | {fmt(r['removed_call_end_p50_ms'], 0)}/{fmt(r['removed_call_end_p99_ms'], 0)} |")
    L.append("\n### CRI calls per container lifecycle (churn windows)\n")
    L.append("Every CRI call a daemon made from the window's start until its events settled, over the "
             "containers and sandboxes the churn made (each one a lifecycle: start, death, removal); "
             "daemon CPU per transition = daemon CPU in the window over its transitions.\n")
    L.append("By kind, per lifecycle: looks = ContainerStatus + PodSandboxStatus calls (of them, "
             "retries: looks that found the runtime not caught up with the kernel yet, so that another "
             "followed), lists = ListContainers + ListPodSandbox calls (ebpf: the removal sweep's; "
             "relist: every relist's).\n")
    L.append("| N | rate/s | mode | lifecycles | CRI calls | calls/lifecycle | looks (retries) | lists | daemon CPU ms/transition |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for c, mode, d in churn_rows(results):
        per_tr = (d["cpu_s_per_min"] * c["window_s"] / 60.0 * 1000.0 / d["expected"]
                  if d.get("expected") and d.get("cpu_s_per_min") is not None else None)
        L.append(f"| {c['n']} | {c['rate']} | {mode} | {fmt(c.get('lifecycles'))} | "
                 f"{fmt(d.get('cri_calls_delta'))} | {fmt(d.get('cri_calls_per_lifecycle'), 2)} | "
                 f"{fmt(d.get('looks_per_lifecycle'), 2)} ({fmt(d.get('retries_per_lifecycle'), 2)}) | "
                 f"{fmt(d.get('lists_per_lifecycle'), 2)} | {fmt(per_tr, 2)} |")
    L.append("\n### Where ebpf's daemon CPU goes (churn windows)\n")
    L.append("Per thread of the ebpf daemon, from /proc/<pid>/task/*/schedstat over the window: CPU ms per "
             "minute and times scheduled in per second (the four busiest thread names; `kpleg-loop` the "
             "tracker's event loop: the kernel's records, the looks and the runtime's event stream, "
             "`kpleg-offload` the removal sweep's lists, "
             "`grpcpp_sync_ser` the Watch consumer's stream).\n")
    for c, mode, d in churn_rows(results):
        th = d.get("threads") or {}
        if mode != "ebpf" or not th:
            continue
        L.append(f"- N={c['n']}, {c['rate']}/s: " + ", ".join(
            f"{name}×{g['threads']} {g['cpu_ms_per_min']:.1f} ms/min {g['wakeups_per_s']:.1f}/s"
            for name, g in list(th.items())[:4]))
    L.append("\n### Where the latency goes (churn windows)\n")
    L.append("ms, p50/p99. *from kernel*: kernel timestamp of the transition to the consumer. *after call*: "
             "from the return of the CRI call that made the transition (StartContainer returns once containerd "
             "reports the container running, StopContainer once it has recorded the exit): the part kpleg "
             "adds on top of the runtime. *kernel→emit* and *emit→consumer* split the first. *bogus ts*: "
             "events whose kernel timestamp predates the CRI call (a signal from another process in the "
             "cgroup); *plausible* excludes them.\n")
    L.append("| N | rate/s | mode | Started from kernel | Started after call | Died from kernel | Died after call | Removed after call | kernel→emit | emit→consumer | bogus ts | Started+Died plausible p50/p99/max |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c, mode, d in churn_rows(results):
        lat = d.get("latency_ms", {})
        pp = lambda k: f"{fmt((lat.get(k) or {}).get('p50'), 1)}/{fmt((lat.get(k) or {}).get('p99'), 1)}"
        pl = lat.get("started_died_from_kernel_plausible_ts") or {}
        L.append(f"| {c['n']} | {c['rate']} | {mode} | {pp('ContainerStarted_from_kernel')} | "
                 f"{pp('ContainerStarted_from_call_end')} | {pp('ContainerDied_from_kernel')} | "
                 f"{pp('ContainerDied_from_call_end')} | {pp('ContainerRemoved_from_call_end')} | "
                 f"{pp('started_died_kernel_to_emit')} | {pp('all_emit_to_consumer')} | "
                 f"{fmt(d.get('kernel_ts_before_call'))} | {fmt(pl.get('p50'), 1)}/{fmt(pl.get('p99'), 1)}/{fmt(pl.get('max'), 1)} |")
    a = results.get("alone")
    if a:
        L.append(f"\n## Idle, each mode alone (N={a['n']}, {a.get('exited_containers') or 0} more pods whose "
                 f"container has exited and stays, {a['window_s']:.0f} s windows)\n")
        L.append("| run | daemon CPU | BPF CPU | containerd | shims | runtime total | daemon + runtime | above no-daemon baseline | daemon RSS MiB |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for k in ("none", "ebpf", "relist", "ebpf-unwatched"):
            x = a["runs"].get(k)
            if not x:
                continue
            L.append(f"| {k} | {fmt(x.get('daemon_cpu_s_per_min'), 4)} | {fmt(x.get('bpf_s_per_min'), 5)} | "
                     f"{fmt(x['containerd_s_per_min'], 3)} | {fmt(x['shims_s_per_min'], 3)} | {fmt(x['runtime_total_s_per_min'], 3)} | "
                     f"{fmt(x['daemon_plus_runtime_s_per_min'], 3)} | {fmt(x.get('above_baseline_s_per_min'), 4)} | {fmt(x.get('rss_mib'), 1)} |")
        def daemon_ratio(key, ebpf_run):
            # The cgroup's CPU counter has 1 µs steps: an ebpf daemon that did not run at all in
            # the window has no ratio, and is said so.
            if a.get(key) is None and (a["runs"].get(ebpf_run, {}).get("daemon_cpu_s_per_min") or 0) == 0 \
                    and (a["runs"]["relist"].get("daemon_cpu_s_per_min") or 0) > 0:
                return "unbounded (ebpf's daemon used no CPU in the window)"
            return f"{fmt(a.get(key), 1)}×"
        L.append(f"\nRatio relist/ebpf, daemon + runtime: {fmt(a.get('ratio_total'), 1)}×; "
                 f"above the no-daemon baseline: {fmt(a.get('ratio_above_baseline'), 1)}×; daemon alone: "
                 f"{daemon_ratio('ratio_daemon', 'ebpf')}; relist daemon / ebpf-unwatched daemon: "
                 f"{daemon_ratio('ratio_daemon_unwatched', 'ebpf-unwatched')}. (ebpf-unwatched: API socket open, no consumer, "
                 f"{a['runs'].get('ebpf-unwatched', {}).get('window_s', 0):.0f} s window.)\n")
        for k in ("ebpf", "relist", "ebpf-unwatched"):
            th = (a["runs"].get(k) or {}).get("threads") or {}
            if th:
                L.append(f"Threads of kplegd {k} (idle): " + ", ".join(
                    f"{name}×{g['threads']} {g['cpu_ms_per_min']:.1f} ms/min {g['wakeups_per_s']:.1f} wake-ups/s"
                    for name, g in list(th.items())[:6]) + "\n")
            calls = (a["runs"].get(k) or {}).get("cri_calls_by_method")
            if calls is not None:
                L.append(f"CRI calls of kplegd {k} in the idle window: " +
                         (", ".join(f"{m} {v}" for m, v in calls.items()) or "none") + "\n")
    s = results.get("slow_runtime")
    if s:
        L.append("\n## Slow runtime (one pod's CRI calls hang)\n")
        if s.get("skipped"):
            L.append(f"Skipped: {s['skipped']}\n")
        else:
            L.append("| run | mode | relists | mean relist interval s | healthy | lat p50 ms | lat p99 ms | lat max ms | missed |")
            L.append("|---|---|---|---|---|---|---|---|---|")
            for k in ("baseline", "stalled"):
                c = s.get(k)
                if not c:
                    continue
                for mode in MODES:
                    d = c["daemons"].get(mode)
                    if not d:
                        continue
                    lat = d.get("latency_ms", {}).get("started_died_from_kernel", {})
                    st = d.get("stats") or {}
                    L.append(f"| {k} | {mode} | {fmt(d.get('relists_delta'))} | {fmt(d.get('mean_relist_interval_s'), 2)} | "
                             f"{fmt(st.get('healthy'))} {'; '.join(st.get('health_reasons') or [])} | {fmt(lat.get('p50'), 1)} | "
                             f"{fmt(lat.get('p99'), 1)} | {fmt(lat.get('max'), 1)} | {fmt(d.get('missed'))} |")
    b = results.get("bpf")
    if b and "exec_storm" in b:
        es = b["exec_storm"]
        L.append("\n## BPF programs\n")
        L.append("| program | outside containers ns/run | runs | container lifecycle ns/run | runs |")
        L.append("|---|---|---|---|---|")
        pc = b["program_cost"]
        for p in sorted(pc["whole_phase"]["programs"]):
            o = pc["outside_containers"]["programs"].get(p, {})
            cl = pc["container_lifecycles"]["programs"].get(p, {})
            if p == "oom_mark_victim":
                cl = pc["oom_kill"]["programs"].get(p, {})
            L.append(f"| {p} | {fmt(o.get('ns_per_run'), 0)} | {fmt(o.get('run_cnt'))} | {fmt(cl.get('ns_per_run'), 0)} | {fmt(cl.get('run_cnt'))} |")
        L.append(f"\nExec storm ({es['rounds'][0]['execs_per_side']} fork+exec+exit of /bin/true per side per round, "
                 f"{len(es['rounds'])} rounds): median slowdown {es['median_slowdown_percent']:.2f} % "
                 f"(ratios {es['min_wall_ratio']:.3f}–{es['max_wall_ratio']:.3f}"
                 + (f", pooled {es['pooled_wall_ratio']:.4f}" if "pooled_wall_ratio" in es else "")
                 + "); from the kernel's statistics "
                 f"{es['bpf_ns_per_iteration_from_stats']:.0f} ns per iteration = {es['slowdown_percent_from_stats']:.3f} %.\n")
        ss = b.get("syscall_storm")
        if ss and "error" in ss:
            L.append(f"Syscall storm: left out ({ss['error']}).\n")
        elif ss:
            L.append(f"Syscall storm (getppid(), {len(ss['rounds'])} rounds of {ss['rounds'][0]['syscalls_per_side']} per side), "
                     f"ns per syscall, median of rounds: nothing attached {ss['median_none_ns_per_syscall']:.1f}, "
                     f"kplegd's default programs {ss['median_default_ns_per_syscall']:.1f} "
                     f"({ss['median_default_extra_ns_per_syscall']:+.1f}), with the removal hint's syscall tracepoints "
                     f"(--removal-hints kernel) {ss['median_default_and_removal_hint_ns_per_syscall']:.1f} "
                     f"({ss['median_removal_hint_extra_ns_per_syscall']:+.1f}): every syscall on the node pays that"
                     + (" (a quick run's storm is too short to tell a few ns apart: quote a full run's)"
                        if b.get("config", {}).get("quick") else "") + ".\n")
    with open(os.path.join(cfg.out_dir, "summary.md"), "w") as f:
        f.write("\n".join(L) + "\n")


# --- main ----------------------------------------------------------------------------------------

def containerd_binary(cfg):
    """The test bed's running containerd (Debian's 1.6, or a 2.x built by scripts/runtimes.sh)."""
    try:
        return os.readlink(f"/proc/{cfg.containerd_pid}/exe")
    except (OSError, AttributeError, TypeError):
        return "containerd"


def machine_info(cfg):
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
    return {"nproc": os.cpu_count(), "cpu_model": model, "mem_total_gib": total / (1 << 30),
            "kernel": platform.release(), "containerd": first_line([containerd_binary(cfg), "--version"]),
            "runc": first_line(["runc", "--version"]), "loadavg_at_start": open("/proc/loadavg").read().strip()}


def kplegd_has_socket(kplegd):
    h = subprocess.run([kplegd, "--help"], capture_output=True, text=True).stdout
    return "--socket" in h


def start_pair(cfg, modes, endpoint, cgroups, out_dir, tag, consumer=None):
    ds = [Daemon(cfg, m, endpoint, cgroups[m], out_dir, f"{m}-{tag}", consumer) for m in modes]
    try:
        for d in ds:
            d.wait_ready(timeout=60 + 0.2 * cfg.current_n)
    except Exception:
        for d in ds:
            d.stop()
        raise
    return ds


def exited_pods(cfg, k):
    """k pods whose one container has exited and stays (a real node's finished init containers and
    jobs, the dead instance the kubelet keeps): the idle runs' daemons watch their removal."""
    if k <= 0:
        return []
    rc, lines, err = run_json_lines(
        load_cmd(cfg, "run", "--pods", str(k), "--containers", "1", "--namespace", "kpleg-bench-exited",
                 "--name-prefix", "exited", "--command", "true"), timeout=60 + 5 * k)
    pods = [p for p in lines if "sandbox_id" in p]
    if rc != 0:
        log(f"exited pods: kpleg-load run failed: {err.strip()[-300:]}")
    # Their containers exit at once (`true`), long before a daemon of the idle runs has started
    # and synced.
    return pods


def alone_runs(cfg, runtime, cgroups, out_dir, n):
    res = {"n": n, "window_s": cfg.idle_window, "runs": {}, "exited_containers": cfg.idle_exited}
    exited = exited_pods(cfg, cfg.idle_exited)
    try:
        alone_windows(cfg, runtime, cgroups, out_dir, n, res)
    finally:
        for p in exited:
            run_json_lines(load_cmd(cfg, "remove-pod", p["sandbox_id"]), timeout=60)
    return res


def alone_windows(cfg, runtime, cgroups, out_dir, n, res):
    # "ebpf-unwatched": the API socket open but no consumer, a diagnostic of the daemon's floor.
    for which in ("none", "ebpf", "relist", "ebpf-unwatched"):
        log(f"N={n}: idle window, {'no daemon' if which == 'none' else which + ' alone'}")
        mode = which.split("-")[0]
        ds = [] if which == "none" else start_pair(cfg, [mode], cfg.endpoint, cgroups, out_dir,
                                                   f"alone-{which}-n{n}",
                                                   "none" if which == "ebpf-unwatched" else None)
        try:
            secs = cfg.unwatched_window if which == "ebpf-unwatched" else cfg.idle_window
            w = window(cfg, ds, runtime, 0, secs, out_dir, f"alone-{which}-n{n}", set())
        finally:
            for d in ds:
                d.stop()
        x = {"containerd_s_per_min": w["runtime"]["containerd_s_per_min"],
             "shims_s_per_min": w["runtime"]["shims_s_per_min"],
             "runtime_total_s_per_min": w["runtime"]["total_s_per_min"], "window_s": w["window_s"]}
        d = w["daemons"].get(mode)
        if d:
            x["daemon_cpu_s_per_min"] = d["cpu_s_per_min"]
            x["bpf_s_per_min"] = d.get("bpf_s_per_min")
            x["rss_mib"] = d["rss_mib"]
            x["unexpected_events"] = d.get("unexpected")
            x["threads"] = d.get("threads")
            x["cri_calls_by_method"] = d.get("cri_calls_by_method")
        x["daemon_plus_runtime_s_per_min"] = (x.get("daemon_cpu_s_per_min") or 0) + (x.get("bpf_s_per_min") or 0) + \
            x["runtime_total_s_per_min"]
        res["runs"][which] = x
    base = res["runs"]["none"]["runtime_total_s_per_min"]
    for k in ("ebpf", "relist", "ebpf-unwatched"):
        res["runs"][k]["above_baseline_s_per_min"] = res["runs"][k]["daemon_plus_runtime_s_per_min"] - base
    e, r = res["runs"]["ebpf"], res["runs"]["relist"]
    div = lambda a, b: a / b if b and b > 0 else None
    res["ratio_total"] = div(r["daemon_plus_runtime_s_per_min"], e["daemon_plus_runtime_s_per_min"])
    res["ratio_above_baseline"] = div(r["above_baseline_s_per_min"], max(e["above_baseline_s_per_min"], 1e-9)) \
        if e["above_baseline_s_per_min"] > 0 else None
    res["ebpf_above_baseline_within_noise"] = e["above_baseline_s_per_min"] <= 0
    res["ratio_daemon"] = div((r.get("daemon_cpu_s_per_min") or 0),
                              (e.get("daemon_cpu_s_per_min") or 0) + (e.get("bpf_s_per_min") or 0))
    b = res["runs"]["ebpf-unwatched"]
    res["ratio_daemon_unwatched"] = div((r.get("daemon_cpu_s_per_min") or 0),
                                   (b.get("daemon_cpu_s_per_min") or 0) + (b.get("bpf_s_per_min") or 0))


def slow_runtime(cfg, runtime, cgroups, pods, out_dir):
    if not cfg.proxy or not os.access(cfg.proxy, os.X_OK):
        return {"skipped": "kpleg-cri-proxy is not built (bench --bin-dir has no kpleg-cri-proxy)"}
    if len(pods.pods) < 2:
        return {"skipped": "needs at least 2 pods"}
    victim = pods.pods[0]
    proxy_sock = os.path.join(cfg.sock_dir, "proxy.sock")
    res = {"victim_pod_uid": victim["pod_uid"], "n": len(pods.pods), "rate": cfg.slow_rate,
           "window_s": cfg.slow_window}
    # Baseline: both daemons through the proxy, nothing stalled, the same churn.
    for phase in ("baseline", "stalled"):
        args = [cfg.proxy, "--listen", f"unix://{proxy_sock}", "--upstream", cfg.endpoint]
        if phase == "stalled":
            args += ["--stall-pod", victim["pod_uid"], "--stall-hang"]
        perr = open(os.path.join(out_dir, f"proxy-{phase}.log"), "a")
        proxy = subprocess.Popen(args, stdout=perr, stderr=perr)
        try:
            deadline = time.monotonic() + 10
            while not os.path.exists(proxy_sock) and time.monotonic() < deadline:
                if proxy.poll() is not None:
                    return {"skipped": f"kpleg-cri-proxy exited with {proxy.returncode}: see {perr.name}"}
                time.sleep(0.05)  # polling with a deadline
            log(f"slow runtime: {phase}: daemons through the proxy, churn {cfg.slow_rate}/s for {cfg.slow_window} s")
            ds = start_pair(cfg, MODES, f"unix://{proxy_sock}", cgroups, out_dir, f"slow-{phase}")
            try:
                if phase == "stalled":
                    # The stalled pod must change for the relist to inspect it (the generic PLEG
                    # inspects changed pods only): its container dies, behind the proxy's back.
                    run_json_lines(load_cmd(cfg, "stop-container", victim["containers"][0]["container_id"]),
                                   timeout=60)
                w = window(cfg, ds, runtime, cfg.slow_rate, cfg.slow_window, out_dir, f"slow-{phase}", set())
            finally:
                for d in ds:
                    d.stop()
            w["scenario"] = f"slow-{phase}"
            w["n"] = len(pods.pods)
            res[phase] = w
        finally:
            proxy.send_signal(signal.SIGTERM)
            try:
                proxy.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proxy.kill()
                proxy.wait()
            perr.close()
            try:
                os.unlink(proxy_sock)
            except OSError:
                pass
    # The victim's container is dead now: replace the pod so N stays what it says.
    pods.remove(victim)
    pods.grow_to(res["n"])
    return res


def rewrite(results_json):
    """Regenerates the derived files (CSV, .dat, summary.md) of a finished run from its results.json
    and raw/ event logs (the samples are re-evaluated, so a change to the evaluation applies)."""
    out = os.path.dirname(os.path.abspath(results_json))
    with open(results_json) as f:
        results = json.load(f)
    raw = os.path.join(out, "raw")

    def load_events(path):
        ev = []
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    try:
                        o = json.loads(line)
                    except ValueError:
                        continue
                    if o.get("kind", "event") == "event":
                        ev.append(o)
        return ev

    def re_eval(c, tag):
        churn_path = os.path.join(raw, f"churn-{c['label']}.jsonl")
        if c["rate"] == 0 or not os.path.exists(churn_path):
            return
        with open(churn_path) as f:
            lines = [json.loads(l) for l in f if l.strip()]
        if "t_begin_ns" in c:
            t0, t1 = c["t_begin_ns"], c["t_end_ns"]
        else:  # runs from before the window bounds were recorded: around the churn's own calls
            t0 = min(l["t_begin_ns"] for l in lines if "t_begin_ns" in l) - int(2e9)
            t1 = max(l["t_end_ns"] for l in lines if "t_end_ns" in l) + int(10e9)
        churn = {"lines": lines}
        events = {}
        for mode in c["daemons"]:
            ev = load_events(os.path.join(raw, f"events-{mode}-{tag}.jsonl"))
            events[mode] = [e for e in ev if t0 <= e["recv_ts_ns"] <= t1]
        for mode, r in evaluate(events, churn, set()).items():
            if "t_begin_ns" not in c:
                r.pop("unexpected", None)  # approximate bounds: keep the count the run measured
            c["daemons"][mode].update(r)

    for c in results["cells"]:
        re_eval(c, f"n{c['n']}")
    sr = results.get("slow_runtime") or {}
    for phase in ("baseline", "stalled"):
        if sr.get(phase):
            re_eval(sr[phase], f"slow-{phase}")

    class Cfg:
        pass
    cfg = Cfg()
    cfg.out_dir = out
    write_outputs(cfg, results, write_json=False)  # results.json stays the run's own record
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
    ap.add_argument("--counts", default="0,10,50,110,250,500")
    ap.add_argument("--rates", default="0,1,10")
    ap.add_argument("--window", type=float, default=60)
    ap.add_argument("--idle-window", type=float, default=None,
                    help="window of the idle cells (rate 0) and of the each-mode-alone runs (default: --window)")
    ap.add_argument("--settle", type=float, default=8, dest="settle_s")
    ap.add_argument("--warmup", type=float, default=5, dest="warmup_s",
                    help="seconds of churn before each daemon pair's first churn window, not measured (0: none)")
    ap.add_argument("--warmup-rate", type=float, default=10)
    ap.add_argument("--alone-at", type=int, default=110, help="N of the each-mode-alone idle runs (0: none)")
    ap.add_argument("--idle-exited", type=int, default=5,
                    help="pods whose container has exited and stays, beside the N during the idle runs")
    ap.add_argument("--slow-at", type=int, default=10, help="N of the slow-runtime scenario (0: none)")
    ap.add_argument("--slow-rate", type=float, default=2)
    ap.add_argument("--slow-window", type=float, default=30)
    ap.add_argument("--unwatched-window", type=float, default=30, help="window of the ebpf-unwatched idle diagnostic")
    ap.add_argument("--relist-period", default="1s")
    ap.add_argument("--pod-mib", type=float, default=20, help="memory per pod to plan with (shim ~15 MiB + pause + container)")
    ap.add_argument("--mem-reserve-gib", type=float, default=4)
    ap.add_argument("--time-budget-min", type=float, default=33, help="stop growing N when the next step would overrun")
    ap.add_argument("--bpf-json", help="kpleg-bench-bpf result to fold into the summary")
    ap.add_argument("--command", default=" ".join(sys.argv))
    ap.add_argument("--consumer", choices=("auto", "watch", "stdout"), default="auto")
    ap.add_argument("--churn-pods", type=int, default=1, help="pods the churn spreads its containers over")
    ap.add_argument("--trace-kernel", action="store_true",
                    help="also record kplegd --trace-kernel for the benchmark's cgroups (diagnostics)")
    cfg = ap.parse_args()
    if cfg.idle_window is None:
        cfg.idle_window = cfg.window
    cfg.kplegd = os.path.join(cfg.bin_dir, "kplegd")
    cfg.kpleg_load = os.path.join(cfg.bin_dir, "kpleg-load")
    cfg.watch = os.path.join(cfg.bin_dir, "kpleg-bench-watch")
    cfg.proxy = os.path.join(cfg.bin_dir, "kpleg-cri-proxy")
    cfg.prefix_proxy = os.path.join(cfg.bin_dir, "kpleg-bench-cri-prefix")
    cfg.load_endpoint = cfg.endpoint
    cfg.pod_bytes = int(cfg.pod_mib * MiB)
    cfg.mem_reserve = int(cfg.mem_reserve_gib * (1 << 30))
    cfg.current_n = 0
    counts = [int(x) for x in cfg.counts.split(",") if x != ""]
    rates = [float(x) if "." in x else int(x) for x in cfg.rates.split(",") if x != ""]
    os.makedirs(cfg.out_dir, exist_ok=True)
    raw = os.path.join(cfg.out_dir, "raw")
    os.makedirs(raw, exist_ok=True)
    cfg.sock_dir = os.path.join("/tmp", f"kpleg-bench-sock-{os.getpid()}")
    os.makedirs(cfg.sock_dir, mode=0o700, exist_ok=True)
    if cfg.consumer == "auto":
        cfg.consumer = "watch" if kplegd_has_socket(cfg.kplegd) and os.access(cfg.watch, os.X_OK) else "stdout"
    consumer_note = ("kpleg.v1 Watch stream over kplegd's unix socket (kpleg-bench-watch stamps arrival)"
                     if cfg.consumer == "watch" else
                     "kplegd --print-events json on stdout, stamped on arrival by the driver "
                     "(kplegd had no --socket when this ran)")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    t_start = time.monotonic()
    results = {"meta": {"started": datetime.datetime.now().isoformat(timespec="seconds"),
                        "command": cfg.command, "consumer": cfg.consumer, "consumer_note": consumer_note,
                        "machine": machine_info(cfg),
                        "config": {k: v for k, v in vars(cfg).items() if isinstance(v, (int, float, str))}},
               "cells": []}
    cg_root = cfg.cgroup_root
    cgroups = {m: Cgroup(os.path.join(cg_root, m)) for m in MODES}
    rt_cg = Cgroup(os.path.join(cg_root, "runtime"))
    # containerd goes into its own cgroup before any pod exists: every shim it starts follows.
    rt_cg.add(cfg.containerd_pid)
    runtime = Runtime(cfg, rt_cg)
    pods = Pods(cfg)
    with open("/proc/sys/kernel/bpf_stats_enabled") as f:
        stats_before = f.read().strip()
    rc = 0
    prefix_proxy = tracer = None
    try:
        prefix_proxy = start_prefix_proxy(cfg, raw)
        if cfg.trace_kernel:
            trace_out = open(os.path.join(raw, "kernel-trace.jsonl"), "w")
            tracer = subprocess.Popen([cfg.kplegd, "--trace-kernel", "--cgroup-root", cfg.cgroup_prefix_name,
                                       "--log-level", "warn"], stdout=trace_out, stderr=subprocess.DEVNULL)
        with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
            f.write("1")
        for n in counts:
            step_start = time.monotonic()
            reason = pods.grow_to(n)
            cfg.current_n = len(pods.pods)
            if reason:
                results["stopped_reason"] = f"wanted N={n}: {reason}"
                log(results["stopped_reason"])
                if len(pods.pods) < n:
                    break
            log(f"N={n}: {len(pods.pods)} pods running; both daemons")
            ds = start_pair(cfg, MODES, cfg.endpoint, cgroups, raw, f"n{n}")
            base_uids = {p["pod_uid"] for p in pods.pods}
            try:
                warmed = False
                for rate in rates:
                    if rate > 0 and not warmed and cfg.warmup_s > 0:
                        results.setdefault("warmup", []).append(warm_up(cfg, ds, raw, f"n{n}"))
                        warmed = True
                    secs = cfg.window if rate else cfg.idle_window
                    log(f"N={n} rate={rate}/s: {secs:.0f} s window")
                    w = window(cfg, ds, runtime, rate, secs, raw, f"n{n}-r{rate}", base_uids)
                    w["n"] = n
                    w["scenario"] = "shared"
                    results["cells"].append(w)
                    e = w["daemons"].get("ebpf", {})
                    log(f"  ebpf: cpu {fmt(e.get('cpu_s_per_min'), 3)} s/min missed {e.get('missed')} dup "
                        f"{e.get('duplicated')} p99 {fmt((e.get('latency_ms', {}).get('started_died_from_kernel') or {}).get('p99'), 1)} ms; "
                        f"relist: cpu {fmt(w['daemons'].get('relist', {}).get('cpu_s_per_min'), 3)} s/min")
                    write_outputs(cfg, results)
            finally:
                for d in ds:
                    d.stop()
            if cfg.alone_at and n == cfg.alone_at:
                results["alone"] = alone_runs(cfg, runtime, cgroups, raw, n)
                write_outputs(cfg, results)
            if cfg.slow_at and n == cfg.slow_at:
                results["slow_runtime"] = slow_runtime(cfg, runtime, cgroups, pods, raw)
                write_outputs(cfg, results)
            # Will the next N fit the time budget? A step costs its windows plus pod creation.
            step = time.monotonic() - step_start
            idx = counts.index(n)
            if idx + 1 < len(counts):
                nxt = counts[idx + 1]
                per_pod = 0.35
                est = step + (nxt - n) * per_pod + max(0, nxt - n) * 0.05
                used = (time.monotonic() - t_start) / 60
                if used + est / 60 > cfg.time_budget_min:
                    results["stopped_reason"] = (f"stopped before N={nxt}: {used:.1f} min used, the next step "
                                                 f"(~{est / 60:.1f} min) would overrun the {cfg.time_budget_min:.0f} min budget")
                    log(results["stopped_reason"])
                    break
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
        write_outputs(cfg, results)
        if tracer is not None:
            tracer.send_signal(signal.SIGINT)
            tracer.wait(timeout=15)
        # The pods stay for the test bed's down, which needs no forwarder.
        if prefix_proxy is not None:
            prefix_proxy.send_signal(signal.SIGTERM)
            try:
                prefix_proxy.wait(timeout=10)
            except subprocess.TimeoutExpired:
                prefix_proxy.kill()
        shutil.rmtree(cfg.sock_dir, ignore_errors=True)
        # containerd (and the shims) leave with the test bed's down; the cgroups then go.
        for c in cgroups.values():
            c.remove()
    return rc


if __name__ == "__main__":
    sys.exit(main())
