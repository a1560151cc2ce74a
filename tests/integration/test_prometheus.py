"""The services' metrics through a real Prometheus server (issue 44): it finds the handler and the projection
(Python engine) by their registrations under the home, scrapes them, and its series tell what the log holds; the
alert rules load and evaluate, and fire on what they are meant for, with their windows in seconds rather than
minutes (the same expressions): a command record written around our producers is dead-lettered and counted; a
projection stopped under load is seen falling behind by the lag exporter (from its checkpoint: its own metrics went
with it); one that cannot keep up falls behind (its lag grows, its freshness goes past its aim) and, once one that
can takes over, catches up; a killed service's failed scrapes raise EventlakeServiceDown. Skipped with the
reason where Debian's ``prometheus`` package is not installed."""
from __future__ import annotations

import json
import re
import signal
import threading
from pathlib import Path

import pytest

import read_models
from event_store import kafka_log
from event_store.envelope import CommandEnvelope, CommandResult
from tests.integration.prometheus_server import NO_PROMETHEUS, PROMETHEUS, RULES, PrometheusServer
from tests.integration.services import Service, service_env, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.skipif(PROMETHEUS is None, reason=NO_PROMETHEUS)]

ACCOUNTS = 5
READ_MODELS = "projection-" + "+".join(read_models.REGISTRY)  # the default projection's read models' checkpoint


def commands() -> list[CommandEnvelope]:
    """Every account opened, then payments (the third of each account over its credit limit: declined, an event
    all the same), then each account opened again (rejected: it is open)."""
    def opens():
        return [CommandEnvelope.create("OpenAccount", f"acc-{a}", {"customer_id": f"c{a}", "credit_limit_minor": 1_000,
                                                                    "currency": "USD"}) for a in range(ACCOUNTS)]
    pays = [CommandEnvelope.create("AuthorizePayment", f"acc-{a}", {
        "payment_id": f"p{a}-{i}", "amount_minor": 400, "currency": "USD", "merchant_id": "m1",
        "location": "US-NYC", "occurred_at": "2026-01-01T10:00:00.000Z"}) for a in range(ACCOUNTS) for i in range(3)]
    # A frozen account's payment is declined (an event all the same): the freeze shows in the commands by type.
    freeze = [CommandEnvelope.create("FreezeAccount", "acc-0", {"reason": "test"}), CommandEnvelope.create(
        "AuthorizePayment", "acc-0", {"payment_id": "p-frozen", "amount_minor": 1, "currency": "USD",
                                      "merchant_id": "m1", "location": "US-NYC",
                                      "occurred_at": "2026-01-01T10:00:00.000Z"})]
    return opens() + pays + opens() + freeze


def alerts(prometheus, name: str, state: str = "firing") -> dict:
    return prometheus.query(f'ALERTS{{alertname="{name}", alertstate="{state}"}}')


class Load:
    """Commands opening new accounts, about ``per_second`` a second, until stopped."""

    def __init__(self, settings, per_second: int = 40):
        self.settings, self.per_second, self.sent = settings, per_second, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        producer = kafka_log.make_producer(self.settings)
        try:
            while not self.stop.is_set():
                chunk = [CommandEnvelope.create("OpenAccount", f"acc-load-{self.sent + i}", {
                    "customer_id": "c", "credit_limit_minor": 1, "currency": "USD"}) for i in range(self.per_second // 4)]
                kafka_log.produce_all(producer, self.settings.commands_topic, [(c.aggregate_id, c.to_json())
                                                                               for c in chunk])
                self.sent += len(chunk)
                self.stop.wait(0.25)
        finally:
            producer.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)


def test_prometheus_scrapes_the_services_and_their_series_tell_the_log(settings, tmp_path):
    settings = settings.replace(trigger_interval="1 second")
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    env = service_env(settings)
    prometheus = PrometheusServer(settings.home, tmp_path / "prometheus", fast_rules=True)
    services = {"handler": Service("handler", ["handler"], env, tmp_path),
                "projection": Service("projection", ["project", "--engine", "python"], env, tmp_path),
                "lag-exporter": Service("lag-exporter", ["lag-exporter", "--every", "1"], env, tmp_path)}
    try:
        # All found through their registrations and scraped (each in its own time: wait for all).
        def services_up():
            return {dict(labels)["service"] for labels in prometheus.query('up{job="eventlake"} == 1')}
        expected = {"handler-0", "projection", "lag-exporter"}
        wait_for(lambda: services_up() == expected, 120, 1.0)
        assert services_up() == expected, ([(t["labels"].get("service"), t["lastError"]) for t in
                                            prometheus.api("targets")["activeTargets"]],
            prometheus.query('up{job="eventlake"}'), {n: s.tail() for n, s in services.items()})

        sent = commands()
        producer = kafka_log.make_producer(settings)
        kafka_log.produce_all(producer, settings.commands_topic, [(c.aggregate_id, c.to_json()) for c in sent])
        producer.close()
        def all_answered():
            got = read_results(settings)
            return got if len(got) == len(sent) else None
        answered = wait_for(all_answered, 120, 1.0)
        assert answered, services["handler"].tail()
        outcomes = {s: sum(r.status == s for r in answered.values()) for s in ("accepted", "rejected")}
        assert outcomes["rejected"] == ACCOUNTS, answered  # each account's second opening
        events = sum(len(r.event_ids) for r in answered.values())

        def series_match():
            by_outcome = {dict(k)["outcome"]: v for k, v in prometheus.query(
                'sum by (outcome) (eventlake_handler_commands_total{outcome=~"accepted|rejected"})').items()}
            lag = prometheus.query('sum(eventlake_projection_lag_records{query="read_models"})')
            records = prometheus.query('sum(eventlake_projection_records_total{query="read_models"})')
            committed = prometheus.query('sum by (consumer) (eventlake_committed_lag_records)')
            return (by_outcome == {k: float(v) for k, v in outcomes.items()} and list(lag.values()) == [0.0]
                    and list(records.values()) == [float(events)]
                    and {dict(k)["consumer"]: v for k, v in committed.items()} == {
                        READ_MODELS: 0.0, "projection-event_archive": 0.0, settings.handler_group_id: 0.0}
                    ), by_outcome, lag, records, committed
        matched = wait_for(lambda: series_match()[0], 60, 1.0)
        assert matched, series_match()
        by_type = {(dict(k)["type"], dict(k)["outcome"]): v for k, v in prometheus.query(
            'sum by (type, outcome) (eventlake_handler_commands_total) > 0').items()}
        assert by_type == {("OpenAccount", "accepted"): ACCOUNTS, ("OpenAccount", "rejected"): ACCOUNTS,
                           ("AuthorizePayment", "accepted"): 3 * ACCOUNTS + 1, ("FreezeAccount", "accepted"): 1}
        applied = prometheus.query('sum(eventlake_projection_events_total{query="read_models", outcome="applied"})')
        assert list(applied.values()) == [float(events)]
        # Every alert rule is loaded and evaluates without error; none fires on a healthy pair.
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        assert len(rules) >= 8 and all(r["health"] == "ok" for r in rules), rules
        assert not prometheus.query('ALERTS{alertstate="firing"}')

        # A record written around our producers to the commands topic: dead-lettered, counted, alerted on.
        producer = kafka_log.make_producer(settings)
        kafka_log.produce_all(producer, settings.commands_topic, [("acc-0", b"{not a command")])
        producer.close()
        dead = wait_for(lambda: alerts(prometheus, "EventlakeCommandsDeadLettered"), 60, 1.0)
        assert dead and list(prometheus.query('sum(eventlake_handler_commands_total{outcome="dead_lettered"})')
                             .values()) == [1.0], dead

        # Under load, a stopped projection serves no figure of its own, but the lag exporter reads its checkpoint:
        # the records past it rise, its position stays, and both of the exporter's alerts fire for its queries.
        services["projection"].process.send_signal(signal.SIGTERM)
        assert services["projection"].process.wait(60) == 0, services["projection"].tail()
        load = Load(settings)
        try:
            def stopped_alerts():
                growing = {dict(k)["consumer"] for k in alerts(prometheus, "EventlakeLagGrowing")}
                stopped = {dict(k)["consumer"] for k in alerts(prometheus, "EventlakeConsumerStopped")}
                return {READ_MODELS, "projection-event_archive"} <= growing & stopped
            assert wait_for(stopped_alerts, 90, 1.0), (
                prometheus.query("sum by (consumer) (eventlake_committed_lag_records)"), prometheus.query("ALERTS"),
                services["lag-exporter"].tail())
            waiting = prometheus.query(f'sum(eventlake_committed_lag_records{{consumer="{READ_MODELS}"}})')
            assert list(waiting.values())[0] > 0, waiting

            # A projection that cannot keep up (two records a batch) falls behind: its lag grows and its freshness
            # goes past its aim, and both of its alerts fire.
            services["slow projection"] = Service("slow projection", ["project", "--engine", "python"],
                                                  {**env, "EVENTLAKE_MAX_OFFSETS_PER_TRIGGER": "2"}, tmp_path)
            behind = wait_for(lambda: alerts(prometheus, "EventlakeProjectionLagGrowing")
                              and alerts(prometheus, "EventlakeReadModelsBehind"), 90, 1.0)
            assert behind, (prometheus.query('eventlake_projection_lag_records{query="read_models"}'),
                            prometheus.query("eventlake_projection_lag_seconds"), services["slow projection"].tail())
        finally:
            load.close()
        # One that keeps up takes over: it reads to the log's end, and the alerts go.
        services["slow projection"].process.send_signal(signal.SIGTERM)
        assert services["slow projection"].process.wait(60) == 0, services["slow projection"].tail()
        services["projection"] = Service("projection", ["project", "--engine", "python"], env, tmp_path)

        def caught_up():
            lag = prometheus.query('sum(eventlake_projection_lag_records{query="read_models"})')
            seconds = prometheus.query('max(eventlake_projection_lag_seconds{query="read_models"})')
            committed = prometheus.query('sum(eventlake_committed_lag_records{kind="projection"})')
            return (list(lag.values()) == [0.0] and list(seconds.values()) == [0.0]
                    and list(committed.values()) == [0.0]
                    and not alerts(prometheus, "EventlakeProjectionLagGrowing")
                    and not alerts(prometheus, "EventlakeReadModelsBehind")
                    and not [k for name in ("EventlakeLagGrowing", "EventlakeConsumerStopped")
                             for k in alerts(prometheus, name) if dict(k)["consumer"].startswith("projection-")])
        assert wait_for(caught_up, 120, 1.0), (prometheus.query("eventlake_projection_lag_records"),
                                               services["projection"].tail())

        # A killed service leaves its registration: Prometheus' scrapes fail and the service-down alert fires.
        services["handler"].process.send_signal(signal.SIGKILL)
        services["handler"].process.wait(30)
        down = wait_for(lambda: prometheus.query(
            'ALERTS{alertname="EventlakeServiceDown", service="handler-0", alertstate="firing"}'), 60, 1.0)
        assert down, prometheus.query('up{job="eventlake"}')
    finally:
        for service in services.values():
            service.kill()
        prometheus.close()


def read_results(settings) -> dict[str, CommandResult]:
    return {r.command_id: r for r in (CommandResult.from_json(rec.value)
                                      for rec in kafka_log.read_all(settings, settings.results_topic))}


def kubernetes_pods() -> list[dict]:
    """The pods our manifests make, as Prometheus' Kubernetes discovery (role pod) sees them: each Deployment's pod
    and each SparkApplication's driver and executor pod, with their labels, annotations and container ports."""
    import yaml

    k8s = Path(__file__).resolve().parents[2] / "infra" / "k8s"
    pods = []
    for doc in (d for f in ("services.yaml", "spark-apps.yaml") for d in yaml.safe_load_all((k8s / f).read_text())):
        if doc and doc["kind"] == "Deployment":
            template = doc["spec"]["template"]
            pods.append({"name": f"{doc['metadata']['name']}-0", **template["metadata"],
                         "ports": [p for c in template["spec"]["containers"] for p in c.get("ports", [])]})
        elif doc and doc["kind"] == "SparkApplication":
            for role in ("driver", "executor"):
                spec = doc["spec"][role]
                pods.append({"name": f"{doc['metadata']['name']}-{role}", "labels": spec.get("labels", {}),
                             "annotations": spec.get("annotations", {}), "ports": spec.get("ports", [])})
    return pods


def discovered(pods: list[dict]) -> list[dict]:
    """The targets Kubernetes' pod discovery gives for ``pods``: one per container port (one without a port for a
    pod that declares none), labelled with the ``__meta_kubernetes_pod_*`` labels it documents."""
    def clean(name: str) -> str:
        return re.sub(r"[^a-zA-Z0-9_]", "_", name)

    targets = []
    for n, pod in enumerate(pods):
        meta = {"__meta_kubernetes_namespace": "eventlake", "__meta_kubernetes_pod_name": pod["name"],
                **{f"__meta_kubernetes_pod_label_{clean(k)}": v for k, v in pod["labels"].items()},
                **{f"__meta_kubernetes_pod_annotation_{clean(k)}": str(v) for k, v in pod["annotations"].items()}}
        ip = f"10.1.0.{n + 1}"
        for port in pod["ports"] or [None]:
            if port is None:
                targets.append({"targets": [ip], "labels": meta})
            else:
                targets.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": {
                    **meta, "__meta_kubernetes_pod_container_port_name": port["name"],
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"])}})
    return targets


def test_on_kubernetes_prometheus_scrapes_every_service_and_sparks_own_metrics(tmp_path):
    """infra/prometheus/kubernetes.yml, run by a real Prometheus on the targets Kubernetes' pod discovery would give
    for our manifests (Debian's Prometheus is built without that discovery: the same targets come from a file here,
    with the same meta labels): our figures from every service's metrics port and the projection's driver, Spark's
    own from each driver's spark-ui port (the driver's and the executors' paths), nothing from executors."""
    import yaml

    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "infra" / "prometheus" /
                             "kubernetes.yml").read_text())
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps(discovered(kubernetes_pods())))
    for job in config["scrape_configs"]:
        assert [sd["role"] for sd in job.pop("kubernetes_sd_configs")] == ["pod"], job["job_name"]
        job["file_sd_configs"] = [{"files": [str(pods)]}]
    config["rule_files"] = [str(RULES)]
    prometheus = PrometheusServer(tmp_path, tmp_path / "prometheus", config=config)
    try:
        settings = yaml.safe_load((Path(__file__).resolve().parents[2] / "infra" / "k8s" /
                                   "settings.yaml").read_text().split("---")[0])["data"]
        assert settings["EVENTLAKE_SPARK_METRICS"] == "on"
        ours = {("eventlake", s, "metrics") for s in ("command-handler", "fraud-policy", "fraud-detector",
                                                       "lag-exporter", "projection", "telemetry-detector")}
        sparks = {(job, f"spark-{s}", path) for s in ("projection", "telemetry-detector")
                  for job, path in (("eventlake-spark", "metrics/prometheus"),
                                    ("eventlake-spark-executors", "metrics/executors/prometheus"))}

        def targets():
            return {(t["labels"]["job"], t["labels"]["service"], t["scrapeUrl"].split("/", 3)[-1])
                    for t in prometheus.api("targets", state="active")["activeTargets"]}
        wait_for(lambda: targets() == ours | sparks, 30, 0.5)
        assert targets() == ours | sparks
        spark_ports = {t["scrapeUrl"].split("/")[2].split(":")[1]
                       for t in prometheus.api("targets", state="active")["activeTargets"]
                       if t["labels"]["job"] != "eventlake"}
        assert spark_ports == {settings["EVENTLAKE_SPARK_UI_PORT"]}
    finally:
        prometheus.close()
