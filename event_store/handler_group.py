"""The command handler's membership of its consumer group: which commands partitions this instance owns, when.

A Kafka consumer group shares the commands partitions out among the handler instances (static membership: a
restarted instance takes its partitions back without waiting for a timeout). An assigned partition stays paused
until its state is rebuilt (``event_store.partition_rebuild``); a revoked or lost one is dropped at once, and every
assignment and revocation bumps the partition's generation, so a transaction can tell that a partition moved while
it waited. Long work calls ``keepalive`` between its steps, which polls the consumer often enough that it never
leaves the group; records it gets are kept for the next batch. A consumer that does not rejoin after its session
was lost is replaced (``kafka_clients.RejoinWatch``). The handler (``event_store.handler``) owns the transactions.
"""
from __future__ import annotations

import time
from typing import Callable

import confluent_kafka
from kafka import TopicPartition
from kafka.errors import KafkaError

from event_store import kafka_clients, kafka_log
from event_store.handler_transactions import CALL_TIMEOUT_S, HandlerError
from event_store.partition_rebuild import PartitionRebuilder, RebuildDeferred
from event_store.snapshots import PartitionState
from lakehouse.settings import Settings

__all__ = ["GroupMembership", "check_partition_counts", "MAX_POLL_INTERVAL_MS", "KEEPALIVE_EVERY_S"]

# librdkafka's consumer leaves its group when the application does not poll for this long (it rejoins on
# the next poll). Long work polls every KEEPALIVE_EVERY_S, far below it.
MAX_POLL_INTERVAL_MS = 60_000
KEEPALIVE_EVERY_S = 2.0


def check_partition_counts(settings: Settings) -> None:
    """Commands partition p maps to events, results and snapshots partition p: the four topics need the same
    partition count (HandlerError naming them when they differ)."""
    s = settings
    counts = {t: len(_topic_partitions(s, t)) for t in
              (s.commands_topic, s.events_topic, s.results_topic, s.snapshots_topic)}
    if len(set(counts.values())) != 1:
        raise HandlerError("commands partition p maps to events, results and snapshots partition p, so these "
                           "topics need the same partition count; found "
                           + ", ".join(f"{t}: {n}" for t, n in counts.items()))


def _topic_partitions(settings: Settings, topic: str) -> set[int]:
    consumer = kafka_log.make_consumer(settings)
    try:
        return set(consumer.partitions_for_topic(topic) or ())
    finally:
        consumer.close()


class GroupMembership:
    """One handler instance in the handlers' group: its consumer of the commands topic and which partitions it
    owns. ``partitions`` is the handler's map of rebuilt partition states (dropped here on revocation);
    ``check_stop()`` raises when the handler was asked to stop; ``stats`` gets ``consumers_renewed``."""

    def __init__(self, settings: Settings, instance_id: str, member_id: str, log: Callable[[str], None],
                 max_poll_records: int, partitions: dict[int, PartitionState], stats,
                 check_stop: Callable[[], None]):
        self.settings = settings
        self.instance_id = instance_id
        self.member_id = member_id  # group.instance.id (static membership)
        self.log = log
        self.max_poll_records = max_poll_records
        self.partitions = partitions
        self.stats = stats
        self.check_stop = check_stop
        self.consumer = None
        # Assigned partitions whose state is not rebuilt yet: paused, so none of their commands is handled early.
        self.unready: set[int] = set()
        # Per partition, the committed offset seek_committed last read after a producer's renewal: it tells whether
        # the transaction the old producer failed to see through was committed all the same (its offsets with it).
        self.read_again_from: dict[int, int] = {}
        self.generation: dict[int, int] = {}  # per partition, bumped on every assignment and revocation
        self.rebuild_retry_at: dict[int, float] = {}
        self.buffered: list = []  # command records a keepalive consumed; handled by the next poll
        self.last_consume = time.monotonic()
        self.rejoin = kafka_clients.RejoinWatch()

    def join(self) -> None:
        """Subscribe to the commands topic in the handlers' group."""
        self.consumer = self._group_consumer()

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
        self.consumer = None

    def _group_consumer(self):
        """The consumer of the commands topic in the handlers' group, subscribed."""
        s = self.settings
        # Static membership: a restarted instance takes its partitions back without waiting for a timeout.
        consumer = kafka_clients.group_consumer(s, s.handler_group_id, self.member_id, MAX_POLL_INTERVAL_MS)
        consumer.subscribe([s.commands_topic], on_assign=self.on_assign, on_revoke=self.on_revoke,
                           on_lost=self.on_lost)
        self.last_consume = time.monotonic()
        return consumer

    def rejoin_if_stuck(self) -> None:
        """Replace the consumer when it has been assigned nothing for kafka_clients.REJOIN_WAIT_S since its group
        session was lost. Nothing is assigned, so no state is dropped; the new consumer, with the same
        group.instance.id, takes this instance's place in the group."""
        renewed = self.rejoin.renew_if_overdue(self.consumer, self._group_consumer, self.log,
                                               f"handler {self.instance_id}")
        if renewed is not self.consumer:
            self.stats.consumers_renewed += 1
            self.buffered = []
            self.consumer = renewed

    # librdkafka calls these from inside consume(), on this thread.
    def on_assign(self, consumer, partitions) -> None:
        consumer.incremental_assign(partitions)
        consumer.pause(partitions)  # until the partition's state is rebuilt (rebuild_unready resumes it)
        self.stats.rebalances["assigned"] += len(partitions)
        for tp in partitions:
            self.generation[tp.partition] = self.generation.get(tp.partition, 0) + 1
            self.unready.add(tp.partition)
            self.rebuild_retry_at.pop(tp.partition, None)
        self.rejoin.assigned()
        self.log(f"handler {self.instance_id}: partitions assigned: {sorted(tp.partition for tp in partitions)}")

    def on_revoke(self, consumer, partitions) -> None:
        self.stats.rebalances["revoked"] += len(partitions)
        self.log(f"handler {self.instance_id}: partitions revoked: {sorted(tp.partition for tp in partitions)}")
        self._drop(partitions)

    def _drop(self, partitions) -> None:
        revoked = {tp.partition for tp in partitions}
        for p in revoked:
            self.generation[p] = self.generation.get(p, 0) + 1
            self.unready.discard(p)
            if self.partitions.pop(p, None) is not None:
                self.log(f"handler {self.instance_id}: partition {p}'s state dropped")
        self.buffered = [m for m in self.buffered if m.partition() not in revoked]

    def on_lost(self, consumer, partitions) -> None:
        """The group session timed out (the coordinator did not answer, e.g. the broker restarted): the
        partitions may be someone else's already. Dropped like a revocation; see rejoin_if_stuck."""
        self.rejoin.lost()
        self.stats.rebalances["lost"] += len(partitions)
        self.log(f"handler {self.instance_id}: group session lost; partitions dropped: "
                 f"{sorted(tp.partition for tp in partitions)}")
        self._drop(partitions)

    def moved(self, generations: dict[int, int | None]) -> bool:
        """Whether any of the partitions (with the generation they had) was revoked or assigned anew since."""
        return any(self.generation.get(p) != g for p, g in generations.items())

    def consume(self, timeout: float) -> list:
        messages = kafka_clients.take(self.consumer, self.max_poll_records, timeout)
        self.last_consume = time.monotonic()
        records = []
        for message in messages:
            if message.error():
                self.log(f"handler {self.instance_id}: consumer error {message.error()}")
            else:
                records.append(message)
        return records

    def keepalive(self) -> None:
        """Called between the steps of long work (a rebuild, waiting for the broker or a commit): unwinds when
        stop() was called (check_stop raises), and polls the consumer often enough that it never exceeds
        max.poll.interval.ms (which makes librdkafka leave the group). Records it gets are kept for the next
        batch, in order."""
        self.check_stop()
        if time.monotonic() - self.last_consume >= KEEPALIVE_EVERY_S:
            self.buffered.extend(self.consume(0))

    def wait(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.keepalive()
            time.sleep(min(0.1, max(0.0, until - time.monotonic())))

    def poll(self) -> dict[TopicPartition, list]:
        """The next batch of command records (confluent-kafka messages), by partition, in offset order."""
        if self.buffered:
            messages, self.buffered = self.buffered, []
        else:
            messages = self.consume(0.2)
        by_partition: dict[int, list] = {}
        for message in messages:
            records = by_partition.get(message.partition())
            if records is None:
                records = by_partition[message.partition()] = []
            records.append(message)
        topic = self.settings.commands_topic
        return {TopicPartition(topic, p): records for p, records in by_partition.items()}

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(tp.topic, tp.partition) for tp in self.consumer.assignment()}

    def rebuild_unready(self, rebuilder: PartitionRebuilder) -> None:
        """Rebuild the state of assigned partitions that have none yet, then let their commands through."""
        if not self.unready:
            return
        assigned = {tp.partition for tp in self.consumer.assignment()}
        for p in sorted(self.unready & assigned):
            if time.monotonic() < self.rebuild_retry_at.get(p, 0.0):
                continue
            generation = self.generation.get(p)
            try:
                part = rebuilder.rebuild(p)
            except (RebuildDeferred, KafkaError, kafka_log.LogReadStalled) as e:
                self.rebuild_retry_at[p] = time.monotonic() + 2.0
                rebuilder.renew()
                self.log(f"handler {self.instance_id}: partition {p} not rebuilt yet ({e!r}); its commands wait, "
                         f"retrying in 2s")
                continue
            if self.generation.get(p) != generation:
                self.log(f"handler {self.instance_id}: partition {p} moved while it was rebuilt; state discarded")
                continue
            self.partitions[p] = part
            self.unready.discard(p)
            self.consumer.resume([confluent_kafka.TopicPartition(self.settings.commands_topic, p)])

    def caught_up(self, end_offsets: Callable[[list[TopicPartition]], dict]) -> bool:
        """Whether every assigned partition is rebuilt and read to its end (``end_offsets`` of the commands
        topic's partitions); False when the broker does not answer."""
        assigned = self.consumer.assignment()
        if not assigned or self.unready or self.buffered:
            return False
        try:
            ends = end_offsets([TopicPartition(tp.topic, tp.partition) for tp in assigned])
            positions = {(tp.topic, tp.partition): tp.offset for tp in self.consumer.position(assigned)}
            committed = {(tp.topic, tp.partition): tp.offset
                         for tp in self.consumer.committed(assigned, timeout=CALL_TIMEOUT_S)}
        except (KafkaError, confluent_kafka.KafkaException):
            return False  # the broker does not answer: not known to be caught up
        for tp in assigned:
            key = (tp.topic, tp.partition)
            # Nothing consumed yet since the assignment: the committed offset is where we stand.
            at = positions[key] if positions[key] >= 0 else max(committed[key], 0)
            if at < ends[TopicPartition(tp.topic, tp.partition)]:
                return False
        return True

    def drop_partitions(self) -> None:
        """When the producer is renewed (event_store.handler_transactions): every owned partition is rebuilt like
        a new assignment, read again from its committed offset (seek_committed, once the new producer is ready).
        Before the new producer may write: no state that the aborted transaction may have changed is kept."""
        assigned = list(self.consumer.assignment())
        if assigned:
            self.consumer.pause(assigned)
        for tp in assigned:
            self.generation[tp.partition] = self.generation.get(tp.partition, 0) + 1
            self.unready.add(tp.partition)
            self.rebuild_retry_at.pop(tp.partition, None)
            self.partitions.pop(tp.partition, None)
        self.partitions.clear()
        self.buffered = []
        self.read_again_from = {}

    def seek_committed(self) -> None:
        """Put every assigned (paused, unready) partition back at its committed offset, waiting for the broker."""
        while True:
            assigned = list(self.consumer.assignment())
            if not assigned:
                return
            try:
                committed = self.consumer.committed(assigned, timeout=CALL_TIMEOUT_S)
                break
            except confluent_kafka.KafkaException as e:
                self.log(f"handler {self.instance_id}: reading committed offsets waits for the broker ({e})")
                self.wait(1.0)
        self.read_again_from = {tp.partition: tp.offset for tp in committed}
        for tp in committed:
            if tp.partition not in self.unready:
                continue  # assigned anew by a keepalive meanwhile: it starts from its committed offset anyway
            offset = tp.offset if tp.offset >= 0 else confluent_kafka.OFFSET_BEGINNING
            try:
                self.consumer.seek(confluent_kafka.TopicPartition(tp.topic, tp.partition, offset))
            except confluent_kafka.KafkaException as e:
                raise HandlerError(f"handler {self.instance_id}: cannot read {tp.topic}/{tp.partition} again from its "
                                   f"committed offset {tp.offset} ({e}); stopping") from None

    def rewind(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` again from ``offset`` (if this instance still owns it); drop what a keepalive kept of it."""
        self.buffered = [m for m in self.buffered if m.partition() != tp.partition]
        if tp.partition in self.unready or tp not in self.assignment():
            return  # a new assignment starts from the committed offset anyway
        try:
            self.consumer.seek(confluent_kafka.TopicPartition(tp.topic, tp.partition, offset))
        except confluent_kafka.KafkaException as e:
            self.log(f"handler {self.instance_id}: cannot rewind {tp.topic}/{tp.partition} to {offset} ({e}); "
                     f"restarting from its committed offset")
            self.unready.add(tp.partition)
            self.partitions.pop(tp.partition, None)
            self.consumer.pause([confluent_kafka.TopicPartition(tp.topic, tp.partition)])
