"""The Python engine's Kafka reading: the events topic from a checkpoint's position, ``read_committed``."""
from __future__ import annotations

import math
import time
from typing import Callable, Mapping

from lakehouse.settings import Settings
from projection_core.errors import ProjectionError
from read_models.catalog import ARCHIVE_TABLE
from spark_apps.event_rows import Records

__all__ = ["Reader", "CALL_TIMEOUT_S", "STALL_S", "prorated"]

CALL_TIMEOUT_S = 10.0
# A reader with records to read that has received nothing for this long is read again by a new consumer at its own
# positions (``Reader.renew_if_stalled``), then after twice as long, up to ``STALL_MAX_S``.
STALL_S = 15.0
STALL_MAX_S = 300.0


class Reader:
    """Reads the events topic from a checkpoint's position, ``read_committed``, by partition assignment (no
    group): a batch is what has arrived, up to ``limit`` records."""

    def __init__(self, settings: Settings, name: str, stall_s: float = STALL_S, log: Callable[[str], None] = print):
        from event_store import kafka_clients

        self.settings, self.name, self.log = settings, name, log
        self.consumer = kafka_clients.range_reader(settings, name)
        self.next: dict[int, int] = {}  # partition -> the next offset the consumer hands out
        self.at_end: set[int] = set()
        self.ends: dict[int, int] = {}  # partition -> the offset of its last end (``_PARTITION_EOF``) told
        self.buffered: list = []
        self.highs: dict[int, int] = {}  # partition -> its high watermark when last asked (``earliest``)
        self.stall_s, self.renewals = stall_s, 0  # renewals: in a row, with nothing heard between them
        self.heard_at = time.monotonic()  # when the consumer last handed out a record or a partition's end
        self.asked_at = self.renewed_at = self.heard_at  # when ``renew_if_stalled`` last asked the brokers, renewed

    def partitions(self) -> list[int]:
        topic = self.consumer.list_topics(self.settings.events_topic, timeout=CALL_TIMEOUT_S).topics[
            self.settings.events_topic]
        if topic.error is not None:
            raise ProjectionError(f"{self.name}: topic {self.settings.events_topic}: {topic.error}")
        return sorted(topic.partitions)

    def earliest(self, partition: int) -> int:
        from confluent_kafka import TopicPartition

        low, high = self.consumer.get_watermark_offsets(TopicPartition(self.settings.events_topic, partition),
                                                        timeout=CALL_TIMEOUT_S, cached=False)
        self.highs[partition] = high
        return low

    def seek(self, starts: dict[int, int]) -> None:
        """Read from ``starts`` (partition -> offset); a start the log no longer holds is a gap (Spark's
        ``failOnDataLoss``): refused."""
        for partition, offset in starts.items():
            if offset < self.earliest(partition):
                raise ProjectionError(_data_loss(self.settings, self.name, partition, offset))
        self._assign(starts)
        self.heard_at = self.asked_at = time.monotonic()

    def _assign(self, starts: Mapping[int, int]) -> None:
        """The consumer reads from ``starts``; nothing fetched before counts any more."""
        from confluent_kafka import TopicPartition

        self.consumer.assign([TopicPartition(self.settings.events_topic, p, o) for p, o in sorted(starts.items())])
        self.next, self.at_end, self.ends, self.buffered = dict(starts), set(), {}, []

    def read(self, limit: int, wait_s: float, until: Mapping[int, int] | None = None) -> Records:
        """What has arrived since the last batch (at most ``limit`` records), waiting up to ``wait_s`` for the
        first record; with ``until`` (partition -> offset), no record at or past it. When the log holds more
        than ``limit`` past this reader, each partition gets a share of the batch in proportion to its lag, as
        Spark's ``maxOffsetsPerTrigger`` shares it (``prorated``): a catch-up in small batches then reads the
        partitions side by side, instead of one partition's fetched records first (which moved the event-time
        watermark past the other partitions' windows and made their events late)."""
        from confluent_kafka import KafkaError

        from event_store import kafka_clients

        batch = Records(ends=dict(self.next), starts=dict(self.next))
        bounds = dict(until or {})
        for partition, bound in (self._shares(limit) or {}).items():
            bounds[partition] = min(bound, bounds.get(partition, bound))
        messages, self.buffered = self.buffered, []
        held: list = []  # at or past a partition's bound: the next batch's
        held_partitions: set[int] = set()
        deadline = time.monotonic() + wait_s
        while True:
            if held and all(p in held_partitions or p in self.at_end for p in self.next):
                self.buffered, self.heard_at = held, time.monotonic()  # every partition has its share, or its end
                return batch
            if not messages:
                timeout = max(0.0, deadline - time.monotonic()) if not batch.rows and not held else 0.0
                messages = kafka_clients.take(self.consumer, min(limit - len(batch.rows), 10_000), timeout)
                if not messages:
                    self.buffered = held
                    if batch.rows or held:
                        self.heard_at = time.monotonic()
                    else:
                        self.renew_if_stalled(until)
                    return batch
            for i, m in enumerate(messages):
                error = m.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        self.ends[m.partition()], self.heard_at = m.offset(), time.monotonic()
                        if m.partition() in held_partitions:
                            # The end after a record held back: reached once that record is read (librdkafka
                            # tells of an end once; dropped here, the reader would never be caught up again).
                            held.append(m)
                        elif m.offset() >= self.next.get(m.partition(), 0):
                            self.at_end.add(m.partition())
                        continue
                    if error.code() == KafkaError._AUTO_OFFSET_RESET:
                        raise ProjectionError(_data_loss(self.settings, self.name, m.partition(),
                                                         self.next.get(m.partition(), -1)))
                    if error.fatal():
                        raise ProjectionError(f"{self.name}: Kafka: {error.str()}")
                    continue  # transient (a broker away): librdkafka retries by itself
                if len(batch.rows) >= limit:
                    self.buffered, self.heard_at = held + messages[i:], time.monotonic()
                    return batch
                partition, offset = m.partition(), m.offset()
                if offset < self.next.get(partition, 0):
                    continue  # already read (a re-fetch)
                if partition in held_partitions or offset >= bounds.get(partition, offset + 1):
                    held.append(m)
                    held_partitions.add(partition)
                    self.at_end.discard(partition)
                    continue
                self.at_end.discard(partition)
                batch.rows.append((partition, offset, m.key(), m.value()))
                self.next[partition] = batch.ends[partition] = offset + 1
            messages = []

    def renew_if_stalled(self, until: Mapping[int, int] | None = None) -> bool:
        """After ``stall_s`` in which the consumer handed out nothing: ask the brokers where the partitions end and,
        if records this reader may read (below ``until``) lie past both its position and the last end it was told
        of, read them with a new consumer at its own positions (said in the log): -> whether it did. librdkafka's
        consumer by assignment can stop fetching after a broker restart and stay silent until it is recreated
        (confluentinc/librdkafka#5153): the archive once stopped archiving there for good while the read models
        went on. A broker that does not answer is not a stall (librdkafka reconnects by itself)."""
        from confluent_kafka import KafkaException, TopicPartition

        now = time.monotonic()
        if self.heard_at > self.renewed_at:
            self.renewals = 0
        wait_s = min(self.stall_s * 2 ** min(self.renewals, 8), max(self.stall_s, STALL_MAX_S))
        if now - max(self.heard_at, self.asked_at) < wait_s or not self.next:
            return False
        self.asked_at = now
        waiting = {}
        for partition, offset in self.next.items():
            try:
                _, high = self.consumer.get_watermark_offsets(
                    TopicPartition(self.settings.events_topic, partition), timeout=2.0, cached=False)
            except KafkaException:
                return False
            readable = min(high, (until or {}).get(partition, high))
            if readable > max(offset, self.ends.get(partition, -1)):
                waiting[partition] = readable - offset
        if not waiting:
            self.renewals = 0
            return False
        self.log(f"{self.name}: the Kafka consumer handed out nothing for {now - self.heard_at:.0f}s while "
                 f"{sum(waiting.values())} offset(s) of {self.settings.events_topic} partition(s) "
                 f"{sorted(waiting)} wait to be read; reading them with a new consumer from the same positions "
                 f"(librdkafka#5153: a consumer can stay silent after a broker restart)")
        self.renew()
        self.renewals += 1
        return True

    def renew(self) -> None:
        """A new consumer at this reader's positions, the old one closed (what it had fetched past them dropped:
        the new one fetches it again)."""
        from event_store import kafka_clients

        old, self.consumer = self.consumer, kafka_clients.range_reader(self.settings, self.name)
        kafka_clients.close_within(old, 5.0, self.name)
        self._assign(self.next)
        self.asked_at = self.renewed_at = time.monotonic()

    def _shares(self, limit: int) -> dict[int, int] | None:
        """Partition -> the offset this batch reads up to, when the log holds more than ``limit`` offsets past
        this reader (None when it does not: a batch is then whatever has arrived). From the high watermarks
        librdkafka keeps from its fetches, or those the brokers gave when the reader was positioned: no round
        trip, so a batch never waits for an absent broker here."""
        highs = self._cached_highs()
        highs = {p: highs.get(p, self.highs.get(p, -1)) for p in self.next}
        if not highs or min(highs.values()) < 0:
            return None
        return prorated(self.next, highs, limit)

    def _cached_highs(self) -> dict[int, int]:
        """Partition -> the high watermark of librdkafka's last fetch of it (partitions it does not know now, e.g.
        while the broker is away, are left out)."""
        from confluent_kafka import KafkaException, TopicPartition

        highs = {}
        for partition in self.next:
            try:
                _, high = self.consumer.get_watermark_offsets(TopicPartition(self.settings.events_topic, partition),
                                                              cached=True)
            except KafkaException:
                continue
            if high >= 0:
                highs[partition] = high
        return highs

    def caught_up(self, partitions: list[int]) -> bool:
        return set(partitions) <= self.at_end

    def lag(self) -> dict[int, int]:
        """Partition -> offsets in the log past this reader, as of librdkafka's last fetch of it (no round trip; a
        partition it does not know now is left out): 0 for a partition read to its end, where a transaction's
        commit marker takes the last offset (``projection_core.positions``); otherwise records, and the markers
        between them (read_committed: an upper bound)."""
        return {p: 0 if p in self.at_end else max(0, high - self.next[p]) for p, high in self._cached_highs().items()}

    def backlog(self) -> int:
        """Records in the log past where this reader is (read_committed: an upper bound)."""
        from confluent_kafka import TopicPartition

        behind = 0
        for partition, offset in self.next.items():
            _, high = self.consumer.get_watermark_offsets(TopicPartition(self.settings.events_topic, partition),
                                                          timeout=CALL_TIMEOUT_S, cached=False)
            behind += max(0, high - offset)
        return behind

    def close(self) -> None:
        from event_store import kafka_clients

        kafka_clients.close_within(self.consumer, 5.0, self.name)


def prorated(starts: Mapping[int, int], ends: Mapping[int, int], limit: int) -> dict[int, int] | None:
    """Spark's share of ``limit`` offsets among partitions (KafkaMicroBatchStream's rate limit): partition ->
    the offset a batch reads up to, each partition's share in proportion to its lag (``ends`` - ``starts``),
    rounded down, but at least one offset for a partition that has any; None when the lags fit in ``limit``."""
    lags = {p: max(0, ends.get(p, s) - s) for p, s in starts.items()}
    total = sum(lags.values())
    if total <= limit:
        return None
    shares = {}
    for p, lag in lags.items():
        share = limit * lag / total
        shares[p] = starts[p] + min(lag, math.ceil(share) if share < 1 else math.floor(share))
    return shares


def _data_loss(settings: Settings, name: str, partition: int, offset: int) -> str:
    return (f"{name} stopped: records of {settings.events_topic} partition {partition} from offset {offset} that it "
            f"had not read yet are gone from Kafka (retention or deleted records), so the read models would silently "
            f"miss events. Nothing was written past the gap. To go on: rebuild the read models from {ARCHIVE_TABLE} if "
            f"it holds those events, or accept the gap by removing the checkpoint and projecting from the log's "
            f"current start.")
