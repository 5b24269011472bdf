#!/usr/bin/env python3
"""Offline checks of libshare's Grafana dashboard and Prometheus alert rules (check.sh runs it).

- the dashboard (Grafana JSON model, schemaVersion 39): the fields Grafana requires, unique
  panel ids, every panel on the 24-column grid without overlapping another, every query panel on
  the ${datasource} variable with a refId and an expression per target, every variable it uses
  defined;
- every PromQL expression, of the dashboard (variables replaced by a regex) and of the alert
  rules, parses: `promtool check rules` on the rules file and on a rules file made of the
  dashboard's queries;
- every libshare metric they name is one the daemon exports: its base name (without the
  `libshare_`/`libshare_daemon_` prefix and the `_bytes`/`_seconds`/`_ratio`/`_total` suffixes)
  is registered in libshare-node/src/metrics.rs.

usage: check.py DASHBOARD.json RULES.yaml METRICS_RS
"""
import json
import re
import subprocess
import sys
import tempfile

import yaml

SUFFIXES = ("_total", "_bytes", "_seconds", "_ratio")


def base_name(metric):
    m = metric[len("libshare_"):]
    if m.startswith("daemon_"):
        m = m[len("daemon_"):]
    for s in SUFFIXES:
        if m.endswith(s):
            m = m[: -len(s)]
    return m


def dashboard_problems(d):
    bad = []
    for k in ("uid", "title", "schemaVersion", "panels", "templating", "time"):
        if k not in d:
            bad.append(f"dashboard: no {k}")
    variables = {v["name"] for v in d.get("templating", {}).get("list", [])}
    ids = set()
    cells = {}
    exprs = []
    for p in d.get("panels", []):
        pid = p.get("id")
        where = f"panel {pid} ({p.get('title')})"
        if pid in ids:
            bad.append(f"{where}: duplicate id")
        ids.add(pid)
        g = p.get("gridPos") or {}
        x, y, w, h = (g.get(k) for k in ("x", "y", "w", "h"))
        if None in (x, y, w, h) or x < 0 or w <= 0 or h <= 0 or x + w > 24:
            bad.append(f"{where}: gridPos {g} is not on the 24-column grid")
            continue
        for cx in range(x, x + w):
            for cy in range(y, y + h):
                if (cx, cy) in cells:
                    bad.append(f"{where}: overlaps panel {cells[(cx, cy)]}")
                    break
                cells[(cx, cy)] = pid
        if p.get("type") == "row":
            continue
        if not p.get("title") or not p.get("type"):
            bad.append(f"{where}: no title or type")
        if (p.get("datasource") or {}).get("uid") != "${datasource}":
            bad.append(f"{where}: its datasource is not the ${{datasource}} variable")
        targets = p.get("targets") or []
        if not targets:
            bad.append(f"{where}: no query")
        for t in targets:
            if not t.get("refId") or not t.get("expr"):
                bad.append(f"{where}: a target without refId or expr")
                continue
            for v in re.findall(r"\$\{?(\w+)", t["expr"]):
                if v not in variables:
                    bad.append(f"{where}: ${v} is not a dashboard variable")
            exprs.append(t["expr"])
    return bad, exprs


def promtool(rules_file):
    r = subprocess.run(["promtool", "check", "rules", rules_file], capture_output=True, text=True)
    return [] if r.returncode == 0 else [f"promtool: {rules_file}: {(r.stdout + r.stderr).strip()}"]


def main(dashboard, rules, metrics_rs):
    with open(dashboard) as f:
        d = json.load(f)
    bad, exprs = dashboard_problems(d)
    with open(rules) as f:
        alert_exprs = [r["expr"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
    bad += promtool(rules)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as tmp:
        recorded = [
            {"record": f"dashboard:query{i}", "expr": re.sub(r"\$\{?\w+\}?", ".*", e)}
            for i, e in enumerate(exprs)
        ]
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}, tmp)
        tmp.flush()
        bad += promtool(tmp.name)
    registered = set(re.findall(r'"([a-z_]+)"', open(metrics_rs).read()))
    names = set()
    for e in exprs + alert_exprs:
        names |= set(re.findall(r"\blibshare_[a-z_]+", e))
    for n in sorted(names):
        if base_name(n) not in registered:
            bad.append(f"{n}: not a metric the daemon exports ({metrics_rs})")
    for b in bad:
        print(b)
    if bad:
        return 1
    print(f"monitoring: dashboard ({len(exprs)} queries) and {len(alert_exprs)} alert rule(s) ok; "
          f"{len(names)} libshare metric name(s), each exported by the daemon")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
