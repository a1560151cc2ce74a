"""Every librdkafka (confluent-kafka) client eventlake makes, and the one way it produces a record.

The command handler's transactional producer and group consumer, the fraud policy's group reader, the projection's
range reader (its Python engine), the bulk producer (the client's and the policy's) and the admin client are built
here, so their configuration (idempotence, ``acks=all``, ``read_committed``, the murmur2 partitioner of the Java
client) is written once. ``produce`` and ``produce_records`` own the retry for a full
local queue (``BufferError``): let librdkafka drain it, then try once more. ``RecordSender`` is the process
managers' send-until-delivered loop (the fraud policy's and the fraud detector's), ``close_within`` their bounded
close of a consumer (``close_all_within`` of several side by side), ``take`` every consumer's read of what has
arrived, ``RejoinWatch`` every group consumer's check that it joined its group again after losing its session.

The kafka-python clients (``make_producer``, ``make_consumer``, the admin that creates topics) live in
``event_store.kafka_log``.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

import confluent_kafka
from confluent_kafka.admin import AdminClient

from lakehouse.kafka_security import confluent_config
from lakehouse.settings import Settings

__all__ = ["transactional_producer_config", "new_producer", "group_consumer", "group_reader", "range_reader",
           "offsets_reader", "peek_reader", "bulk_producer", "keys_reader", "keys_writer", "admin_client", "access_probe", "produce", "produce_records", "RecordSender",
           "close_within", "close_all_within", "take", "PREFETCH", "REJOIN_WAIT_S", "RejoinWatch", "LagWatch"]

# After its group session was lost (e.g. the broker restarted), a consumer is assigned partitions again within a
# few heartbeats. librdkafka (2.16, cooperative-sticky) sometimes never rejoins: seen in
# tests/integration/test_services_broker_restart.py, the handler (static membership) and later the fraud detector
# and the policy (dynamic members) were assigned nothing for minutes while polled. A consumer assigned nothing
# this long after such a loss is replaced by a new one in the same group (``RejoinWatch``).
REJOIN_WAIT_S = 30.0


def transactional_producer_config(settings: Settings, transactional_id: str, *, batch_bytes: int,
                                  message_max_bytes: int, transaction_timeout_ms: int) -> dict:
    """The command handler's producer: idempotent, ``acks=all``, transactional under ``transactional_id``.

    A config (not a producer) because a producer that hit a fatal error is replaced by a new one made from the
    same config (``new_producer``)."""
    return {
        **confluent_config(settings), "transactional.id": transactional_id,
        "enable.idempotence": True, "acks": "all", "linger.ms": 20, "batch.size": batch_bytes,
        "message.max.bytes": message_max_bytes,
        "transaction.timeout.ms": transaction_timeout_ms, "queue.buffering.max.messages": 1_000_000}


def new_producer(config: dict) -> confluent_kafka.Producer:
    """A producer made from ``config`` (e.g. ``transactional_producer_config``)."""
    return confluent_kafka.Producer(config)


def aborting_producer(settings: Settings, transactional_id: str) -> confluent_kafka.Producer:
    """A transactional producer whose transactions are aborted (``event_store.command_purge``: a record appended only
    to roll a partition's segment, which no ``read_committed`` reader sees)."""
    return confluent_kafka.Producer({**confluent_config(settings), "transactional.id": transactional_id,
                                     "enable.idempotence": True, "acks": "all", "linger.ms": 0})


# What a long-running group member fetches ahead of its polls. librdkafka's defaults (100,000 messages or 64 MB)
# let a service behind the log hold up to 64 MB more than one that keeps up: in a soak its memory then followed
# the backlog's bursts. 16 MB is ~30,000 events or ~50,000 commands, many batches ahead of the largest poll.
PREFETCH = {"queued.max.messages.kbytes": 16 * 1024, "queued.min.messages": 20_000}


def group_consumer(settings: Settings, group_id: str, instance_id: str, max_poll_interval_ms: int
                   ) -> confluent_kafka.Consumer:
    """A ``read_committed`` consumer in ``group_id`` with static membership (``group.instance.id``), so a
    restarted instance takes its partitions back without waiting for a session timeout. Offsets are committed
    by the caller (in its transactions), never automatically."""
    return confluent_kafka.Consumer({
        **confluent_config(settings), "group.id": group_id,
        "group.instance.id": instance_id, "isolation.level": "read_committed",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky", "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 2_000, "max.poll.interval.ms": max_poll_interval_ms,
        "topic.metadata.refresh.interval.ms": 10_000, **PREFETCH})


def group_reader(settings: Settings, group_id: str, on_error: Callable | None = None) -> confluent_kafka.Consumer:
    """A ``read_committed`` consumer in ``group_id`` for a process manager (e.g. the fraud policy): offsets
    committed by the caller only, from the log's start when the group has none, and a ``_PARTITION_EOF`` message
    when it reaches the end of a partition (so it can tell it is caught up). ``on_error(KafkaError)`` gets the
    client-level errors (e.g. every broker away), which librdkafka retries by itself."""
    config = {
        **confluent_config(settings), "group.id": group_id, "isolation.level": "read_committed",
        "enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": True,
        "partition.assignment.strategy": "cooperative-sticky", "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 2_000, "topic.metadata.refresh.interval.ms": 10_000, **PREFETCH}
    if on_error is not None:
        config["error_cb"] = on_error
    return confluent_kafka.Consumer(config)


def range_reader(settings: Settings, name: str) -> confluent_kafka.Consumer:
    """A ``read_committed`` consumer that reads partitions it is assigned from offsets it is given (no group
    membership, nothing committed): the projection's Python engine, which keeps its positions in its checkpoints.
    A position the log no longer holds is an error (``auto.offset.reset=error``), never a silent jump; a
    ``_PARTITION_EOF`` message says a partition is read to its end."""
    return confluent_kafka.Consumer({
        **confluent_config(settings), "group.id": f"eventlake-{name}-unused", "isolation.level": "read_committed",
        "enable.auto.commit": False, "auto.offset.reset": "error", "enable.partition.eof": True,
        "topic.metadata.refresh.interval.ms": 10_000, "fetch.wait.max.ms": 20})


def offsets_reader(settings: Settings, group_id: str) -> confluent_kafka.Consumer:
    """A consumer in ``group_id``'s name that only asks the group's committed offsets (``committed()``): it never
    subscribes, so it joins no group and takes no partition from its members."""
    return confluent_kafka.Consumer({**confluent_config(settings), "group.id": group_id,
                                     "enable.auto.commit": False, "enable.auto.offset.store": False})


def peek_reader(settings: Settings, name: str) -> confluent_kafka.Consumer:
    """A ``read_committed`` consumer that reads one record where it is assigned (no group membership, nothing
    committed), fetching little ahead: the lag exporter's look at the oldest record waiting past a position. A
    position the log no longer holds reads from the log's start (the oldest record it still holds); a
    ``_PARTITION_EOF`` message says nothing is there."""
    return confluent_kafka.Consumer({
        **confluent_config(settings), "group.id": f"eventlake-{name}-unused", "isolation.level": "read_committed",
        "enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": True,
        "queued.min.messages": 1, "fetch.wait.max.ms": 20})


def bulk_producer(settings: Settings, on_failed_delivery: Callable) -> confluent_kafka.Producer:
    """A fast producer for many records: idempotent, ``acks=all``, and the same partition for a key as
    kafka-python's producer (murmur2, like the Java client). ``on_failed_delivery(error, message)`` is called
    for failed records only."""
    return confluent_kafka.Producer({
        **confluent_config(settings), "enable.idempotence": True, "acks": "all",
        "partitioner": "murmur2_random", "linger.ms": 5, "batch.size": 1024 * 1024,
        "queue.buffering.max.messages": 1_000_000, "delivery.report.only.error": True,
        "on_delivery": on_failed_delivery})


def access_probe(settings: Settings, on_error: Callable, logger) -> confluent_kafka.Producer:
    """A client that only asks for metadata (``event_store.kafka_access.check_access``): its errors go to
    ``on_error``, librdkafka's log lines to ``logger`` (not stderr), and it retries a closed connection soon."""
    return confluent_kafka.Producer({**confluent_config(settings), "error_cb": on_error, "logger": logger,
                                     "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500})


def keys_reader(settings: Settings, logger) -> confluent_kafka.Consumer:
    """The keys topic's reader (``event_store.keys_topic``): assigned the topic's one partition from a position it
    is given (no group membership, nothing committed), ``read_committed``; librdkafka's log lines to ``logger``
    (the topic's owner says once that the broker is away, not every reconnect). It stays assigned between reads:
    its fetches wait at the broker up to 500 ms for a record (one returns as soon as a key is written), so an idle
    reader costs two requests a second, not a hundred."""
    return confluent_kafka.Consumer({
        **confluent_config(settings), "group.id": "eventlake-subject-keys-unused", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "isolation.level": "read_committed", "fetch.wait.max.ms": 500,
        "logger": logger})


def keys_writer(settings: Settings, logger) -> confluent_kafka.Producer:
    """The keys topic's writer: idempotent, ``acks=all``, nothing lingers (a key is awaited before a commit)."""
    return confluent_kafka.Producer({**confluent_config(settings), "enable.idempotence": True, "acks": "all",
                                     "linger.ms": 0, "logger": logger})


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient(confluent_config(settings))


def produce(producer: confluent_kafka.Producer, topic: str, value: bytes | None, key: bytes | None = None,
            partition: int | None = None, on_delivery: Callable | None = None) -> None:
    """Produce one record (to ``partition``, else by the producer's partitioner), retrying once after the
    local queue drained when it is full."""
    kwargs = {} if partition is None else {"partition": partition}
    if on_delivery is not None:
        kwargs["on_delivery"] = on_delivery
    try:
        producer.produce(topic, value, key, **kwargs)
    except BufferError:
        _drain_and_produce(producer, topic, value, key, **kwargs)


def produce_records(producer: confluent_kafka.Producer, topic: str, records: Sequence[tuple[bytes, bytes]],
                    partition: int, on_last_delivered: Callable | None = None) -> None:
    """Produce (key, value) ``records`` in order to ``topic``/``partition``. Only the last asks for a delivery
    report (``on_last_delivered``): a report per record costs, and its offset tells where the batch ended."""
    if not records:
        return
    send = producer.produce
    last = len(records) - 1
    for i, (key, value) in enumerate(records):
        on_delivery = on_last_delivered if i == last else None
        try:
            send(topic, value, key, partition, on_delivery)
        except BufferError:
            _drain_and_produce(producer, topic, value, key, partition=partition, on_delivery=on_delivery)


def _drain_and_produce(producer: confluent_kafka.Producer, topic: str, value, key, **kwargs) -> None:
    """The local queue is full: let it drain (serving delivery reports), then produce once more."""
    producer.poll(1)
    producer.produce(topic, value, key, **kwargs)


class RecordSender:
    """A process manager's way to send records (the fraud policy's FreezeAccount, the fraud detector's FlagFraud):
    ``send`` returns once the broker has taken every record, sending again what failed (a broker away and back),
    or returns False as soon as ``stopping`` is set. Records sent again carry the same ids (the caller's), which
    the handler answers as duplicates."""

    def __init__(self, settings: Settings, label: str, log: Callable[[str], None], stopping: threading.Event,
                 flush_s: float = 1.0):
        self.label, self.log, self.stopping, self.flush_s = label, log, stopping, flush_s
        self._undelivered: list[tuple[bytes, bytes, confluent_kafka.KafkaError]] = []
        self.producer = bulk_producer(settings, on_failed_delivery=self._on_failed_delivery)

    def send(self, topic: str, records: Sequence[tuple[bytes, bytes]], what: str = "record(s)") -> bool:
        pending = list(records)
        while pending:
            for key, value in pending:
                produce(self.producer, topic, value, key)
            while self.producer.flush(self.flush_s) > 0:  # records still wait for the broker (each fails after
                if self.stopping.is_set():               # its timeout)
                    return False
            failed, self._undelivered = self._undelivered, []
            if failed:
                self.log(f"{self.label}: {len(failed)} {what} not delivered ({failed[0][2]}); sending them again")
                if self.stopping.wait(1.0):
                    return False
            pending = [(key, value) for key, value, _ in failed]
        return True

    def all_delivered(self) -> bool:
        """Nothing waits for the broker and nothing failed since the last ``send``."""
        return not self._undelivered and len(self.producer) == 0

    def flush(self, timeout_s: float) -> None:
        self.producer.flush(timeout_s)

    # librdkafka calls this from inside flush(), on the sending thread.
    def _on_failed_delivery(self, error: confluent_kafka.KafkaError, message) -> None:
        self._undelivered.append((message.key(), message.value(), error))


def take(consumer: confluent_kafka.Consumer, max_records: int, timeout_s: float) -> list:
    """Up to ``max_records`` messages (errors and partition ends included): what has arrived, as soon as something
    has, waiting up to ``timeout_s`` for the first. ``consumer.consume(n, timeout)`` alone waits out the whole
    timeout unless ``n`` messages arrive: below that rate, it added the timeout to every record's latency."""
    first = consumer.poll(timeout_s) if max_records > 0 else None
    if first is None:
        return []
    return [first, *consumer.consume(num_messages=max_records - 1, timeout=0)] if max_records > 1 else [first]


def close_within(consumer: confluent_kafka.Consumer, timeout_s: float, name: str) -> None:
    """Close ``consumer`` (leaving its group), leaving behind a close that hangs on an absent broker."""
    close_all_within([consumer], timeout_s, name)


def close_all_within(consumers: Sequence[confluent_kafka.Consumer], timeout_s: float, name: str) -> None:
    """Close ``consumers`` side by side (each leaving its group) within ``timeout_s`` in all, leaving behind any
    close that hangs on an absent broker."""
    closing = [threading.Thread(target=c.close, name=f"{name}-close-consumer", daemon=True) for c in consumers]
    for thread in closing:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in closing:
        thread.join(max(0.0, deadline - time.monotonic()))


class LagWatch:
    """The records past a group consumer's position in each partition it owns (``lag``: partition -> records), from
    its last fetch (no round trip), refreshed by its owner between polls at most every ``every_s``: a scrape reads
    ``lag`` from another thread. A partition read to its end is 0 (its last offset may be a transaction marker);
    one the consumer has no position or no fetch for yet is left out."""

    def __init__(self, every_s: float = 1.0):
        self.every_s = every_s
        self.lag: dict[int, int] = {}
        self._next = 0.0

    def refresh(self, consumer: confluent_kafka.Consumer, at_end=frozenset()) -> bool:
        """-> whether it refreshed (``every_s`` had passed)."""
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.every_s
        lag = {}
        try:
            for tp in consumer.position(consumer.assignment()):
                if tp.partition in at_end:
                    lag[tp.partition] = 0
                    continue
                _, high = consumer.get_watermark_offsets(tp, cached=True)
                if tp.offset >= 0 and high >= 0:
                    lag[tp.partition] = max(0, high - tp.offset)
        except (confluent_kafka.KafkaException, RuntimeError):  # a consumer being replaced or closed: next time
            return True
        self.lag = lag
        return True


class RejoinWatch:
    """Whether a group consumer that lost its session has been assigned nothing for ``wait_s`` since (see
    REJOIN_WAIT_S). Its owner calls ``lost()`` from the consumer's on_lost callback, ``assigned()`` from on_assign,
    and ``renew_if_overdue(...)`` between polls."""

    def __init__(self, wait_s: float = REJOIN_WAIT_S):
        self.wait_s = wait_s
        self.lost_at: float | None = None  # when the session was lost; None once assigned again

    def lost(self) -> None:
        self.lost_at = time.monotonic()

    def assigned(self) -> None:
        self.lost_at = None

    def overdue(self, consumer: confluent_kafka.Consumer) -> float | None:
        if self.lost_at is None:
            return None
        waited = time.monotonic() - self.lost_at
        if waited < self.wait_s:
            return None
        if consumer.assignment():
            self.lost_at = None
            return None
        return waited

    def renew_if_overdue(self, consumer: confluent_kafka.Consumer, subscribed: Callable[[], confluent_kafka.Consumer],
                         log: Callable[[str], None], who: str) -> confluent_kafka.Consumer:
        """``consumer``, or, when it is overdue, a new one from ``subscribed()`` (same group, subscribed) in its
        place: the old one holds no partition, so nothing is dropped; it is closed within seconds."""
        waited = self.overdue(consumer)
        if waited is None:
            return consumer
        log(f"{who}: assigned no partition {waited:.0f}s after its group session was lost; replacing its consumer")
        close_within(consumer, 5.0, who.replace(" ", "-"))  # a close that hangs on an absent broker is left behind
        self.lost_at = time.monotonic()  # the new consumer gets as long to join
        return subscribed()
