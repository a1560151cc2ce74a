"""Every service across a broker restart (issue 14): `eventlake handler`, `project`, `detect-fraud` and `policy`,
run as a user runs them, go on by themselves after the broker comes back mid-stream (every command answered,
every event in the read models and the archive once, fraud flagged and frozen), and each stops on SIGTERM within
seconds while the broker is away.

The broker is the module's own (tests/integration/restartable_broker.py): the suite's shared one is never stopped.
"""
from __future__ import annotations

import signal
import subprocess
import time

import pytest

from event_store import kafka_log
from lakehouse import metrics
from lakehouse.settings import Settings
from tests.integration.fraud_stream import EXPECTED_FLAGS, FLAGGED_ACCOUNTS, SERVICES, FraudStream, read_log
from tests.integration.restartable_broker import (  # noqa: F401 -- own_broker is a fixture
    BROKER_AWAY_S, STOP_WITHIN_S, broker_down, broker_up, needs_local_broker, own_broker, settings_on)
from tests.integration.services import Service, service_env

pytestmark = [pytest.mark.slow, needs_local_broker]


@pytest.fixture
def settings(tmp_path, own_broker) -> Settings:
    return settings_on(own_broker, tmp_path / "home").replace(trigger_interval="1 second",
                                                              spark_shuffle_partitions=2)


def test_every_service_resumes_after_a_broker_restart_and_stops_on_sigterm_while_it_is_away(
        settings, own_broker, spark, tmp_path):
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    env = service_env(settings)
    services = {name: Service(name, args, env, tmp_path) for name, args in SERVICES.items()}
    # Watching them all from outside, through the restart (issue 44).
    services["lag-exporter"] = Service("lag-exporter", ["lag-exporter", "--every", "1"], env, tmp_path)
    stream = FraudStream(settings, services)
    broker_is_up = True
    try:
        stream.start_feeding_when_ready()
        assert stream.half_sent.wait(120)
        # Mid-stream: the first finding is on its way through detector, handler and policy; more commands keep coming.
        broker_down(own_broker)
        broker_is_up = False
        time.sleep(BROKER_AWAY_S)
        broker_up(own_broker)
        broker_is_up = True
        assert stream.feeding_done.wait(300)
        # After the restart: every command answered, the fraud loop closed, every event projected once.
        stream.assert_answered_and_projected_once(spark)
        # ... and the handler's and the projection's metrics say so (issue 44).
        assert_metrics_tell_the_log(settings)
        assert_the_lag_exporter_saw_the_outage_and_now_no_lag(settings, services["lag-exporter"])

        # -- SIGTERM while the broker is away: each service ends within seconds, cleanly ------------------------
        broker_down(own_broker)
        broker_is_up = False
        time.sleep(5)  # every service now waits for the broker
        stopped = {}
        for name, service in services.items():
            asked = time.monotonic()
            service.process.send_signal(signal.SIGTERM)
            try:
                code = service.process.wait(STOP_WITHIN_S)
            except subprocess.TimeoutExpired:
                code = None
            stopped[name] = (code, time.monotonic() - asked)
        problems = {name: (f"exit {code}" if code is not None else f"still running after {STOP_WITHIN_S}s")
                    for name, (code, _) in stopped.items() if code != 0}
        problems.update({name: "a traceback in its output" for name, service in services.items()
                         if "Traceback" in service.output()})
        assert not problems, f"{problems}; " + "".join(f"\n--- {n}:\n{services[n].tail(25)}" for n in problems)
        assert metrics.local_targets(settings) == []  # a stopped service's registration goes with it
        assert not list((settings.home / "metrics").glob("*.json"))
    finally:
        for service in services.values():
            service.kill()
        if not broker_is_up:
            broker_up(own_broker)


def assert_the_lag_exporter_saw_the_outage_and_now_no_lag(settings, exporter: Service) -> None:
    """`eventlake lag-exporter`, refreshing each second through the restart: its refreshes failed while the broker
    was away (said once, then that it reads again; a topic just created may
    refuse a moment too); now every consumer it watches (the projection's two queries, the
    handler's, policy's and fraud detector's groups) is at the log's end on every partition, with no record
    waiting, and each table's last commit is its Delta log's newest."""
    import read_models
    from lakehouse.storage import delta_table
    from projection_core.plan import ARCHIVE_QUERY
    from read_models.catalog import ARCHIVE_TABLE, Catalog

    consumers = {"projection-" + "+".join(read_models.REGISTRY), ARCHIVE_QUERY, settings.handler_group_id,
                 settings.policy_group_id, settings.fraud_detector_group}
    tables = {name: g.table for name, g in Catalog(settings).current_all().items()}
    tables[ARCHIVE_TABLE] = settings.table_path(ARCHIVE_TABLE)
    newest = {name: delta_table(where).history(1)[0]["timestamp"] / 1000 for name, where in tables.items()}
    target = {t.service: t for t in metrics.local_targets(settings)}["lag-exporter"]

    def figures():
        samples = metrics.scrape(target.url)
        by = lambda name, key: {tuple(ls[k] for k in key): v for n, ls, v in samples if n == name}  # noqa: E731
        return (by("eventlake_committed_lag_records", ("consumer", "partition")),
                by("eventlake_committed_lag_seconds", ("consumer", "partition")),
                by("eventlake_table_last_commit_timestamp_seconds", ("table",)),
                by("eventlake_lag_exporter_refreshes_total", ("result",)))
    deadline = time.monotonic() + 60
    while True:
        lag, seconds, commits, refreshes = figures()
        every = {(c, str(p)) for c in consumers for p in range(settings.topic_partitions)}
        if (set(lag) == every and not any(lag.values()) and {(t,): at for (t,), at in commits.items()} ==
                {(t,): at for t, at in newest.items()}) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(lag) == every and not any(lag.values()), lag
    assert seconds == {key: 0.0 for key in every}, seconds
    assert commits == {(t,): at for t, at in newest.items()}, (commits, newest)
    assert refreshes[("failed",)] >= 1 and refreshes[("ok",)] >= 1, refreshes
    said = [line for line in exporter.output().splitlines() if line.startswith("lag-exporter: ")]
    failed = [i for i, line in enumerate(said) if line.startswith("lag-exporter: cannot read the positions")]
    assert failed and "lag-exporter: positions read again" in said[failed[-1]:], exporter.tail()
    assert len(failed) <= refreshes[("failed",)], (said, refreshes)


def assert_metrics_tell_the_log(settings) -> None:
    """The handler and the projection, running as services, serve /metrics and register it under the home (where
    `eventlake metrics` finds them): the handler counts every event the log holds, the projection catches up to
    no lag, and `eventlake metrics` shows both."""
    _, _, events = read_log(settings)
    targets = {t.service: t for t in metrics.local_targets(settings)}
    assert {"handler-0", "projection"} <= set(targets), targets

    def value(samples, name, **labels):
        found = [v for n, ls, v in samples if n == name and all(ls.get(k) == w for k, w in labels.items())]
        assert found, f"{name} {labels} not served: {[n for n, _, _ in samples]}"
        return sum(found)

    handler = metrics.scrape(targets["handler-0"].url)
    assert value(handler, "eventlake_handler_events_total") == len(events)
    assert value(handler, "eventlake_handler_commands_total", outcome="accepted") > 0
    assert value(handler, "eventlake_handler_partitions") == settings.topic_partitions
    assert value(handler, "process_resident_memory_bytes") > 0
    deadline = time.monotonic() + 60  # the lag is read from the consumer's last fetch, after the projection's
    while True:
        projection = metrics.scrape(targets["projection"].url)
        lag = value(projection, "eventlake_projection_lag_records", query="read_models")
        if lag == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert lag == 0
    assert value(projection, "eventlake_projection_batches_total", query="read_models") >= 1
    assert value(projection, "eventlake_projection_last_commit_timestamp_seconds", query="event_archive") > 0
    # The fraud detector and the policy: every finding by its rule (a finding sent again after the restart counts
    # again: its command id repeats, the handler answers it once), the freezes, and no lag once caught up.
    assert {"fraud-detector", "policy"} <= set(targets), targets
    deadline = time.monotonic() + 60
    while True:
        detector, policy = metrics.scrape(targets["fraud-detector"].url), metrics.scrape(targets["policy"].url)
        # partition -> lag: each owns every partition (one instance of each), once it has a position in each
        lags = [{ls["partition"]: v for n, ls, v in samples if n == "eventlake_consumer_lag_records"}
                for samples in (detector, policy)]
        if all(len(lag) == settings.topic_partitions and not any(lag.values()) for lag in lags) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert all(len(lag) == settings.topic_partitions and not any(lag.values()) for lag in lags), lags
    for _, rule in EXPECTED_FLAGS:
        assert value(detector, "eventlake_fraud_detector_findings_total", rule=rule) >= 1, rule
    assert {ls["rule"] for n, ls, _ in detector if n == "eventlake_fraud_detector_findings_total"} == {
        rule for _, rule in EXPECTED_FLAGS}
    assert value(detector, "eventlake_fraud_detector_state_accounts") >= len(FLAGGED_ACCOUNTS)
    assert value(policy, "eventlake_policy_commands_total") >= len(FLAGGED_ACCOUNTS)
    assert value(policy, "eventlake_policy_events_total") >= len(events)
    shown = "\n".join(metrics.table(settings))
    assert "handler-0 (pid" in shown and "projection (pid" in shown and "eventlake_handler_events_total" in shown
