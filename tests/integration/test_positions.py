"""Positions at a transaction marker (issue 47): a log whose last records came from a transactional producer ends
one offset past a commit marker, not past a record. A caught-up projection shows no lag in ``eventlake status`` and
the reconciliation does not wait for the archive to reach a table position that lies past the marker."""
from __future__ import annotations

import pytest

import read_models
from event_store import kafka_log
from eventlake.generator import GeneratorConfig
from expectations.reconciliation import archive_end, reconcile, table_position
from projection_core import positions
from python_engine.run import PythonProjection
from read_models.catalog import Catalog
from spark_apps.spark_projection import Projection
from spark_apps.status import projection_statuses, render
from tests.domain_helpers import events_for

pytestmark = pytest.mark.slow


def _publish_in_transactions(settings, events, per_transaction: int) -> None:
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = kafka_log.make_producer(settings, transactional_id=f"{settings.topic_prefix}positions")
    try:
        producer.init_transactions()
        for start in range(0, len(events), per_transaction):
            producer.begin_transaction()
            for e in events[start:start + per_transaction]:
                producer.send(settings.events_topic, key=e.aggregate_id.encode(), value=e.to_json())
            producer.commit_transaction()
    finally:
        producer.close()


def test_an_idle_log_ending_in_a_transaction_marker_is_caught_up(spark, settings):
    events = events_for(GeneratorConfig(accounts=6, commands=40, seed=47, run_id="pos"))
    _publish_in_transactions(settings, events, per_transaction=15)
    stable = {tp.partition: o for tp, o in kafka_log.end_offsets(settings, settings.events_topic).items()}
    ends = positions.record_ends(settings)
    # Each partition written to ends in a commit marker: the record end is one short of the stable end.
    assert any(ends.values()) and all(stable[p] == end + 1 for p, end in ends.items() if end), (stable, ends)

    model = read_models.get("account_summary")
    # The read model by Spark's query (its batches end at the stable offset, past the marker), the archive by the
    # Python engine (its batches end after the last record read): the positions of the issue.
    Projection(spark, settings, [model], log=lambda *_: None, archive=False).run_until_caught_up()
    PythonProjection(settings, [], archive=True, log=lambda *_: None).run_until_caught_up()
    table_end, _ = table_position(settings, Catalog(settings).current(model.name))
    assert table_end != archive_end(settings) and positions.behind(archive_end(settings), table_end)

    statuses = projection_statuses(settings, sum(ends.values()), ends)
    assert len(statuses) == 2 and all(s.lag == 0 for s in statuses), statuses
    assert "lag 1 events" not in render(settings) and render(settings).count("lag 0 events") == 2
    result = reconcile(settings, model.name)
    assert result.success and result.differences == 0, result.lines()


def test_the_lag_exporter_tells_how_long_the_oldest_waiting_record_has_waited(settings):
    """``eventlake lag-exporter``'s lag in seconds by partition: the Kafka timestamp of the first record past a
    committed position (one past a transaction marker: the next transaction's first record), 0 where none waits,
    read once while the position stays."""
    import time

    from eventlake.lag_exporter import Position, Snapshot, WaitingSince, figures, with_waiting_since

    settings = settings.replace(topic_partitions=1)
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    topic = settings.events_topic
    producer = kafka_log.make_producer(settings, transactional_id=f"{settings.topic_prefix}waiting")
    hour_ago = int(time.time() * 1000) - 3_600_000
    try:
        producer.init_transactions()
        for start in (0, 3):  # two transactions of 3 records, a minute apart: offsets 0-2, marker 3, 4-6, marker 7
            producer.begin_transaction()
            for i in range(start, start + 3):
                producer.send(topic, key=b"k", value=b"{}", partition=0, timestamp_ms=hour_ago + i * 60_000)
            producer.commit_transaction()
    finally:
        producer.close()
    ends = {topic: positions.record_ends(settings, topic)}
    assert ends == {topic: {0: 7}}
    logged = []
    waiting = WaitingSince(settings, logged.append)
    try:
        at = [Position(name, "group", topic, {0: offset}) for name, offset in
              (("from-start", 0), ("mid-first", 2), ("at-marker", 3), ("read-all", 7))]
        found = {p.consumer: p.waiting_since for p in with_waiting_since(at, ends, waiting)}
        assert found == {"from-start": {0: (hour_ago) / 1000}, "mid-first": {0: (hour_ago + 120_000) / 1000},
                         "at-marker": {0: (hour_ago + 180_000) / 1000}, "read-all": {}}
        assert not logged
        refreshed = time.time()
        lag_s = {s.labels["consumer"]: s.value for s in figures(Snapshot(
            with_waiting_since(at, ends, waiting), ends, refreshed_at=refreshed)) if s.name == "committed_lag_seconds"}
        assert lag_s == {"from-start": refreshed - hour_ago / 1000, "mid-first": refreshed - (hour_ago + 120_000) / 1000,
                         "at-marker": refreshed - (hour_ago + 180_000) / 1000, "read-all": 0.0}
    finally:
        for consumer in waiting.detach():
            consumer.close()

    # A read that gets nothing in time (here: no time at all) drops its consumer, so the next refresh asks a new
    # one (a consumer by assignment can stay silent after a broker restart until recreated: librdkafka#5153).
    impatient = WaitingSince(settings, logged.append, timeout_s=0.0)
    assert impatient.read({(topic, 0, 4)}) == {}
    assert "no record within 0 s" in logged[-1] and impatient.detach() == []
    impatient.timeout_s = 10.0
    try:
        assert impatient.read({(topic, 0, 4)}) == {(topic, 0, 4): (hour_ago + 180_000) / 1000}
    finally:
        for consumer in impatient.detach():
            consumer.close()
