#!/usr/bin/env python3
"""The DaemonSet's pod, translated into the CRI requests a kubelet would send for it.

    cri_from_manifest.py MANIFEST OUTDIR [options]

Writes, for the DaemonSet's pod template:
  OUTDIR/sandbox.json        PodSandboxConfig (crictl runp)
  OUTDIR/<container>.json    ContainerConfig of each container (crictl create)
  OUTDIR/pod.json            what the caller acts on as the kubelet would: the probes (URLs or
                             exec commands),
                             the hostPath volumes with their types, the image reference

It follows the kubelet (1.3x, cgroupfs driver) field by field: pod and container security
contexts (capabilities, privileged, runAsUser/Group, runAsNonRoot, readOnlyRootFilesystem,
allowPrivilegeEscalation as no_new_privs, seccomp), the default masked and read-only /proc and
/sys paths of a non-privileged container, host namespaces, hostPath volumes as bind mounts with
their propagation, command/args/env, requests and limits as cgroup settings, the pod's QoS cgroup
parent, the labels the kubelet puts on sandboxes and containers. A field it does not know is an
error, so a manifest change cannot be silently left out of the test.

Options change only what is node-specific, each by name:
  --host-path OLD NEW    the hostPath volume at OLD is NEW on this node (repeatable)
  --override-arg=--FLAG=VALUE
                         the container argument --FLAG=... becomes this one (repeatable)
  --port-replace OLD NEW a container port number, and every probe that targets it (repeatable)
  --node-ip IP           the node address probes without a host go to (hostNetwork pods)
  --pod-uid UID, --node-name NAME, --log-dir DIR, --image REF
  --rro-supported        the runtime supports recursive read-only mounts (RuntimeStatus
                         features): recursiveReadOnly IfPossible becomes one, as with the kubelet
  --self-test-container  also write <container>-selftest.json: the same container running
                         `<entrypoint> --self-test`, with the cgroup volume writable (the
                         self-test creates a scratch cgroup; the daemon only reads the tree)
"""
import argparse
import json
import os
import re
import sys

import yaml

# The kubelet's defaults for a non-privileged container (k8s.io/kubernetes
# pkg/securitycontext/util.go), sent explicitly: containerd masks nothing the request leaves out.
DEFAULT_MASKED_PATHS = [
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
    "/sys/devices/virtual/powercap",
]
DEFAULT_READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]

NODE = 2  # runtime.v1.NamespaceMode
POD = 0
CONTAINER = 1
PROPAGATION = {None: 0, "None": 0, "HostToContainer": 1, "Bidirectional": 2}
SECCOMP = {"RuntimeDefault": 0, "Unconfined": 1, "Localhost": 2}  # runtime.v1.SecurityProfile.ProfileType

# Known fields; those not read below (scheduling, image pulls, DNS of pod-network pods, the stop
# timeout) do not change the CRI requests that start the pod.
POD_KEYS = {"hostPID", "hostNetwork", "hostIPC", "priorityClassName", "tolerations", "containers",
            "volumes", "securityContext", "automountServiceAccountToken", "enableServiceLinks",
            "dnsPolicy", "terminationGracePeriodSeconds", "nodeSelector", "serviceAccountName"}
CONTAINER_KEYS = {"name", "image", "imagePullPolicy", "command", "args", "env", "securityContext",
                  "ports", "livenessProbe", "readinessProbe", "startupProbe", "resources",
                  "volumeMounts", "workingDir", "terminationMessagePolicy"}
CONTAINER_SC_KEYS = {"privileged", "capabilities", "runAsUser", "runAsGroup", "runAsNonRoot",
                     "readOnlyRootFilesystem", "allowPrivilegeEscalation", "seccompProfile",
                     "procMount"}
POD_SC_KEYS = {"runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile", "supplementalGroups"}
PROBE_KEYS = {"httpGet", "exec", "periodSeconds", "failureThreshold", "timeoutSeconds",
              "initialDelaySeconds", "successThreshold"}


def die(msg):
    sys.exit("cri_from_manifest: " + msg)


def only_known(what, d, known):
    unknown = sorted(set(d) - known)
    if unknown:
        die("%s has %s, which this translation does not know: teach tests/deploy/cri_from_manifest.py"
            % (what, ", ".join(unknown)))


def quantity(q, unit):
    """A Kubernetes quantity in bytes (unit "bytes") or millicores (unit "milli")."""
    q = str(q)
    suffixes = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6,
                "G": 10**9, "T": 10**12}
    if unit == "milli":
        if q.endswith("m"):
            return int(q[:-1])
        return int(float(q) * 1000)
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", q)
    if not m or (m.group(2) and m.group(2) not in suffixes):
        die("cannot read the quantity %r" % q)
    return int(float(m.group(1)) * suffixes.get(m.group(2), 1))



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest")
    ap.add_argument("outdir")
    ap.add_argument("--host-path", nargs=2, action="append", default=[], metavar=("OLD", "NEW"))
    ap.add_argument("--override-arg", action="append", default=[], metavar="--FLAG=VALUE")
    ap.add_argument("--port-replace", nargs=2, action="append", default=[], type=int,
                    metavar=("OLD", "NEW"))
    ap.add_argument("--node-ip", default="127.0.0.1")
    ap.add_argument("--pod-uid", default="00000000-0000-4000-8000-00000000d5e7")
    ap.add_argument("--node-name", default=os.uname().nodename)
    ap.add_argument("--log-dir", default="/var/log/pods")
    ap.add_argument("--image")
    ap.add_argument("--self-test-container", action="store_true")
    ap.add_argument("--rro-supported", action="store_true",
                    help="the runtime handler supports recursive read-only mounts")
    a = ap.parse_args()
    host_paths = dict(a.host_path)
    overrides = {}
    for o in a.override_arg:
        if not o.startswith("--") or "=" not in o:
            die("--override-arg wants --flag=value, got %r" % o)
        overrides[o.split("=", 1)[0]] = o
    port_replace = dict(a.port_replace)

    docs = [d for d in yaml.safe_load_all(open(a.manifest)) if d]
    ds = [d for d in docs if d.get("kind") == "DaemonSet"]
    if len(ds) != 1:
        die("expected one DaemonSet in %s, found %d" % (a.manifest, len(ds)))
    ds = ds[0]
    tmpl = ds["spec"]["template"]
    pod = tmpl["spec"]
    only_known("the pod spec", pod, POD_KEYS)
    pod_sc = pod.get("securityContext", {}) or {}
    only_known("the pod securityContext", pod_sc, POD_SC_KEYS)
    if pod.get("automountServiceAccountToken", True) is not False:
        die("the kubelet would mount a service account token, which this translation does not: "
            "set automountServiceAccountToken: false or teach it")
    namespace = ds["metadata"].get("namespace", "default")
    pod_name = "%s-%s" % (ds["metadata"]["name"], a.node_name.split(".")[0].lower())
    uid = a.pod_uid

    ns_opts = {"network": NODE if pod.get("hostNetwork") else POD,
               "pid": NODE if pod.get("hostPID") else CONTAINER,
               "ipc": NODE if pod.get("hostIPC") else POD}

    def seccomp_of(sc):
        p = (sc or {}).get("seccompProfile")
        if p is None:
            return None
        if p["type"] not in SECCOMP:
            die("seccompProfile type %r" % p["type"])
        out = {"profile_type": SECCOMP[p["type"]]}
        if p["type"] == "Localhost":
            out["localhost_ref"] = p["localhostProfile"]
        return out

    # QoS class and the pod's cgroup (cgroupfs driver), as the kubelet computes them.
    containers = pod["containers"]
    guaranteed = True
    best_effort = True
    for c in containers:
        r = c.get("resources", {}) or {}
        req, lim = r.get("requests", {}) or {}, r.get("limits", {}) or {}
        if req or lim:
            best_effort = False
        for res in ("cpu", "memory"):
            if res not in lim or (res in req and quantity(req[res], "milli" if res == "cpu" else "bytes")
                                  != quantity(lim[res], "milli" if res == "cpu" else "bytes")):
                guaranteed = False
    qos = "guaranteed" if guaranteed else "besteffort" if best_effort else "burstable"
    cgroup_parent = "/kubepods/pod" + uid if qos == "guaranteed" else "/kubepods/%s/pod%s" % (qos, uid)
    critical = pod.get("priorityClassName") in ("system-node-critical", "system-cluster-critical")

    pod_labels = dict(tmpl["metadata"].get("labels", {}))
    kube_labels = {"io.kubernetes.pod.name": pod_name, "io.kubernetes.pod.namespace": namespace,
                   "io.kubernetes.pod.uid": uid}

    volumes = {}
    for v in pod.get("volumes", []):
        if set(v) != {"name", "hostPath"}:
            die("volume %s is not a hostPath volume; only hostPath volumes are translated" % v["name"])
        hp = v["hostPath"]
        path = hp["path"]
        volumes[v["name"]] = {"name": v["name"], "manifest_path": path,
                              "host_path": host_paths.get(path, path), "type": hp.get("type", "")}
    unused = set(host_paths) - {v["manifest_path"] for v in volumes.values()}
    if unused:
        die("--host-path %s: no hostPath volume has that path" % ", ".join(sorted(unused)))

    sandbox_sc = {"namespace_options": ns_opts,
                  "privileged": any((c.get("securityContext") or {}).get("privileged", False)
                                    for c in containers)}
    if "runAsUser" in pod_sc:
        sandbox_sc["run_as_user"] = {"value": pod_sc["runAsUser"]}
    if "runAsGroup" in pod_sc:
        sandbox_sc["run_as_group"] = {"value": pod_sc["runAsGroup"]}
    if pod_sc.get("supplementalGroups"):
        sandbox_sc["supplemental_groups"] = pod_sc["supplementalGroups"]
    if seccomp_of(pod_sc):
        sandbox_sc["seccomp"] = seccomp_of(pod_sc)
    sandbox = {
        "metadata": {"name": pod_name, "namespace": namespace, "uid": uid, "attempt": 0},
        "log_directory": os.path.join(a.log_dir, "%s_%s_%s" % (namespace, pod_name, uid)),
        "labels": {**pod_labels, **kube_labels},
        "annotations": dict(tmpl["metadata"].get("annotations", {})),
        "linux": {"cgroup_parent": cgroup_parent, "security_context": sandbox_sc},
    }
    if not pod.get("hostNetwork"):
        sandbox["hostname"] = pod_name

    os.makedirs(a.outdir, exist_ok=True)
    with open(os.path.join(a.outdir, "sandbox.json"), "w") as f:
        json.dump(sandbox, f, indent=1)

    facts = {"pod_name": pod_name, "namespace": namespace, "uid": uid, "qos": qos,
             "log_directory": sandbox["log_directory"], "containers": [],
             "volumes": sorted(volumes.values(), key=lambda v: v["name"]),
             "automount_service_account_token": pod.get("automountServiceAccountToken", True),
             "host_network": bool(pod.get("hostNetwork")), "host_pid": bool(pod.get("hostPID"))}

    for c in containers:
        only_known("container %s" % c["name"], c, CONTAINER_KEYS)
        sc = c.get("securityContext", {}) or {}
        only_known("the securityContext of container %s" % c["name"], sc, CONTAINER_SC_KEYS)
        image = a.image or c["image"]
        ports = {}
        for p in c.get("ports", []):
            num = port_replace.get(p["containerPort"], p["containerPort"])
            ports[p.get("name", str(p["containerPort"]))] = num
        args = [overrides.get(x.split("=", 1)[0], x) for x in c.get("args", [])]
        unused = set(overrides) - {x.split("=", 1)[0] for x in c.get("args", [])}
        if unused:
            die("--override-arg %s: container %s has no such flag=value argument"
                % (", ".join(sorted(unused)), c["name"]))
        envs = []
        for e in c.get("env", []):
            if "value" not in e:
                die("env %s of container %s has no plain value; only values are translated" % (e["name"], c["name"]))
            envs.append({"key": e["name"], "value": str(e["value"])})

        privileged = sc.get("privileged", False)
        csc = {"namespace_options": ns_opts, "privileged": privileged}
        caps = sc.get("capabilities") or {}
        if caps:
            csc["capabilities"] = {"add_capabilities": caps.get("add", []),
                                   "drop_capabilities": caps.get("drop", [])}
        run_as_user = sc.get("runAsUser", pod_sc.get("runAsUser"))
        run_as_group = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
        if run_as_user is not None:
            csc["run_as_user"] = {"value": run_as_user}
        if run_as_group is not None:
            csc["run_as_group"] = {"value": run_as_group}
        if pod_sc.get("supplementalGroups"):
            csc["supplemental_groups"] = pod_sc["supplementalGroups"]
        run_as_non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot", False))
        if run_as_non_root and run_as_user is None:
            die("container %s: runAsNonRoot without a numeric runAsUser (the kubelet would check "
                "the image's user, which this translation does not)" % c["name"])
        if run_as_non_root and run_as_user == 0:
            die("container %s: runAsNonRoot with runAsUser 0: the kubelet refuses to start it" % c["name"])
        csc["readonly_rootfs"] = bool(sc.get("readOnlyRootFilesystem", False))
        # The kubelet: no_new_privs unless allowPrivilegeEscalation is true or unset.
        csc["no_new_privs"] = sc.get("allowPrivilegeEscalation", True) is False
        if privileged and csc["no_new_privs"]:
            die("container %s: privileged with allowPrivilegeEscalation false is rejected by the API server" % c["name"])
        seccomp = seccomp_of(sc) or seccomp_of(pod_sc)
        if seccomp:
            csc["seccomp"] = seccomp
        if not privileged and sc.get("procMount", "Default") == "Default":
            csc["masked_paths"] = DEFAULT_MASKED_PATHS
            csc["readonly_paths"] = DEFAULT_READONLY_PATHS

        mounts = []
        for m in c.get("volumeMounts", []):
            only_known("volumeMount %s" % m["name"], m,
                       {"name", "mountPath", "readOnly", "mountPropagation", "recursiveReadOnly"})
            v = volumes.get(m["name"])
            if v is None:
                die("container %s mounts volume %s, which the pod does not have" % (c["name"], m["name"]))
            if m.get("mountPropagation") not in PROPAGATION:
                die("mountPropagation %r" % m.get("mountPropagation"))
            if m.get("mountPropagation") == "Bidirectional" and not privileged:
                die("Bidirectional propagation needs a privileged container")
            # The kubelet: recursiveReadOnly needs readOnly and no propagation; IfPossible asks for
            # it where the runtime handler says it can (RuntimeStatus features), Enabled or fail.
            rro = m.get("recursiveReadOnly", "Disabled")
            if rro not in ("Disabled", "IfPossible", "Enabled"):
                die("recursiveReadOnly %r" % rro)
            if rro != "Disabled" and (not m.get("readOnly") or m.get("mountPropagation") not in (None, "None")):
                die("volumeMount %s: recursiveReadOnly needs readOnly and no propagation" % m["name"])
            if rro == "Enabled" and not a.rro_supported:
                die("volumeMount %s: recursiveReadOnly Enabled, but the runtime does not support it "
                    "(the kubelet would fail the pod)" % m["name"])
            mount = {"container_path": m["mountPath"], "host_path": v["host_path"],
                     "readonly": bool(m.get("readOnly", False)),
                     "propagation": PROPAGATION[m.get("mountPropagation")]}
            if rro != "Disabled" and a.rro_supported:
                mount["recursive_read_only"] = True
            mounts.append(mount)

        resources = {}
        r = c.get("resources", {}) or {}
        req, lim = r.get("requests", {}) or {}, r.get("limits", {}) or {}
        cpu_req = quantity(req.get("cpu", lim.get("cpu", 0)), "milli")
        resources["cpu_shares"] = max(2, cpu_req * 1024 // 1000) if cpu_req else 2
        if "cpu" in lim:
            resources["cpu_period"] = 100000
            resources["cpu_quota"] = max(1000, quantity(lim["cpu"], "milli") * 100000 // 1000)
        if "memory" in lim:
            resources["memory_limit_in_bytes"] = quantity(lim["memory"], "bytes")
        # The kubelet's OOM score: critical pods as guaranteed ones; the rest by QoS.
        resources["oom_score_adj"] = -997 if critical or qos == "guaranteed" else (1000 if qos == "besteffort" else 999)

        labels = {"io.kubernetes.container.name": c["name"], **kube_labels}
        config = {
            "metadata": {"name": c["name"], "attempt": 0},
            "image": {"image": image},
            "args": args,
            "envs": envs,
            "mounts": mounts,
            "labels": labels,
            "annotations": {},
            "log_path": "%s/0.log" % c["name"],
            "linux": {"resources": resources, "security_context": csc},
        }
        if c.get("command"):
            config["command"] = c["command"]
        if c.get("workingDir"):
            config["working_dir"] = c["workingDir"]
        with open(os.path.join(a.outdir, c["name"] + ".json"), "w") as f:
            json.dump(config, f, indent=1)

        probes = []
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            p = c.get(kind)
            if not p:
                continue
            only_known("%s of %s" % (kind, c["name"]), p, PROBE_KEYS)
            common = {"kind": kind, "period_seconds": p.get("periodSeconds", 10),
                      "failure_threshold": p.get("failureThreshold", 3),
                      "timeout_seconds": p.get("timeoutSeconds", 1)}
            if "exec" in p:
                # Run in the container as the kubelet runs it (ExecSync).
                probes.append({**common, "exec": list(p["exec"]["command"])})
                continue
            g = p.get("httpGet")
            if g is None:
                die("%s of %s is neither an httpGet nor an exec probe" % (kind, c["name"]))
            port = g["port"]
            port = ports[port] if isinstance(port, str) else port_replace.get(port, port)
            # The kubelet probes the pod's IP when no host is given: the node's for hostNetwork.
            host = g.get("host") or (a.node_ip if pod.get("hostNetwork") else None)
            if host is None:
                die("%s of %s: a pod-network pod's IP is not known to this translation" % (kind, c["name"]))
            probes.append({**common, "url": "%s://%s:%d%s" % (g.get("scheme", "HTTP").lower(),
                                                              host, port, g.get("path", "/"))})
        facts["containers"].append({"name": c["name"], "image": image, "probes": probes,
                                    "config": c["name"] + ".json", "ports": ports,
                                    "mounts": mounts, "capabilities": caps,
                                    "no_new_privs": csc["no_new_privs"],
                                    "readonly_rootfs": csc["readonly_rootfs"],
                                    "seccomp": ({v: k for k, v in SECCOMP.items()}[seccomp["profile_type"]]
                                                if seccomp else "unset")})

        if a.self_test_container:
            entry = c.get("command") or ["/usr/local/bin/kplegd"]
            st = json.loads(json.dumps(config))
            st["metadata"]["name"] = c["name"] + "-selftest"
            st["command"] = [entry[0]]
            st["args"] = ["--self-test"]
            st["labels"]["io.kubernetes.container.name"] = c["name"] + "-selftest"
            st["log_path"] = "%s-selftest/0.log" % c["name"]
            for m in st["mounts"]:
                if m["container_path"] == "/sys/fs/cgroup":
                    m["readonly"] = False
                    m.pop("recursive_read_only", None)
            with open(os.path.join(a.outdir, c["name"] + "-selftest.json"), "w") as f:
                json.dump(st, f, indent=1)

    with open(os.path.join(a.outdir, "pod.json"), "w") as f:
        json.dump(facts, f, indent=1)


if __name__ == "__main__":
    main()
