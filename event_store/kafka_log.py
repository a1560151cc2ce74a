"""Kafka plumbing for the log: topic creation with explicit configs, producers and consumers.

Every producer is idempotent with ``acks=all``; every consumer reads ``read_committed``, so an
aborted transaction of the command handler is never seen by anyone.
"""
from __future__ import annotations

import json
import time
from typing import Callable, Iterable, Iterator

import kafka.cluster
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from lakehouse.kafka_security import kafka_python_config
from lakehouse.settings import Settings
from lakehouse.errors import Unavailable

__all__ = ["ensure_topics", "delete_topics", "topic_configs", "topic_partitions", "make_producer", "make_consumer", "read_all",
           "end_offsets", "produce_all", "dead_letter_value", "read_partition", "max_message_bytes", "LogReadStalled"]


class LogReadStalled(Unavailable, RuntimeError):
    """A partition read got no further for a while before its end (typically: the broker does not answer)."""


def surviving_refresh_loop(refresh_loop):
    """``refresh_loop`` (kafka-python's metadata refresh coroutine), restarted when it fails.

    kafka-python 3.0.12's loop awaits a refresh already in flight outside its own ``try``: when the broker is
    away, that refresh fails, the loop ends with a traceback on stderr ("Unhandled exception in task") and the
    client's metadata is never refreshed periodically again. Restarting it keeps a long-lived client (the
    handler's partition reader) current once the broker is back; the failure is what the loop's own ``try``
    would have logged at debug level."""
    async def loop(cluster):
        while True:
            try:
                return await refresh_loop(cluster)
            except KafkaError:
                if cluster.closed:
                    return None

    loop.__wrapped__ = refresh_loop
    return loop


if not hasattr(kafka.cluster.ClusterMetadata._refresh_loop, "__wrapped__"):
    kafka.cluster.ClusterMetadata._refresh_loop = surviving_refresh_loop(kafka.cluster.ClusterMetadata._refresh_loop)

# The commands topic's segments roll at least hourly, and a deleted segment's file goes after 1 s (the broker's
# default keeps it a minute): ``eventlake forget`` deletes the handled commands (event_store.command_purge).
COMMANDS_SEGMENT_MS = 3600 * 1000
COMMANDS_FILE_DELETE_DELAY_MS = 1000

# Append-only log: never deleted by time or size, never compacted.
_UNLIMITED = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}


def topic_configs(settings: Settings) -> dict[str, dict[str, str]]:
    """Every topic eventlake uses, with its explicit configuration."""
    durable = {} if settings.min_insync_replicas is None else {"min.insync.replicas": str(settings.min_insync_replicas)}
    return {
        settings.commands_topic: {"retention.ms": str(7 * 24 * 3600 * 1000), "cleanup.policy": "delete",
                                  "segment.ms": str(COMMANDS_SEGMENT_MS),
                                  "file.delete.delay.ms": str(COMMANDS_FILE_DELETE_DELAY_MS), **durable},
        settings.events_topic: {**_UNLIMITED, **durable},
        settings.results_topic: {"retention.ms": str(7 * 24 * 3600 * 1000), "cleanup.policy": "delete", **durable},
        settings.dead_letters_topic: {**_UNLIMITED, **durable},
        # The handler's snapshots: only the latest value per key matters (see event_store.snapshots).
        settings.snapshots_topic: {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1",
                                   "segment.ms": str(600 * 1000), **durable},
        # The subjects' keys and tombstones (event_store.keys_topic): a forgotten subject's key must leave the
        # segments, so compaction is due within keys_topic_compaction_lag_ms of its tombstone; a tombstone is a
        # value of its own (never null), which compaction keeps.
        settings.keys_topic: {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
                              "max.compaction.lag.ms": str(settings.keys_topic_compaction_lag_ms),
                              "segment.ms": str(settings.keys_topic_compaction_lag_ms), **durable},
    }


def topic_partitions(settings: Settings, topic: str) -> int:
    """How many partitions ``topic`` has: the keys topic one (its order decides which key a subject has), the
    others ``topic_partitions``."""
    return 1 if topic == settings.keys_topic else settings.topic_partitions


def admin(settings: Settings) -> KafkaAdminClient:
    return KafkaAdminClient(**kafka_python_config(settings), client_id="eventlake-admin")


def ensure_topics(settings: Settings, log=print) -> list[str]:
    """Create missing topics (partitions and replication from settings); returns the names created."""
    client = admin(settings)
    try:
        existing = set(client.list_topics())
        wanted = topic_configs(settings)
        replicas = settings.replication_factor
        new = [NewTopic(name, topic_partitions(settings, name), -1 if replicas is None else replicas,
                        topic_configs=cfg)
               for name, cfg in wanted.items() if name not in existing]
        created = []
        if new:
            try:
                client.create_topics(new, wait_for_metadata=True)
            except TopicAlreadyExistsError:
                pass  # a concurrent creator won; the topic is there, which is all we need
            created = [t.name for t in new]
            log(f"kafka: created topics {', '.join(created)} ({settings.topic_partitions} partitions (the keys topic 1), "
                f"replication {replicas or 'the cluster default'})")
        return created
    finally:
        client.close()


def delete_topics(settings: Settings, prefix: str, timeout_s: float = 60.0) -> list[str]:
    """Delete every topic whose name starts with ``prefix`` (a benchmark's scratch topics); returns the names.

    A prefix is required: an empty one would name every topic of the cluster."""
    if not prefix:
        raise ValueError("delete_topics: an empty prefix would delete every topic of the cluster")
    client = admin(settings)
    try:
        doomed = sorted(t for t in client.list_topics() if t.startswith(prefix))
        if doomed:
            client.delete_topics(doomed, timeout_ms=int(timeout_s * 1000))
        return doomed
    finally:
        client.close()


def max_message_bytes(settings: Settings, topics: Iterable[str], timeout_s: float = 30.0) -> dict[str, int]:
    """Each topic's ``max.message.bytes`` as the broker reports it (the most a record batch may take)."""
    from confluent_kafka.admin import ConfigResource

    from event_store.kafka_clients import admin_client

    client = admin_client(settings)
    futures = client.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics],
                                      request_timeout=timeout_s)
    return {resource.name: int(future.result(timeout=timeout_s)["max.message.bytes"].value)
            for resource, future in futures.items()}


def make_producer(settings: Settings, transactional_id: str | None = None, **overrides) -> KafkaProducer:
    config = dict(**kafka_python_config(settings), acks="all", enable_idempotence=True,
                  linger_ms=5, batch_size=256 * 1024, compression_type=None, allow_auto_create_topics=False,
                  transactional_id=transactional_id)
    config.update(overrides)
    return KafkaProducer(**config)


def make_consumer(settings: Settings, *topics: str, group_id: str | None = None, **overrides) -> KafkaConsumer:
    config = dict(**kafka_python_config(settings), group_id=group_id,
                  isolation_level="read_committed", enable_auto_commit=False, auto_offset_reset="earliest",
                  max_poll_records=2000, fetch_max_bytes=16 * 1024 * 1024)
    config.update(overrides)
    return KafkaConsumer(*topics, **config)


def end_offsets(settings: Settings, topic: str) -> dict[TopicPartition, int]:
    """The last stable offset per partition (what a read_committed reader can reach)."""
    consumer = make_consumer(settings)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        return consumer.end_offsets(partitions) if partitions else {}
    finally:
        consumer.close()


def read_all(settings: Settings, topic: str, idle_timeout_s: float = 2.0) -> Iterator:
    """Every committed record of ``topic`` from the beginning up to its current end, partition by partition."""
    consumer = make_consumer(settings)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not partitions:
            return
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        remaining = {tp for tp in partitions if ends[tp] > consumer.position(tp)}
        last_progress = time.monotonic()
        while remaining:
            batch = consumer.poll(timeout_ms=500, max_records=5000)
            for tp, records in batch.items():
                yield from records
            if batch:
                last_progress = time.monotonic()
            for tp in list(remaining):
                if consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
            if remaining and time.monotonic() - last_progress > idle_timeout_s:
                # Control records (transaction markers) occupy offsets but carry no data.
                break
    finally:
        consumer.close()


def read_partition(consumer: KafkaConsumer, tp: TopicPartition, start: int, end: int | None = None,
                   idle_timeout_s: float = 5.0, tick: Callable[[], None] | None = None) -> Iterator:
    """Committed records of one partition from ``start`` up to ``end`` (default: its last stable offset).

    ``consumer`` is a read_committed consumer without a group; it is (re)assigned to ``tp`` only. ``tick`` is
    called between polls (a long read must not starve its caller: stop requests, a consumer group's liveness).
    Raises LogReadStalled when the read gets no further for ``idle_timeout_s`` before ``end``: a partial read
    is never passed off as a whole one.
    """
    consumer.assign([tp])
    if end is None:
        end = consumer.end_offsets([tp])[tp]
    if start >= end:
        return
    consumer.seek(tp, start)
    last_progress = time.monotonic()
    last_position = start
    while (position := consumer.position(tp)) < end:
        if tick is not None:
            tick()
        batch = consumer.poll(timeout_ms=50, max_records=10_000)
        records = batch.get(tp, ())
        for record in records:
            if record.offset >= end:
                return
            yield record
        # The position also moves over transaction markers and aborted records, which yield nothing.
        if records or position != last_position:
            last_progress, last_position = time.monotonic(), position
        elif time.monotonic() - last_progress > idle_timeout_s:
            raise LogReadStalled(f"reading {tp.topic}/{tp.partition} got no further than offset {position} for "
                                 f"{idle_timeout_s:.0f}s (reading up to {end}); is the broker away?")


def produce_all(producer: KafkaProducer, topic: str, records: Iterable[tuple[str, bytes]]) -> int:
    """Send (key, value) records and wait until every one is acknowledged; returns the count."""
    futures = [producer.send(topic, key=key.encode(), value=value) for key, value in records]
    producer.flush()
    for f in futures:
        f.get(timeout=60)  # raises if any record failed
    return len(futures)


def dead_letter_value(reason: str, raw: bytes | None, topic: str, partition: int, offset: int,
                      max_bytes: int | None = None) -> bytes:
    """The dead-letter record: the reason, where the original came from, and its exact bytes.

    With ``max_bytes`` (what one record may take in the dead-letter topic), an original too big to be quoted
    in full keeps only its first bytes, flagged with ``original_truncated`` and its ``original_size``: the
    original stays where it came from (``source_*``)."""
    record = {"reason": reason, "source_topic": topic, "source_partition": partition, "source_offset": offset,
              "original_value": None if raw is None else raw.decode("utf-8", errors="backslashreplace"),
              "original_value_hex": None if raw is None else raw.hex(),
              "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    value = json.dumps(record).encode()
    if max_bytes is None or raw is None or len(value) <= max_bytes:
        return value
    # The text form takes up to 6 bytes of JSON per original byte (escapes), the hex form 2: keep some hex.
    record.update(original_value=None, original_value_hex="", original_truncated=True, original_size=len(raw))
    if len(reason) > max_bytes // 8:  # a reason may quote the value it rejects
        record["reason"] = reason[:max_bytes // 8] + "... (truncated)"
    keep = max(0, (max_bytes - len(json.dumps(record).encode())) // 2)
    record["original_value_hex"] = raw[:keep].hex()
    return json.dumps(record).encode()
