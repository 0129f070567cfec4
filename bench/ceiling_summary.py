"""The capacity ceiling's section of a benchmark summary, from kpleg-bench-ceiling's results in
the run's directory (ceiling.json; callgrind-<n>.log from the runs under callgrind)."""
import json
import os
import re
import sys


def load(out, name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def instructions(out, n):
    try:
        with open(os.path.join(out, f"callgrind-{n}.log")) as f:
            m = re.search(r"Collected : ([0-9]+)", f.read())
    except OSError:
        return None
    return int(m.group(1)) if m else None


def main():
    out = sys.argv[1]
    c = load(out, "ceiling.json")
    lines = ["", "## Capacity ceiling (kpleg-bench-ceiling)", "",
             "The tracker alone (cgroup index, confirmations, removal sweep, publishing) against an "
             "in-process runtime that answers at once, fed lifecycles in waves of 200 containers; the "
             "process CPU includes that runtime and the feeding thread. No gRPC, no containerd, no "
             "kernel: what kplegd's own logic costs.", ""]
    if c:
        lines += ["| lifecycles | transitions/s | CPU µs/transition | CRI calls/lifecycle | missed | dup |",
                  "|---|---|---|---|---|---|",
                  f"| {c['lifecycles']} | {c['transitions_per_s']:.0f} | {c['cpu_us_per_transition']:.1f} | "
                  f"{c['cri_calls_per_lifecycle']:.2f} | {c['missed']} | {c['duplicates']} |"]
    else:
        lines.append("(no result: see ceiling.json)")
    i200, i400 = instructions(out, 200), instructions(out, 400)
    if i200 and i400:
        lines += ["", "Instructions per lifecycle under callgrind, (400 − 200 lifecycles) / 200, waves of 50, one removal sweep per wave: "
                  f"{(i400 - i200) / 200:.0f}."]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
