"""When and how the command handler writes its partitions' snapshots (the format: ``event_store.snapshots``).

A snapshot only saves rebuild time (a handler that takes a partition it never held restores from it, then reads
the log's tail). It is written in steps, each in a transaction of its own after a commit of commands: one snapshot
at a time, one step (``STEP_BYTES``) per transaction, since the loop handles no command while a step is written and
the partitions of an even load come due together (their pauses would add up). On close, what changed is
snapshotted in as few steps as it can, bounded in time. A step that cannot be written is logged and tried again.
"""
from __future__ import annotations

import time
from typing import Callable

import confluent_kafka

from event_store.handler_transactions import TransactionalProducer
from event_store.snapshots import STEP_BYTES, PartitionState, SnapshotWriter
from lakehouse.settings import Settings

__all__ = ["SnapshotSchedule", "snapshot_due"]


def snapshot_due(part: PartitionState, every: int) -> bool:
    """Whether ``part`` is due a snapshot. A snapshot holds the partition's whole state, which costs more as the
    log grows (each account's payment ids): taken after ``every`` new events or a quarter of the events it holds,
    whichever is more, its cost per event stays flat (and a restart reads at most that many events after it)."""
    return part.events_since_snapshot >= max(every, part.events_held // 4)


class SnapshotSchedule:
    """The handler's snapshots of ``partitions`` (its map of partition states), written with ``tx`` (set once the
    handler has started). ``stopping`` is the exception the handler's keepalive raises on stop(): a step cut short
    by it is aborted quietly. ``stats`` gets snapshots, snapshot_steps, snapshot_seconds, longest_snapshot_s."""

    def __init__(self, settings: Settings, instance_id: str, log: Callable[[str], None], stats,
                 partitions: dict[int, PartitionState], stopping: type[BaseException]):
        self.settings = settings
        self.instance_id = instance_id
        self.log = log
        self.stats = stats
        self.partitions = partitions
        self.stopping = stopping
        self.tx: TransactionalProducer | None = None
        self.writer: SnapshotWriter | None = None  # the snapshot being written, a step after each commit

    def after_commit(self) -> None:
        """After a commit: one step (``STEP_BYTES``) of the snapshot being written, or the first step of one of
        the partition most behind of those due."""
        every = self.settings.snapshot_every_events
        if not every:
            return
        writer = self.current_writer()
        if writer is None:
            due = [part for part in self.partitions.values() if snapshot_due(part, every)]
            if not due:
                return
            writer = self.writer = SnapshotWriter(max(due, key=lambda part: part.events_since_snapshot))
        self.write_step(writer, STEP_BYTES)

    def current_writer(self) -> SnapshotWriter | None:
        """The snapshot being written, unless its partition was lost or rebuilt meanwhile (what it wrote is then
        never named by a manifest: event_store.snapshots)."""
        writer = self.writer
        if writer is not None and (writer.done or self.partitions.get(writer.partition) is not writer.part):
            writer = self.writer = None
        return writer

    def on_close(self, parts: list[PartitionState]) -> None:
        """On close: finish the snapshot being written and snapshot each of ``parts``, each in as few steps as it
        can."""
        current = self.current_writer()
        for part in parts:
            writer = current if current is not None and current.part is part else SnapshotWriter(part)
            while not writer.done:
                if not self.write_step(writer, None, closing=True):
                    return

    def write_step(self, writer: SnapshotWriter, budget: int | None, closing: bool = False) -> bool:
        """Write the next step of ``writer``'s snapshot in a transaction of its own; True when it went through.
        A step that cannot be written is logged and tried again after the next commit (on close: given up, the
        next start reads more of the log)."""
        tx = self.tx
        topic = self.settings.snapshots_topic
        started = time.monotonic()
        try:
            records = writer.step(budget)
            tx.begin()  # may fail when stop() cut a commit short
            for key, value in records:
                tx.produce(topic, key, value, writer.partition, on_delivery=writer.on_delivery)
            if closing:  # bounded: a broker that is away gets one call's patience
                tx.commit_once()
            else:
                tx.commit_retrying("committing a snapshot")
        except confluent_kafka.KafkaException as e:
            error = e.args[0]
            if error.fatal():
                if closing:  # nothing more is written with this producer: the next start fences it
                    self.log(f"handler {self.instance_id}: no closing snapshot: fatal producer error ({error})")
                    return False
                tx.renew(error)
                return False
            self.log(f"handler {self.instance_id}: a step of the snapshot of partition {writer.partition} not "
                     f"written ({error}); " + ("the next start reads more of the log" if closing else "retried"))
            if closing:
                tx.abort_quietly()
            else:
                tx.abort(error)
            return False
        except self.stopping:
            tx.abort_quietly()
            raise
        finally:
            took = time.monotonic() - started
            self.stats.snapshot_seconds += took
            self.stats.longest_snapshot_s = max(self.stats.longest_snapshot_s, took)
        self.stats.snapshot_steps += 1
        if not writer.step_written():
            self.log(f"handler {self.instance_id}: the snapshot of partition {writer.partition} is given up: a "
                     f"delivery report is missing, so its manifest could not say where it lies; a new one follows")
            self.writer = None
            return False
        if writer.done:
            writer.part.snapshot_written(writer)
            self.stats.snapshots += 1
        return True
