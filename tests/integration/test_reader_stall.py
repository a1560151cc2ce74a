"""The Python engine's reader after its Kafka consumer goes silent (librdkafka#5153: a consumer by assignment can
stop fetching after a broker restart until it is recreated; the archive's query once stopped there for good while
the read models' went on). A paused consumer is the same silence, made on purpose."""
from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition

from event_store import kafka_log
from python_engine.reader import Reader

pytestmark = pytest.mark.slow


def _publish_in_transactions(settings, count: int, start: int) -> None:
    """``count`` records in transactions of 5: each partition written to ends in a commit marker."""
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = kafka_log.make_producer(settings, transactional_id=f"{settings.topic_prefix}stall-{start}")
    try:
        producer.init_transactions()
        for first in range(start, start + count, 5):
            producer.begin_transaction()
            for n in range(first, min(first + 5, start + count)):
                producer.send(settings.events_topic, key=f"acc-{n % 7}".encode(), value=str(n).encode())
            producer.commit_transaction()
    finally:
        producer.close()


def _read(reader: Reader, want: int, seconds: float, until=None) -> list:
    rows, deadline = [], time.monotonic() + seconds
    while len(rows) < want and time.monotonic() < deadline:
        rows += reader.read(1000, 0.2, until).rows
    return rows


def _silence(reader: Reader) -> None:
    reader.consumer.pause([TopicPartition(reader.settings.events_topic, p) for p in reader.next])


def test_a_silent_consumer_with_records_to_read_is_renewed_and_one_with_none_is_left_alone(settings):
    lines: list[str] = []
    _publish_in_transactions(settings, 30, start=0)
    reader = Reader(settings, "test-stalled-reader", stall_s=1.0, log=lines.append)
    try:
        partitions = reader.partitions()
        reader.seek({p: 0 for p in partitions})
        rows = _read(reader, 30, 30)
        while not reader.caught_up(partitions):
            rows += reader.read(1000, 0.2).rows
        assert len(rows) == 30

        # Idle at the log's end, which is a commit marker past the last record: nothing to read, however long the
        # silence (the marker is not a record waiting), so the consumer is left as it is.
        _silence(reader)
        assert _read(reader, 1, 4.0) == [] and lines == [], lines

        # Records arrive while the consumer stays silent: after the stall time it is renewed and they are read.
        _publish_in_transactions(settings, 20, start=30)
        rows += _read(reader, 20, 60)
        assert len(rows) == 50, f"{len(rows)} of 50 records read; log: {lines}"
        assert len(lines) == 1 and "handed out nothing" in lines[0] and "new consumer" in lines[0], lines
        for p in partitions:  # nothing lost, nothing twice, in offset order
            offsets = [r[1] for r in rows if r[0] == p]
            assert offsets == sorted(set(offsets))
        assert sorted(int(r[3]) for r in rows) == list(range(50))
    finally:
        reader.close()


def test_a_reader_held_back_by_its_bound_is_not_a_stall_but_one_behind_it_is(settings):
    # The archive's reader reads no further than the read models' reader did (``until``).
    lines: list[str] = []
    _publish_in_transactions(settings, 30, start=0)
    reader = Reader(settings, "test-bounded-reader", stall_s=1.0, log=lines.append)
    try:
        partitions = reader.partitions()
        reader.seek({p: 0 for p in partitions})
        time.sleep(1.0)
        until = dict(reader.next)  # held at its own positions: everything past them belongs to a later batch
        assert _read(reader, 1, 4.0, until) == [] and lines == [], lines

        # Silent, and the read models' reader has gone on past records that arrive now: the records held back
        # come first (the consumer had handed them out), then the new ones need a new consumer.
        _silence(reader)
        _publish_in_transactions(settings, 20, start=30)
        rows = _read(reader, 50, 60, until={p: 10_000 for p in partitions})
        assert len(rows) == 50 and len(lines) == 1 and "new consumer" in lines[0], (len(rows), lines)
        assert sorted(int(r[3]) for r in rows) == list(range(50))
    finally:
        reader.close()
