#!/usr/bin/env python3
"""Policy check of libshare's Kubernetes manifests: no container asks for more than it needs.

Fails (one line per finding, exit 1) on: a privileged container; privilege escalation not
turned off; capabilities not all dropped, or added beyond ALLOWED_CAPS; a hostPath outside
ALLOWED_HOST_PATHS; hostNetwork or hostIPC; a service account token mounted; any RBAC object
(the plugin and the daemon never call the API). hostPID is allowed for the DaemonSet only
(the daemon reads a caller's cgroup by the host pid the kernel gives it).

usage: policy.py FILE.yaml...
"""
import sys

import yaml

ALLOWED_CAPS = {"SYS_NICE"}
ALLOWED_HOST_PATHS = {
    "/usr/lib/libshare",
    "/run/libshare",
    "/var/lib/libshare",
    "/var/run/cdi",
    "/var/lib/kubelet/device-plugins",
}
RBAC = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}


def pod_spec(doc):
    kind = doc.get("kind")
    if kind == "Pod":
        return doc.get("spec") or {}
    if kind in ("DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job"):
        return ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
    return None


def check(doc, where):
    bad = []
    kind = doc.get("kind")
    if kind in RBAC:
        bad.append(f"{where}: {kind}: libshare needs no access to the Kubernetes API")
    spec = pod_spec(doc)
    if spec is None:
        return bad
    if spec.get("hostNetwork") or spec.get("hostIPC"):
        bad.append(f"{where}: hostNetwork/hostIPC is not needed")
    if spec.get("hostPID") and kind != "DaemonSet":
        bad.append(f"{where}: hostPID outside the node DaemonSet")
    if kind == "DaemonSet" and spec.get("automountServiceAccountToken") is not False:
        bad.append(f"{where}: the service account token must not be mounted")
    for v in spec.get("volumes") or []:
        hp = v.get("hostPath")
        if hp is not None and hp.get("path") not in ALLOWED_HOST_PATHS:
            bad.append(f"{where}: hostPath {hp.get('path')} is not one of {sorted(ALLOWED_HOST_PATHS)}")
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        name = f"{where}: container {c.get('name')}"
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            bad.append(f"{name}: privileged (a capability or a host path will do)")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad.append(f"{name}: capabilities must drop ALL")
        extra = set(caps.get("add") or []) - ALLOWED_CAPS
        if extra:
            bad.append(f"{name}: capabilities {sorted(extra)} are more than it needs")
    return bad


def main(paths):
    bad = []
    for p in paths:
        with open(p) as f:
            for i, doc in enumerate(yaml.safe_load_all(f)):
                if doc:
                    bad += check(doc, f"{p}[{i}]")
    for b in bad:
        print(b)
    if bad:
        return 1
    print(f"policy: {len(paths)} file(s) ok (no privileged container; capabilities dropped, "
          f"only {sorted(ALLOWED_CAPS)} added; host paths {sorted(ALLOWED_HOST_PATHS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
