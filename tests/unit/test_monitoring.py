"""What a platform team loads into Prometheus and Grafana: the alert rules (infra/prometheus/alerts.yml) and the
dashboard (infra/grafana/eventlake-dashboard.json) name only metrics the services serve; Prometheus' own tools accept
the rules and fire each alert where its rule test says (``promtool check rules``, ``promtool test rules
alerts_test.yml``; skipped where Debian's ``prometheus`` package, which holds promtool, is not installed)."""
import json
from collections import namedtuple
from datetime import datetime, timezone
from types import SimpleNamespace
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from event_store.account.fraud_consumer import FraudStats, figures as detector_figures
from event_store.account.policy import PolicyStats, figures as policy_figures
from event_store.handler_stats import HandlerStats, figures as handler_figures
from expectations.checks import Verdict
from spark_apps.detector_app import DetectorFigures
from spark_apps.maintenance import MaintenanceReport
from spark_apps.rebuild import BuildResult
from spark_apps.reprocess import ReprocessOutcome
from eventlake.lag_exporter import Position, Snapshot, figures as lag_exporter_figures
from eventlake.sql_server import figures as sql_server_figures
from lakehouse.metrics import Sample
from projection_core.figures import QueryFigures, query_samples
from python_engine.figures import figures as engine_figures

INFRA = Path(__file__).resolve().parents[2] / "infra"
RULES = INFRA / "prometheus"
DASHBOARD = INFRA / "grafana" / "eventlake-dashboard.json"
PROMTOOL = shutil.which("promtool")
NO_PROMTOOL = "promtool is not on the PATH: sudo apt-get install prometheus (Debian's package holds promtool)"


class _Store:
    def entries(self): return 1
    def cached_bytes(self): return 1
    def size_on_disk(self): return 1


_Part = namedtuple("_Part", "partition store states")


def served_names() -> set[str]:
    """Every series name the handler, the projection, the fraud detector, the policy, the SQL server and the lag
    exporter serve, and Airflow's tasks push (counters with ``_total``)."""
    query = QueryFigures()
    query.last_commit_at, query.lag, query.step_seconds = 1.0, {0: 1}, {"step": 1.0}
    query.add_outcomes({"applied": 1}, held=0, newest_event_at=1.0)
    samples: list[Sample] = [*handler_figures(HandlerStats(), {0: _Part(0, None, {}), 1: _Part(1, _Store(), {})}), *query_samples([("read_models", query)])]
    samples += engine_figures(type("Engine", (), {"handed_over": 0, "queries": [], "plan": None})())
    detector = FraudStats(by_rule={"velocity": 1}, lag={0: 1})
    samples += [*detector_figures(detector), *policy_figures(PolicyStats(lag={0: 1})), *sql_server_figures([1] * 5)]
    samples += lag_exporter_figures(Snapshot([Position("projection-p", "projection", "events", {0: 1}, 1.0, {0: 1.0})],
                                             {"events": {0: 2}}, refreshed_at=1.0, tables={"payments": 1.0}))
    samples += DetectorFigures("events").samples()
    # What Airflow's tasks push (lakehouse.metrics.push).
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    samples += [*Verdict("payments", None, missing="no table").samples(), *MaintenanceReport("payments").samples(),
                *ReprocessOutcome("spend", 1, at, at, {}, at).samples(),
                *BuildResult("payments", 2, SimpleNamespace(events=10)).samples()]
    return {f"eventlake_{s.name}" + ("_total" if s.kind == "counter" else "") for s in samples}


def test_every_rule_names_metrics_the_services_serve():
    rules = [r for g in yaml.safe_load((RULES / "alerts.yml").read_text())["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} >= {"EventlakeProjectionLagGrowing", "EventlakeProjectionStalled",
                                           "EventlakeCommandsDeadLettered", "EventlakeAggregateQuarantined"}
    served = served_names()
    for rule in rules:
        named = set(re.findall(r"\beventlake_[a-z_]+", rule["expr"]))
        assert named <= served, (rule["alert"], sorted(named - served))
        assert named or 'up{job="eventlake"}' in rule["expr"], rule  # Prometheus' own: the scrape failed
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"], rule


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_accepts_the_rules_and_each_alert_fires_where_its_test_says():
    checked = subprocess.run([PROMTOOL, "check", "rules", "alerts.yml"], cwd=RULES, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([PROMTOOL, "test", "rules", "alerts_test.yml"], cwd=RULES, capture_output=True,
                            text=True)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_dashboard_panel_queries_metrics_the_services_serve():
    dashboard = json.loads(DASHBOARD.read_text())
    served = served_names() | {"process_resident_memory_bytes", "process_cpu_seconds_total"}
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels) and all(p["targets"] for p in panels)
    for panel in panels:
        for target in panel["targets"]:
            named = set(re.findall(r"\b(?:eventlake|process)_[a-z_]+", target["expr"]))
            assert named and named <= served, (panel["title"], sorted(named - served))
    queried = {n for p in panels for t in p["targets"] for n in re.findall(r"\beventlake_[a-z_]+", t["expr"])}
    # Every projection figure has a panel, and the handler's commands, events and transactions.
    assert {n for n in served if n.startswith("eventlake_projection_")} <= queried, sorted(
        {n for n in served if n.startswith("eventlake_projection_")} - queried)
    assert {"eventlake_handler_commands_total", "eventlake_handler_events_total",
            "eventlake_handler_transactions_total"} <= queried
