"""The parts a window runs: one kplegd in its own cgroup with its Watch consumer, the runtime's
cgroup, the steady pods, and the open-loop churn (kpleg-load churn --open-loop)."""

import glob
import json
import os
import signal
import subprocess
import threading
import time

from .measure import MiB, log, mem_available_bytes, now_ns, threads_cpu_s


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


def remove_gone_pod_cgroups(cfg):
    """What the kubelet does once a pod is gone: its pod-level cgroup removed, in every hierarchy.
    containerd and runc remove only the container cgroups they made below it, so without a kubelet
    the pod cgroups of the churn's and the burst's pods would pile up under the benchmark's prefix
    (hundreds an hour: each one more in kplegd's start-up walk and in its tracked map). A live
    pod's cgroup has its containers' below it: rmdir refuses it."""
    with open("/proc/self/mounts") as f:
        mounts = [line.split()[1] for line in f if line.split()[2] in ("cgroup", "cgroup2")]
    for mnt in mounts:
        base = os.path.join(mnt, cfg.cgroup_prefix_name, "kubepods")
        for pod_dir in glob.glob(base + "/pod*") + glob.glob(base + "/*/pod*"):
            try:
                os.rmdir(pod_dir)
            except OSError:
                pass  # still in use, or gone


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
        remove_gone_pod_cgroups(self.cfg)




class Churn:
    """kpleg-load churn --open-loop (or closed loop, cfg.closed_loop) in the background: its ticks start once its pods exist
    (`wait_ticking`), its lines are kept as they come."""

    def __init__(self, cfg, rate, duration, pods, out_path, namespace="kpleg-bench-churn"):
        self.cfg, self.pods, self.duration = cfg, pods, duration
        self.out = open(out_path, "a")
        self.lines, self.stderr = [], ""
        self.pod_lines = threading.Semaphore(0)
        self.t_begin_ns = now_ns()
        loop = [] if getattr(cfg, "closed_loop", False) else ["--open-loop"]
        cmd = load_cmd(cfg, "churn", *loop, "--rate", str(rate), "--duration", str(duration),
                       "--pods", str(pods), "--max-live", str(cfg.max_live), "--namespace", namespace,
                       "--name-prefix", "churn")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.err_reader = threading.Thread(target=self._read_err, daemon=True)
        self.err_reader.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            self.out.write(line)
            self.lines.append(obj)
            if obj.get("op") == "pod":
                self.pod_lines.release()

    def _read_err(self):
        self.stderr = self.proc.stderr.read()

    def wait_ticking(self, timeout=120):
        """Until every pod of the churn exists (its first tick follows at once)."""
        deadline = time.monotonic() + timeout
        for _ in range(self.pods):
            if not self.pod_lines.acquire(timeout=max(0.1, deadline - time.monotonic())):
                return False
        return True

    def finish(self, timeout):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.reader.join(timeout=10)
        self.err_reader.join(timeout=10)
        self.out.close()
        if rc != 0:
            log(f"churn exited {rc}: {self.stderr.strip()[-300:]}")
        remove_gone_pod_cgroups(self.cfg)
        return {"rc": rc, "lines": self.lines, "t_begin_ns": self.t_begin_ns, "t_end_ns": now_ns(),
                "stderr": self.stderr[-500:]}
