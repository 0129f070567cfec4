"""Ground truth and its evaluation: the transitions a churn made (each confirmed by the runtime's
answer to the call that made it, plus its pods' teardown) against a consumer's events."""

import time

from .measure import now_ns, summarize

TYPES = ("ContainerStarted", "ContainerDied", "ContainerRemoved")
CALL_TO_TYPE = {"started": "ContainerStarted", "died": "ContainerDied", "removed": "ContainerRemoved"}


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