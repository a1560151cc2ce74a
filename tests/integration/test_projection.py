"""The account_summary projection on the real broker and real Spark + Delta.

The oracle is the plain-Python fold of the same events (read_models.account_summary.python_fold).
"""
import random
import time

import pytest

from event_store import kafka_log
from eventlake.generator import GeneratorConfig
from read_models.account_summary import MODEL
from spark_apps.projection import DEAD_LETTER_TABLE, Projection
from tests.domain_helpers import events_for

pytestmark = pytest.mark.slow

CFG = GeneratorConfig(accounts=40, commands=500, seed=5, run_id="proj")


def publish(settings, values):
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = kafka_log.make_producer(settings)
    try:
        kafka_log.produce_all(producer, settings.events_topic, values)
    finally:
        producer.close()


def table(spark, settings, name="account_summary"):
    rows = spark.read.format("delta").load(str(settings.table_path(name))).collect()
    return {r["account_id"]: r.asDict() for r in rows}


def project(spark, settings, **kw):
    return Projection(spark, settings, [MODEL], log=lambda *_: None).run_until_caught_up(**kw)


def test_duplicates_and_reordering_give_the_same_table_as_one_clean_pass(spark, settings, tmp_path):
    events = events_for(CFG)
    expected = MODEL.python_fold(events)

    clean = settings.replace(topic_prefix=settings.topic_prefix + "clean.", home=tmp_path / "clean")
    publish(clean, [(e.aggregate_id, e.to_json()) for e in events])
    project(spark, clean)
    assert table(spark, clean) == expected

    messy = settings.replace(topic_prefix=settings.topic_prefix + "messy.", home=tmp_path / "messy")
    records = [(e.aggregate_id, e.to_json()) for e in events] * 2
    random.Random(1).shuffle(records)  # later versions of an account now often come before earlier ones
    records.insert(len(records) // 2, ("acc-proj-00001", b"{this is not an event"))
    publish(messy, records)
    run = project(spark, messy, max_offsets_per_trigger=300)
    assert run.batches >= 3  # the disorder really spans batches
    assert table(spark, messy) == expected
    pending = spark.read.format("delta").load(str(messy.table_path("_pending/account_summary")))
    assert pending.count() == 0
    dead = spark.read.format("delta").load(str(messy.table_path(DEAD_LETTER_TABLE))).collect()
    assert len(dead) == 1
    assert dead[0]["raw_value"] == "{this is not an event" and "not an event envelope" in dead[0]["reason"]
    assert dead[0]["kafka_topic"] == messy.events_topic and dead[0]["kafka_offset"] >= 0


def test_stopping_mid_stream_and_restarting_from_the_checkpoint_gives_the_same_table(spark, settings):
    events = events_for(CFG)
    expected = MODEL.python_fold(events)
    publish(settings, [(e.aggregate_id, e.to_json()) for e in events])

    projection = Projection(spark, settings.replace(trigger_interval="1 second"), [MODEL], log=lambda *_: None)
    query = projection.start(max_offsets_per_trigger=150)
    deadline = time.monotonic() + 180
    while (query.lastProgress is None or query.lastProgress["batchId"] < 1) and time.monotonic() < deadline:
        assert query.exception() is None
        time.sleep(0.5)
    query.stop()
    partial = table(spark, settings)
    applied = sum(r["version"] for r in partial.values())
    assert 0 < applied < len(events), "the first run should have stopped part-way"

    project(spark, settings)
    assert table(spark, settings) == expected

    # Once caught up, running again finds nothing to do and changes nothing.
    from delta.tables import DeltaTable
    version = DeltaTable.forPath(spark, str(settings.table_path("account_summary"))).history(1).collect()[0]["version"]
    assert project(spark, settings).input_rows == 0
    assert DeltaTable.forPath(spark, str(settings.table_path("account_summary"))).history(1).collect()[0]["version"] \
        == version
