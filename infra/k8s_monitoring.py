"""The alert rules and the Grafana dashboard as Kubernetes ConfigMaps (``infra/k8s/monitoring.yaml``).

Kustomize loads no file outside ``infra/k8s`` (its load restrictor), and the rules and the dashboard live in
``infra/prometheus`` and ``infra/grafana`` (where promtool and a Grafana import read them): ``python -m
infra.k8s_monitoring`` writes ``monitoring.yaml`` from them, and a test (tests/unit/test_k8s_manifests.py) checks it
is still what this writes. ``eventlake-alert-rules`` is mounted by a Prometheus as a rule file (under
``/etc/prometheus/rules``, where ``eventlake-prometheus-config``'s ``prometheus.yml`` looks); the dashboard's
ConfigMap carries the label the Grafana Helm chart's dashboard sidecar looks for (``grafana_dashboard: "1"``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

__all__ = ["MANIFEST", "RULES", "DASHBOARD", "SCRAPE_CONFIG", "manifest"]

INFRA = Path(__file__).resolve().parent
MANIFEST = INFRA / "k8s" / "monitoring.yaml"
RULES = INFRA / "prometheus" / "alerts.yml"
DASHBOARD = INFRA / "grafana" / "eventlake-dashboard.json"
SCRAPE_CONFIG = INFRA / "prometheus" / "kubernetes.yml"

HEADER = """\
# The Prometheus alert rules, Prometheus' configuration on Kubernetes and the Grafana dashboard
# (infra/prometheus/alerts.yml and kubernetes.yml, infra/grafana/eventlake-dashboard.json) as ConfigMaps.
# Written by `python -m infra.k8s_monitoring`; do not edit by hand.
"""


class _Literal(str):
    """A string written as a YAML literal block (``|``), as it reads in its own file."""


def _literal(dumper, value):
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")


def manifest() -> str:
    """``monitoring.yaml`` as it should read."""
    dumper = type("Dumper", (yaml.SafeDumper,), {})
    dumper.add_representer(_Literal, _literal)
    maps = [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "eventlake-alert-rules", "labels": {"app.kubernetes.io/part-of": "eventlake"}},
         "data": {"eventlake-alerts.yml": _Literal(RULES.read_text())}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "eventlake-prometheus-config", "labels": {"app.kubernetes.io/part-of": "eventlake"}},
         "data": {"prometheus.yml": _Literal(SCRAPE_CONFIG.read_text())}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "eventlake-grafana-dashboard",
                      "labels": {"app.kubernetes.io/part-of": "eventlake", "grafana_dashboard": "1"}},
         "data": {"eventlake-dashboard.json": _Literal(DASHBOARD.read_text())}},
    ]
    return HEADER + "---\n".join(yaml.dump(m, Dumper=dumper, sort_keys=False, width=120, allow_unicode=True)
                                 for m in maps)


if __name__ == "__main__":
    MANIFEST.write_text(manifest())
    print(f"wrote {MANIFEST}", file=sys.stderr)
