"""The device and site domains from commands to SQL, with no code of theirs outside their own folders: the real
command handler decides their commands next to an account's, the generic projection folds every read model,
the tables equal their oracles, the suites and the reconciliation pass, a rebuild of each new model gives the
same table, and `eventlake query` / `status` see them."""
from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest

import read_models
from event_store import kafka_log
from event_store.envelope import CommandResult, EventEnvelope
from event_store.handler import CommandHandler
from eventlake.generator import (GeneratorConfig, IotGeneratorConfig, SiteGeneratorConfig, dated, generate_commands,
                                 generate_iot_commands, generate_site_commands)
from eventlake.query import query_duckdb
from expectations.checks import context, verdict
from read_models.spec import WINDOWED_SUM
from spark_apps.detector_app import DetectorFigures
from spark_apps.rebuild import rebuild
from spark_apps.status import render
from spark_apps.telemetry_detector import TelemetryDetector
from tests.domain_helpers import interleaved
from tests.oracle import assert_matches_oracle, table_rows
from tests.projecting import project_in_python

pytestmark = pytest.mark.slow
QUIET = dict(log=lambda *_: None)
NEW_MODELS = ("device_status", "device_minute_readings", "telemetry_anomalies", "page_minute_clicks")


@pytest.fixture(scope="module")
def three_domains(tmp_path_factory, bootstrap_servers, spark):
    """One log of accounts, devices and sites, handled and projected once for the tests of this module."""
    from lakehouse.settings import Settings

    settings = Settings.load({}).replace(home=tmp_path_factory.mktemp("three-domains"),
                                         kafka_bootstrap_servers=bootstrap_servers, topic_prefix="e2e-domains.",
                                         topic_partitions=3, handler_group_id="e2e-domains-handler")
    start = datetime.now(timezone.utc) - timedelta(minutes=40)
    # 30 minutes of readings: the silent device's deadline (half-way plus its heartbeat) falls behind the
    # detector's watermark (the newest reading less 10 minutes), so its timer fires.
    iot = list(generate_iot_commands(IotGeneratorConfig(devices=12, minutes=30, seed=3, run_id="e2e", start=start,
                                                        late_rate=0.05)))
    site = list(generate_site_commands(SiteGeneratorConfig(sites=3, views=400, minutes=12, seed=3, run_id="e2e",
                                                           start=start, late_rate=0.05)))
    accounts = list(generate_commands(dated(GeneratorConfig(accounts=10, commands=150, seed=3, run_id="e2e"),
                                            now=datetime.now(timezone.utc))))
    kafka_log.ensure_topics(settings, **QUIET)
    producer = kafka_log.make_producer(settings)
    try:
        kafka_log.produce_all(producer, settings.commands_topic, interleaved(iot, site, accounts))
    finally:
        producer.close()
    with CommandHandler(settings, **QUIET) as handler:
        handler.run(until_caught_up=True)
    # The device domain's detector flags what the generator made to be flagged; the handler records the flags.
    written = sum(1 for _ in kafka_log.read_all(settings, settings.events_topic))
    query = TelemetryDetector(spark, settings, **QUIET).start(until_caught_up=True)
    query.awaitTermination()
    detector = DetectorFigures(settings.events_topic)  # what `eventlake detect-anomalies` serves as metrics
    detector.observe(query.recentProgress)
    with CommandHandler(settings, **QUIET) as handler:
        handler.run(until_caught_up=True)
    events = [EventEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.events_topic)]
    results = [CommandResult.from_json(r.value) for r in kafka_log.read_all(settings, settings.results_topic)]
    # The projection's engines have their own tests (tests/projecting.py): the Python engine makes the tables, in
    # one batch (the cheapest; smaller batches share the log among partitions as Spark's do, see
    # test_python_projection's test_a_limited_batch_reads_every_partition_in_proportion_to_its_lag).
    run = project_in_python(spark, settings)
    return settings, events, results, run, (detector, written)


def test_the_handler_decides_every_domains_commands_with_their_reasons(three_domains):
    _, events, results, _, _ = three_domains
    assert Counter(e.aggregate_type for e in events).keys() == {"account", "device", "site"}
    rejected = Counter(r.error_type for r in results if r.status == "rejected")
    # The generators' deliberate cases (IotGeneratorConfig and SiteGeneratorConfig defaults).
    assert rejected["DeviceNotFound"] == 3 and rejected["UnitMismatch"] == 3
    assert rejected["DeviceNotActive"] == 2 and rejected["DeviceAlreadyRegistered"] == 1
    assert rejected["SiteNotFound"] == 2 and rejected["SiteNotActive"] == 1


def test_the_telemetry_detector_flags_each_deliberate_case_once(three_domains):
    """IotGeneratorConfig's defaults: 3 out-of-range runs of 3 to 5 readings (a run of 2 is not flagged) and one
    device that goes silent half-way (a decommissioned device is never silent)."""
    settings = three_domains[0]
    _, rows = query_duckdb(settings, "SELECT rule, count(*), count(DISTINCT device_id) FROM telemetry_anomalies "
                                     "GROUP BY rule ORDER BY rule")
    assert rows == [("out_of_range_run", 3, 3), ("silent_device", 1, 1)]
    # Its metrics (spark_apps.detector_app.DetectorFigures, from its query's progress reports): every events record
    # read, each finding written once, nothing left past it.
    detector, written = three_domains[4]
    samples = {(s.name, tuple(s.labels.items())): s.value for s in detector.samples()}
    assert samples[("detector_events", ())] == written and samples[("detector_findings", ())] == 4, samples
    assert samples[("detector_batches", ())] >= 1
    assert [v for (name, _), v in samples.items() if name == "consumer_lag_records"] == [0] * settings.topic_partitions


def test_every_read_model_equals_its_oracle_across_the_three_domains(spark, three_domains):
    settings, events, _, run, _ = three_domains
    assert run.input_rows == len(events)  # the domains' events mixed in one log
    assert_matches_oracle(spark, settings, events)
    for name in NEW_MODELS:
        assert table_rows(spark, settings, read_models.get(name)), f"{name} is empty"


def test_the_suites_and_the_reconciliation_pass_on_the_new_tables(three_domains):
    settings = three_domains[0]
    ge = context()
    for name in NEW_MODELS:
        v = verdict(settings, name, reconcile=True, ge=ge, data_docs=False)
        assert not v.failed, "\n".join(v.lines())


def test_sql_and_status_see_the_new_tables(three_domains):
    settings, events, _, _, _ = three_domains
    readings = sum(e.event_type == "ReadingRecorded" for e in events)
    cols, rows = query_duckdb(settings, "SELECT sum(readings) AS readings, count(DISTINCT device_id) AS devices "
                                        "FROM device_minute_readings")
    late = query_duckdb(settings, "SELECT count(*) FROM late_events WHERE read_model = 'device_minute_readings'")[1]
    assert rows[0][0] + late[0][0] == readings and rows[0][1] == 12
    views = sum(e.event_type == "PageViewed" for e in events)
    _, rows = query_duckdb(settings, "SELECT sum(views) FROM page_minute_clicks")
    late = query_duckdb(settings, "SELECT count(*) FROM late_events WHERE read_model = 'page_minute_clicks'")[1]
    assert rows[0][0] + late[0][0] == views
    _, rows = query_duckdb(settings, "SELECT status, count(*) FROM device_status GROUP BY status ORDER BY status")
    assert dict(rows) == {"active": 10, "decommissioned": 2}
    text = render(settings)
    for name in NEW_MODELS:
        assert name in text, text


@pytest.mark.parametrize("name", ["device_status", "device_minute_readings", "page_minute_clicks"])
def test_a_rebuild_of_a_new_model_gives_the_same_table(spark, three_domains, name):
    settings = three_domains[0]
    model = read_models.get(name)
    before = table_rows(spark, settings, model)
    outcome = rebuild(spark, settings, name, by="test", reason="the generic rebuild on a new domain", **QUIET)
    assert outcome.switched and outcome.generation == 2
    # A windowed model's new generation folds the late events into their windows too (the oracle, below).
    if model.merge_strategy != WINDOWED_SUM:
        assert table_rows(spark, settings, model) == before
    assert_matches_oracle(spark, settings, three_domains[1], [model])
