"""The services' metrics through a real Prometheus server (issue 44): it finds the handler and the projection
(Python engine) by their registrations under the home, scrapes them, and its series tell what the log holds; the
alert rules load and evaluate, and a killed service's failed scrapes raise EventlakeServiceDown. Skipped with the
reason where Debian's ``prometheus`` package is not installed."""
from __future__ import annotations

import signal

import pytest

from event_store import kafka_log
from event_store.envelope import CommandEnvelope, CommandResult
from tests.integration.prometheus_server import NO_PROMETHEUS, PROMETHEUS, PrometheusServer
from tests.integration.services import Service, service_env, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.skipif(PROMETHEUS is None, reason=NO_PROMETHEUS)]

ACCOUNTS = 5


def commands() -> list[CommandEnvelope]:
    """Every account opened, then payments (the third of each account over its credit limit: declined, an event
    all the same), then each account opened again (rejected: it is open)."""
    def opens():
        return [CommandEnvelope.create("OpenAccount", f"acc-{a}", {"customer_id": f"c{a}", "credit_limit_minor": 1_000,
                                                                    "currency": "USD"}) for a in range(ACCOUNTS)]
    pays = [CommandEnvelope.create("AuthorizePayment", f"acc-{a}", {
        "payment_id": f"p{a}-{i}", "amount_minor": 400, "currency": "USD", "merchant_id": "m1",
        "location": "US-NYC", "occurred_at": "2026-01-01T10:00:00.000Z"}) for a in range(ACCOUNTS) for i in range(3)]
    return opens() + pays + opens()


def test_prometheus_scrapes_the_services_and_their_series_tell_the_log(settings, tmp_path):
    settings = settings.replace(trigger_interval="1 second")
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    env = service_env(settings)
    prometheus = PrometheusServer(settings.home, tmp_path / "prometheus")
    services = {"handler": Service("handler", ["handler"], env, tmp_path),
                "projection": Service("projection", ["project", "--engine", "python"], env, tmp_path)}
    try:
        # Both found through their registrations and scraped (each in its own time: wait for both).
        def services_up():
            return {dict(labels)["service"] for labels in prometheus.query('up{job="eventlake"} == 1')}
        wait_for(lambda: services_up() == {"handler-0", "projection"}, 120, 1.0)
        assert services_up() == {"handler-0", "projection"}, (
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
            return (by_outcome == {k: float(v) for k, v in outcomes.items()} and list(lag.values()) == [0.0]
                    and list(records.values()) == [float(events)]), by_outcome, lag, records
        matched = wait_for(lambda: series_match()[0], 60, 1.0)
        assert matched, series_match()
        # Every alert rule is loaded and evaluates without error.
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        assert len(rules) >= 6 and all(r["health"] == "ok" for r in rules), rules

        # A killed service leaves its registration: Prometheus' scrapes fail and the service-down alert is raised
        # (pending for its first 2 minutes).
        services["handler"].process.send_signal(signal.SIGKILL)
        services["handler"].process.wait(30)
        down = wait_for(lambda: prometheus.query(
            'ALERTS{alertname="EventlakeServiceDown", service="handler-0", alertstate="pending"}'), 60, 1.0)
        assert down, prometheus.query('up{job="eventlake"}')
    finally:
        for service in services.values():
            service.kill()
        prometheus.close()


def read_results(settings) -> dict[str, CommandResult]:
    return {r.command_id: r for r in (CommandResult.from_json(rec.value)
                                      for rec in kafka_log.read_all(settings, settings.results_topic))}
