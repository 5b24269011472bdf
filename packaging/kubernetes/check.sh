#!/usr/bin/env bash
# Checks packaging/kubernetes offline (scripts/test.sh runs it): every manifest (base/, the
# device-plugin examples, dra/ and its examples, resource.k8s.io/v1 included) against the schema
# of a current Kubernetes (kubernetes-validate, pinned, strict: unknown fields fail), then
# policy.py (no container asks for more than it needs, no API access beyond the DRA plugin's);
# then packaging/monitoring: the Prometheus alert rules and the Grafana dashboard's queries with
# promtool, the dashboard's structure and the metric names it uses (monitoring/check.py). Each
# checker must also reject a bad input, so none can pass by checking nothing.
set -euo pipefail
cd "$(dirname "$0")"
KV_VERSION=1.37.0       # the PyPI package; it carries the schemas of Kubernetes up to 1.37
K8S_VERSION=1.37.0      # the Kubernetes version checked against
VENV="${LIBSHARE_CACHE:-$HOME/.cache/libshare}/k8s-venv"
if ! "$VENV/bin/kubernetes-validate" --version 2>/dev/null | grep -q "$KV_VERSION"; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$KV_VERSION"
fi
files=()
while IFS= read -r f; do files+=("$f"); done < <(find . -name '*.yaml' ! -name kustomization.yaml | sort)
"$VENV/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" "${files[@]}"
echo "schema: ${#files[@]} file(s) valid against Kubernetes $K8S_VERSION (strict)"
"$VENV/bin/python" policy.py "${files[@]}"

# Both checkers reject what they must.
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
sed 's/readOnlyRootFilesystem: true/readOnlyRootFilesystem: true\n            privileged: true/' \
  base/daemonset.yaml > "$tmp/privileged.yaml"
sed 's#path: /run/libshare#path: /#' base/daemonset.yaml > "$tmp/root.yaml"
sed 's/hostPID: true/hostPID: true\n      hostPIDs: true/' base/daemonset.yaml > "$tmp/typo.yaml"
sed 's/verbs: \["get", "create", "update"\]/verbs: ["get", "create", "update", "delete", "list"]/' \
  dra/rbac.yaml > "$tmp/rbac.yaml"
for f in privileged root rbac; do
  if "$VENV/bin/python" policy.py "$tmp/$f.yaml" >/dev/null; then
    echo "policy.py accepted $f.yaml" >&2; exit 1
  fi
done
if "$VENV/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" "$tmp/typo.yaml" >/dev/null 2>&1; then
  echo "kubernetes-validate accepted an unknown field" >&2; exit 1
fi
echo "negative checks: a privileged container, a hostPath of /, an RBAC rule too many and an unknown field are refused"

# The monitoring files (promtool is installed by scripts/test.sh).
if ! command -v promtool >/dev/null; then
  echo "promtool is missing: cannot check packaging/monitoring (apt-get install prometheus)" >&2; exit 1
fi
mon=../monitoring
"$VENV/bin/python" "$mon/check.py" "$mon/libshare-dashboard.json" "$mon/libshare-alerts.yaml" \
  ../../libshare-node/src/metrics.rs
sed 's/libshare_memory_used_bytes/libshare_memory_usedd_bytes/' "$mon/libshare-dashboard.json" > "$tmp/dash.json"
sed 's/increase(libshare_memory_refused_total\[5m\])/increase(libshare_memory_refused_total[5m)/' \
  "$mon/libshare-alerts.yaml" > "$tmp/alerts.yaml"
if "$VENV/bin/python" "$mon/check.py" "$tmp/dash.json" "$mon/libshare-alerts.yaml" \
    ../../libshare-node/src/metrics.rs >/dev/null \
  || "$VENV/bin/python" "$mon/check.py" "$mon/libshare-dashboard.json" "$tmp/alerts.yaml" \
    ../../libshare-node/src/metrics.rs >/dev/null; then
  echo "monitoring/check.py accepted a metric the daemon does not export or a malformed rule" >&2; exit 1
fi
echo "negative checks: a dashboard naming an unknown metric and a malformed alert rule are refused"
