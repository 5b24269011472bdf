#!/usr/bin/env python3
"""Policy check of libshare's Kubernetes manifests: no container asks for more than it needs.

Fails (one line per finding, exit 1) on: a privileged container; privilege escalation not
turned off; capabilities not all dropped, or added beyond ALLOWED_CAPS; a hostPath outside
ALLOWED_HOST_PATHS; hostNetwork or hostIPC; a service account token mounted, except for the DRA
plugin's account (DRA_ACCOUNT); an RBAC rule beyond DRA_RULES or granted to anyone but that
account (the daemon and the device plugin never call the API; the DRA plugin reads
ResourceClaims and writes its node's ResourceSlices). hostPID is allowed for the DaemonSet only
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
    "/var/lib/kubelet/plugins_registry",
    "/var/lib/kubelet/plugins/gpu.libshare.dev",
}
DRA_ACCOUNT = "libshare-dra"
# (API group, resource, verb) the DRA plugin may use.
DRA_RULES = {
    ("resource.k8s.io", "resourceclaims", "get"),
    ("resource.k8s.io", "resourceslices", "get"),
    ("resource.k8s.io", "resourceslices", "create"),
    ("resource.k8s.io", "resourceslices", "update"),
}


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
    if kind in ("Role", "ClusterRole"):
        for r in doc.get("rules") or []:
            for g in r.get("apiGroups") or [""]:
                for res in r.get("resources") or []:
                    for v in r.get("verbs") or []:
                        if (g, res, v) not in DRA_RULES:
                            bad.append(f"{where}: {kind} grants {v} on {g}/{res}: more than the DRA plugin needs")
    if kind in ("RoleBinding", "ClusterRoleBinding"):
        for s in doc.get("subjects") or []:
            if (s.get("kind"), s.get("name")) != ("ServiceAccount", DRA_ACCOUNT):
                bad.append(f"{where}: binds {s.get('kind')} {s.get('name')}: only {DRA_ACCOUNT} may call the API")
    spec = pod_spec(doc)
    if spec is None:
        return bad
    if spec.get("hostNetwork") or spec.get("hostIPC"):
        bad.append(f"{where}: hostNetwork/hostIPC is not needed")
    if spec.get("hostPID") and kind != "DaemonSet":
        bad.append(f"{where}: hostPID outside the node DaemonSet")
    dra = spec.get("serviceAccountName") == DRA_ACCOUNT
    if kind == "DaemonSet" and not dra and spec.get("automountServiceAccountToken") is not False:
        bad.append(f"{where}: the service account token must not be mounted")
    if dra and [c.get("name") for c in spec.get("containers") or []] != ["dra-plugin"]:
        bad.append(f"{where}: the {DRA_ACCOUNT} account (and its token) is for the dra-plugin container alone")
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
