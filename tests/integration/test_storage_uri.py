"""Tables and checkpoints at a URI (issue 12, storage by URI): with EVENTLAKE_WAREHOUSE_URI and
EVENTLAKE_CHECKPOINTS_URI set to ``file://`` URIs, every component goes through the URI code path (Spark with the
URI, every reader without a JVM through delta-rs' object store, the bookkeeping through ``lakehouse.storage``) and
nothing lands in the local default folders: the projection folds every domain's read models equal to the oracle,
a restart resumes from the checkpoint at the URI, the catalog, status, the suites and the reconciliation, the SQL
path, a rebuild and the maintenance that drops a generation all work there. The same code reaches ``hdfs://`` and
``s3a://`` stores (tests/integration/test_yarn.py runs it on HDFS where the mini cluster is available)."""
from __future__ import annotations

import pytest

import read_models
from event_store import kafka_log
from eventlake.generator import GeneratorConfig, IotGeneratorConfig, SiteGeneratorConfig, generate_site_commands
from eventlake.query import query_duckdb
from expectations.checks import context, verdict
from lakehouse.storage import RemoteLocation
from read_models.catalog import Catalog
from spark_apps.projection import Projection
from spark_apps.rebuild import rebuild
from spark_apps.status import render
from tests.domain_helpers import events_for, events_of, interleaved, iot_events_for
from tests.oracle import assert_matches_oracle, table_rows

pytestmark = pytest.mark.slow
QUIET = dict(log=lambda *_: None)


@pytest.fixture(scope="module")
def at_uri(tmp_path_factory, bootstrap_servers, spark):
    """(settings, events, store folder): a log of every domain projected once into a warehouse at a file:// URI."""
    from lakehouse.settings import Settings

    home = tmp_path_factory.mktemp("uri-home")
    store = tmp_path_factory.mktemp("uri-store")
    settings = Settings.load({"EVENTLAKE_WAREHOUSE_URI": f"file://{store}/warehouse",
                              "EVENTLAKE_CHECKPOINTS_URI": f"file://{store}/checkpoints"}).replace(
        home=home, kafka_bootstrap_servers=bootstrap_servers, topic_prefix="uri-store.", topic_partitions=3)
    assert isinstance(settings.warehouse, RemoteLocation) and isinstance(settings.checkpoints, RemoteLocation)
    events = interleaved(
        events_for(GeneratorConfig(accounts=10, commands=160, seed=21, run_id="uri", late_rate=0.03), flag_every=7),
        iot_events_for(IotGeneratorConfig(devices=8, minutes=10, seed=21, run_id="uri"), flag_every=11),
        events_of(generate_site_commands(SiteGeneratorConfig(sites=2, views=60, minutes=4, seed=21, run_id="uri"))))
    kafka_log.ensure_topics(settings, **QUIET)
    producer = kafka_log.make_producer(settings)
    half = len(events) // 2
    kafka_log.produce_all(producer, settings.events_topic, [(e.aggregate_id, e.to_json()) for e in events[:half]])
    Projection(spark, settings, **QUIET).run_until_caught_up()
    # A second run resumes from the checkpoints at the URI: only the second half is new to it.
    kafka_log.produce_all(producer, settings.events_topic, [(e.aggregate_id, e.to_json()) for e in events[half:]])
    producer.close()
    second = Projection(spark, settings, **QUIET).run_until_caught_up()
    return settings, events, store, second


def test_the_projection_writes_the_oracle_tables_and_its_checkpoints_at_the_uri(spark, at_uri):
    settings, events, store, second = at_uri
    assert 0 < second.input_rows <= len(events) - len(events) // 2  # resumed, not replayed from the start
    assert_matches_oracle(spark, settings, events)
    assert (store / "warehouse" / "event_archive" / "_delta_log").is_dir()
    assert any((store / "checkpoints").iterdir())
    # Nothing in the local defaults: the URI is where everything went.
    assert not (settings.home / "warehouse").exists() and not (settings.home / "checkpoints").exists()


def test_status_the_catalog_the_checks_and_sql_read_the_tables_at_the_uri(at_uri):
    settings, events, _, _ = at_uri
    text = render(settings)
    assert "account_summary" in text and str(settings.warehouse) in text, text
    assert str(Catalog(settings).current("payments").table).startswith(f"{settings.warehouse}/")
    ge = context()
    for name in ("account_summary", "payments", "device_status"):
        v = verdict(settings, name, reconcile=True, ge=ge, data_docs=False)
        assert not v.failed, "\n".join(v.lines())
    _, rows = query_duckdb(settings, "SELECT count(*) FROM payments")
    payments = {e.payload["payment_id"] for e in events if e.event_type in ("PaymentAuthorized", "PaymentDeclined")}
    assert rows[0][0] == len(payments)


def test_a_rebuild_and_maintenance_work_at_the_uri(spark, at_uri):
    settings, events, store, _ = at_uri
    model = read_models.get("account_summary")
    before = table_rows(spark, settings, model)
    outcome = rebuild(spark, settings, "account_summary", by="test", reason="a rebuild at a URI", **QUIET)
    assert outcome.switched and outcome.generation == 2
    current = Catalog(settings).current("account_summary")
    assert str(current.table).startswith(f"{settings.warehouse}/_generations/account_summary/")
    assert table_rows(spark, settings, model) == before
    # Rolling back and dropping the generation left behind deletes its folders at the URI.
    Catalog(settings).rollback("account_summary", by="test", reason="back")
    Catalog(settings).drop("account_summary", 2, by="test", reason="not needed")
    assert not (store / "warehouse" / "_generations" / "account_summary" / "g0002").exists()
    assert table_rows(spark, settings, model) == before


def test_the_fraud_detector_keeps_its_state_and_checkpoint_at_the_uri(spark, at_uri):
    from event_store.envelope import CommandEnvelope
    from spark_apps.fraud_detector import FraudDetector

    settings, _, store, _ = at_uri
    FraudDetector(spark, settings, **QUIET).start(until_caught_up=True).awaitTermination()
    flags = [CommandEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.commands_topic)]
    assert flags and all(c.command_type == "FlagFraud" for c in flags)
    assert any((store / "checkpoints" / "fraud-detector" / "offsets").iterdir())
    assert not (settings.home / "checkpoints").exists()


def test_the_fraud_detector_consumer_keeps_its_state_snapshots_at_the_uri(at_uri):
    from event_store.account.fraud_consumer import FraudConsumer
    from event_store.account.fraud_state import SNAPSHOT_FOLDER

    settings, _, store, _ = at_uri
    first = FraudConsumer(settings, **QUIET).run(until_caught_up=True)
    assert first.observed and first.snapshots
    assert sorted(p.name for p in (store / "checkpoints" / SNAPSHOT_FOLDER).iterdir() if p.name.endswith(".json"))
    import shutil

    from event_store.account.fraud_state import STATE_FOLDER

    shutil.rmtree(settings.home / STATE_FOLDER)  # this machine's state stores lost: the snapshots at the URI remain
    again = FraudConsumer(settings, **QUIET).run(until_caught_up=True)  # from the snapshots at the URI
    assert again.observed == 0 and again.findings == 0
    assert not (settings.home / "checkpoints").exists()
