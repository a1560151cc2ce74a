"""The command handler: the single writer of the events topic, scaled out through a consumer group.

Each instance consumes some partitions of the commands topic (a Kafka consumer group shares them out),
runs ``decide`` against in-memory aggregate state, and writes the resulting events, the command results and
the consumer offsets in ONE Kafka transaction. Readers use ``read_committed``, so a crash mid-batch leaves
no trace and the batch is redone on restart.

Commands partition ``p`` maps to events partition ``p`` (events are written to the partition their command
came from), so an instance that is assigned partition ``p`` rebuilds exactly that partition's accounts:
from the latest snapshot (``event_store.snapshots``) plus the events and results after it. On revoke the
partition's state is dropped. The transactional id is stable per instance (``<group>-<instance id>``) and
the offsets are sent with the consumer's group metadata (KIP-447), so a zombie instance is fenced.
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from kafka import ConsumerRebalanceListener, TopicPartition
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.errors import KafkaError, ProducerFencedError
from kafka.structs import OffsetAndMetadata

from event_store import kafka_log
from event_store.account import AGGREGATE_TYPE, AccountState, CommandRejected, decide, evolve
from event_store.envelope import (CommandEnvelope, CommandResult, EventEnvelope, InvalidRecord, utc_now)
from event_store.schemas import EVENT_SCHEMA_VERSIONS
from event_store.snapshots import PartitionState, load_snapshot, snapshot_records
from eventlake.settings import Settings

__all__ = ["CommandHandler", "HandlerStats", "HandlerError", "RebuildStats", "execute", "event_id_for"]

# Event ids derive from the command id, so a batch redone after an aborted transaction writes the same ids.
_EVENT_ID_NAMESPACE = uuid.UUID("6f1c2b1e-7a4d-4e0b-9a59-3f0e2c1d8b71")
# An open transaction of a dead instance blocks a partition's readers until the broker aborts it.
_TRANSACTION_TIMEOUT_MS = 20_000


class HandlerError(RuntimeError):
    """The handler cannot go on safely (e.g. a partition's log stays blocked by an open transaction)."""


def event_id_for(command_id: str, index: int) -> str:
    """The id of the ``index``-th event caused by ``command_id`` (deterministic, so redone batches match)."""
    return str(uuid.uuid5(_EVENT_ID_NAMESPACE, f"{command_id}/{index}"))


@dataclass
class HandlerStats:
    commands: int = 0
    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    events: int = 0
    transactions: int = 0
    aborted: int = 0
    snapshots: int = 0
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        secs = max(time.monotonic() - self.started, 1e-9)
        return (f"{self.commands} commands ({self.accepted} accepted, {self.rejected} rejected, "
                f"{self.duplicates} duplicate, {self.dead_lettered} dead-lettered) -> {self.events} events "
                f"in {self.transactions} transactions, {self.commands / secs:,.0f} commands/s")


@dataclass
class RebuildStats:
    """How one partition's state came back: from a snapshot or not, and how many records were read after it."""
    partition: int
    from_snapshot: bool
    accounts: int
    events_read: int
    results_read: int
    seconds: float


def execute(state: AccountState, command: CommandEnvelope, recorded_at: str | None = None
            ) -> tuple[AccountState, list[EventEnvelope], CommandResult]:
    """Pure: the new state, the event envelopes to append and the command's result (no Kafka)."""
    recorded_at = recorded_at or utc_now()
    try:
        new_events = decide(state, command)
    except CommandRejected as e:
        return state, [], CommandResult(command.command_id, command.aggregate_id, "rejected", state.version,
                                        error_type=e.error_type, reason=e.reason, recorded_at=recorded_at)
    envelopes = []
    for i, new in enumerate(new_events):
        event = EventEnvelope(
            event_id=event_id_for(command.command_id, i),
            event_type=new.event_type, schema_version=EVENT_SCHEMA_VERSIONS[new.event_type],
            aggregate_type=AGGREGATE_TYPE, aggregate_id=command.aggregate_id, aggregate_version=state.version + 1,
            occurred_at=new.occurred_at, recorded_at=recorded_at, command_id=command.command_id,
            correlation_id=command.correlation_id or command.command_id, causation_id=command.command_id,
            payload=new.payload)
        state = evolve(state, event)
        envelopes.append(event)
    return state, envelopes, CommandResult(command.command_id, command.aggregate_id, "accepted", state.version,
                                           event_ids=tuple(e.event_id for e in envelopes),
                                           recorded_at=recorded_at)


class _Rebalance(ConsumerRebalanceListener):
    """Records assignment changes; the handler's loop applies them (callbacks run on the consumer's IO loop)."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.lock = threading.Lock()
        self.revoked: set[int] = set()
        self.generation = 0

    def on_partitions_revoked(self, revoked):
        self.log(f"handler: partitions revoked: {sorted(tp.partition for tp in revoked)}")
        with self.lock:
            self.revoked |= {tp.partition for tp in revoked}
            self.generation += 1

    def on_partitions_assigned(self, assigned):
        self.log(f"handler: partitions assigned: {sorted(tp.partition for tp in assigned)}")
        with self.lock:
            self.generation += 1

    def take_revoked(self) -> set[int]:
        with self.lock:
            revoked, self.revoked = self.revoked, set()
            return revoked


class CommandHandler:
    """Consume commands, append events. ``run()`` until stopped, or until caught up with ``until_caught_up``.

    Several instances with different ``instance_id`` and the same ``settings.handler_group_id`` share the
    commands partitions. ``use_snapshots=False`` rebuilds from the whole log (to measure what snapshots save).
    """

    def __init__(self, settings: Settings, instance_id: str = "0", log: Callable[[str], None] = print,
                 use_snapshots: bool = True, max_poll_records: int | None = None):
        self.settings = settings
        self.instance_id = instance_id
        self.log = log
        self.use_snapshots = use_snapshots
        self.max_poll_records = max_poll_records or settings.handler_max_batch
        self.partitions: dict[int, PartitionState] = {}
        self.rebuilds: list[RebuildStats] = []
        self.stats = HandlerStats()
        self._listener = _Rebalance(log)
        self._stopping = threading.Event()
        self._producer = None
        self._consumer = None
        self._reader = None  # read_committed, no group: rebuilds
        self._watermarks = None  # read_uncommitted, no group: the high watermark, to see open transactions

    @property
    def transactional_id(self) -> str:
        return f"{self.settings.handler_group_id}-{self.instance_id}"

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        kafka_log.ensure_topics(self.settings, log=self.log)
        self._check_partition_counts()
        # Bigger batches and a longer linger than the default: a transaction sends thousands of records at once.
        self._producer = kafka_log.make_producer(self.settings, transactional_id=self.transactional_id,
                                                 transaction_timeout_ms=_TRANSACTION_TIMEOUT_MS,
                                                 linger_ms=20, batch_size=1024 * 1024)
        # Fences any older instance with this id and aborts its open transaction before we read state.
        self._producer.init_transactions()
        self._reader = kafka_log.make_consumer(self.settings)
        self._watermarks = kafka_log.make_consumer(self.settings, isolation_level="read_uncommitted")
        # Static membership: a restarted instance takes its partitions back without waiting for a timeout.
        self._consumer = kafka_log.make_consumer(
            self.settings, group_id=self.settings.handler_group_id, max_poll_records=self.max_poll_records,
            group_instance_id=self.transactional_id, session_timeout_ms=10_000, heartbeat_interval_ms=2_000,
            max_poll_interval_ms=60_000, metadata_max_age_ms=10_000,
            partition_assignment_strategy=(CooperativeStickyAssignor,))
        # Know the topic's partitions before joining: a group leader without them assigns nothing, and the
        # group would only rebalance at the next metadata refresh.
        deadline = time.monotonic() + 30
        while not self._consumer.partitions_for_topic(self.settings.commands_topic):
            if time.monotonic() > deadline:
                raise HandlerError(f"topic {self.settings.commands_topic} has no partitions visible after 30s")
            time.sleep(0.2)
        self._consumer.subscribe([self.settings.commands_topic], listener=self._listener)

    def close(self) -> None:
        """Snapshot what changed (so the next start is fast), then close the clients."""
        if self._producer is not None and self._consumer is not None and self.settings.snapshot_every_events:
            try:
                self._snapshot([p for p in self.partitions.values() if p.events_since_snapshot])
            except KafkaError as e:
                self.log(f"handler: no snapshot on close ({e}); the next start reads more of the log")
        for client in (self._consumer, self._reader, self._watermarks, self._producer):
            if client is not None:
                client.close()
        self._consumer = self._producer = self._reader = self._watermarks = None

    def __enter__(self) -> "CommandHandler":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_partition_counts(self) -> None:
        s = self.settings
        counts = {t: len(self._topic_partitions(t)) for t in
                  (s.commands_topic, s.events_topic, s.results_topic, s.snapshots_topic)}
        if len(set(counts.values())) != 1:
            raise HandlerError("commands partition p maps to events, results and snapshots partition p, so these "
                               "topics need the same partition count; found "
                               + ", ".join(f"{t}: {n}" for t, n in counts.items()))

    def _topic_partitions(self, topic: str) -> set[int]:
        consumer = kafka_log.make_consumer(self.settings)
        try:
            return set(consumer.partitions_for_topic(topic) or ())
        finally:
            consumer.close()

    # -- partition state -------------------------------------------------------------------------
    def _apply_revocations(self) -> None:
        for p in self._listener.take_revoked():
            if self.partitions.pop(p, None) is not None:
                self.log(f"handler {self.instance_id}: partition {p} revoked, its state dropped")

    def _partition(self, p: int) -> PartitionState:
        part = self.partitions.get(p)
        if part is None:
            part = self.partitions[p] = self._rebuild(p)
        return part

    def _rebuild(self, p: int) -> PartitionState:
        """Partition ``p``'s accounts and idempotency window: the latest snapshot plus the records after it."""
        s = self.settings
        started = time.monotonic()
        events_tp, results_tp = TopicPartition(s.events_topic, p), TopicPartition(s.results_topic, p)
        snapshots_tp = TopicPartition(s.snapshots_topic, p)
        # One offsets request for all three (each costs a round trip): where the committed log ends now.
        ends = self._wait_until_stable([events_tp, results_tp, snapshots_tp])
        part = self._load_snapshot(p, ends[snapshots_tp]) if self.use_snapshots else None
        from_snapshot = part is not None
        part = part or PartitionState(p, window=s.idempotency_window)
        end = ends[events_tp]
        events_read = 0
        for record in kafka_log.read_partition(self._reader, events_tp, part.events_offset, end):
            try:
                event = EventEnvelope.from_json(record.value)
            except InvalidRecord as e:
                self.log(f"handler: skipped events record {p}/{record.offset}: {e}")
                continue
            part.accounts[event.aggregate_id] = evolve(part.account(event.aggregate_id), event)
            events_read += 1
        part.events_offset = max(part.events_offset, end)
        part.events_since_snapshot += events_read
        end = ends[results_tp]
        results_read = 0
        for record in kafka_log.read_partition(self._reader, results_tp, part.results_offset, end):
            try:
                result = CommandResult.from_json(record.value)
            except InvalidRecord:
                continue
            results_read += 1
            if result.aggregate_id and result.error_type != "InvalidCommand":
                part.remember(result)
        part.results_offset = max(part.results_offset, end)
        stats = RebuildStats(p, from_snapshot, len(part.accounts), events_read, results_read,
                             time.monotonic() - started)
        self.rebuilds.append(stats)
        self.log(f"handler {self.instance_id}: partition {p}: {len(part.accounts)} accounts from "
                 f"{'a snapshot + ' if from_snapshot else ''}{events_read} events and {results_read} results "
                 f"in {stats.seconds:.2f}s")
        return part

    def _load_snapshot(self, p: int, end: int) -> PartitionState | None:
        """The latest snapshot of partition ``p``, reading only its own records when it can.

        A snapshot's chunks and manifest are written contiguously in one transaction and nothing else writes
        snapshots partition ``p`` in between, so the latest manifest sits just before the end (the commit
        marker) and its chunks just before it. If that does not hold, the whole partition is read.
        """
        s = self.settings
        tp = TopicPartition(s.snapshots_topic, p)
        if end == 0:
            return None
        tail = list(kafka_log.read_partition(self._reader, tp, max(0, end - 3), end))
        manifests = [r for r in tail if r.key == str(p).encode()]
        if manifests:
            manifest = manifests[-1]
            chunks = json.loads(manifest.value)["chunks"]
            records = list(kafka_log.read_partition(self._reader, tp, max(0, manifest.offset - chunks),
                                                    manifest.offset + 1))
            try:
                return load_snapshot(records, p, s.idempotency_window)
            except InvalidRecord:
                pass  # not contiguous after all (e.g. compacted): read everything
        return load_snapshot(kafka_log.read_partition(self._reader, tp, 0, end), p, s.idempotency_window)

    def _wait_until_stable(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Wait until no open transaction (e.g. of a killed instance) holds back the end of ``tps``; their
        last stable offsets."""
        deadline = time.monotonic() + _TRANSACTION_TIMEOUT_MS / 1000 + 15
        while True:
            stable = self._reader.end_offsets(tps)
            high = self._watermarks.end_offsets(tps)
            if all(stable[tp] >= high[tp] for tp in tps):
                return stable
            if time.monotonic() > deadline:
                raise HandlerError(f"partitions {sorted(str(tp) for tp in tps)} stay blocked by an open transaction "
                                   f"(stable offsets {stable}, high watermarks {high}); is another handler with a "
                                   f"different instance id writing them?")
            time.sleep(0.2)

    # -- the loop ----------------------------------------------------------------------------------
    def run(self, until_caught_up: bool = False, max_seconds: float | None = None,
            progress_every_s: float = 5.0) -> HandlerStats:
        if self._consumer is None:
            self.start()
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        last_progress = time.monotonic()
        self._stopping.clear()
        while (deadline is None or time.monotonic() < deadline) and not self._stopping.is_set():
            batch = self._consumer.poll(timeout_ms=200)
            self._apply_revocations()
            # Rebuild newly assigned partitions now (not on their first command), so a restart is ready at once.
            for tp in self._consumer.assignment():
                self._partition(tp.partition)
            if batch:
                self.process(batch)
            elif until_caught_up and self._caught_up():
                break
            if time.monotonic() - last_progress >= progress_every_s:
                self.log(f"handler {self.instance_id}: {self.stats.line()}")
                last_progress = time.monotonic()
        return self.stats

    def stop(self) -> None:
        """Ask ``run()`` (possibly in another thread) to return after the current batch."""
        self._stopping.set()

    def _caught_up(self) -> bool:
        assigned = self._consumer.assignment()
        if not assigned:
            return False
        ends = self._consumer.end_offsets(list(assigned))
        return all(self._consumer.position(tp) >= ends[tp] for tp in assigned)

    def process(self, batch: dict) -> None:
        """Handle one polled batch of command records in one transaction."""
        assigned = self._consumer.assignment()
        owned = {tp: self._partition(tp.partition) for tp in batch if tp in assigned}
        if not owned:
            return
        producer = self._producer
        recorded_at = utc_now()
        staged: dict[str, tuple[PartitionState, AccountState]] = {}
        staged_results: dict[str, tuple[PartitionState, CommandResult]] = {}
        stats = HandlerStats(started=self.stats.started)
        last_events: dict[int, object] = {}
        last_results: dict[int, object] = {}
        producer.begin_transaction()
        try:
            offsets = {}
            for tp, part in owned.items():
                records = batch[tp]
                events_before = stats.events
                for record in records:
                    ev, res = self._handle_record(record, part, staged, staged_results, stats, recorded_at)
                    if ev is not None:
                        last_events[tp.partition] = ev
                    if res is not None:
                        last_results[tp.partition] = res
                part_events = stats.events - events_before
                offsets[tp] = OffsetAndMetadata(records[-1].offset + 1, "", -1)
                owned[tp] = (part, part_events)
            producer.send_offsets_to_transaction(offsets, self._consumer.group_metadata())
            producer.commit_transaction()
        except ProducerFencedError:
            raise HandlerError(f"handler {self.instance_id}: fenced by a newer instance with transactional id "
                               f"{self.transactional_id}; stopping") from None
        except KafkaError as e:
            # Typically a rebalance took a partition away mid-batch (KIP-447 fencing of the offset commit).
            # Nothing of this batch is visible; re-read it where we still own the partition.
            self._abort(e, batch, owned)
            return
        # Only a committed transaction changes what the handler believes.
        for tp, (part, part_events) in owned.items():
            part.events_since_snapshot += part_events
            if tp.partition in last_events:
                part.events_offset = last_events[tp.partition].get(timeout=30).offset + 1
            if tp.partition in last_results:
                part.results_offset = last_results[tp.partition].get(timeout=30).offset + 1
        for account_id, (part, state) in staged.items():
            part.accounts[account_id] = state
        for part, result in staged_results.values():
            if result.aggregate_id and result.error_type != "InvalidCommand":
                part.remember(result)
        for name in ("commands", "accepted", "rejected", "duplicates", "dead_lettered", "events"):
            setattr(self.stats, name, getattr(self.stats, name) + getattr(stats, name))
        self.stats.transactions += 1
        every = self.settings.snapshot_every_events
        if every:
            due = [part for part, _ in owned.values() if part.events_since_snapshot >= every]
            if due:
                self._snapshot(due)

    def _abort(self, error: Exception, batch: dict, owned: dict) -> None:
        try:
            self._producer.abort_transaction()
        except KafkaError as e:
            raise HandlerError(f"handler {self.instance_id}: cannot abort after {error!r}: {e!r}") from e
        self.stats.aborted += 1
        self._apply_revocations()
        still = self._consumer.assignment()
        for tp in owned:
            if tp in still:
                self._consumer.seek(tp, batch[tp][0].offset)
        self.log(f"handler {self.instance_id}: transaction aborted ({error!r}); the batch will be redone "
                 f"where this instance still owns the partition")

    def _handle_record(self, record, part: PartitionState, staged, staged_results, stats: HandlerStats,
                       recorded_at: str):
        """Handle one command record; returns the send futures of its last event and its result."""
        s = self.settings
        stats.commands += 1
        p = record.partition
        try:
            command = CommandEnvelope.from_json(record.value)
        except InvalidRecord as e:
            # A readable command with a bad field is rejected with the reason; a record that is not a
            # command at all (no command_id to answer to) goes to the dead-letter topic with its bytes.
            result = self._invalid_result(record, str(e), recorded_at)
            if result is not None:
                stats.rejected += 1
                return None, self._send_result(result, p)
            stats.dead_lettered += 1
            self._producer.send(s.dead_letters_topic, key=record.key,
                                value=kafka_log.dead_letter_value(str(e), record.value, record.topic,
                                                                  record.partition, record.offset))
            return None, None
        account_id = command.aggregate_id
        command_id = command.command_id
        staged_first = staged_results.get(command_id)
        first = staged_first[1] if staged_first else part.first_result(account_id, command_id)
        if first is not None and first.aggregate_id == account_id:
            stats.duplicates += 1
            return None, self._send_result(CommandResult(
                first.command_id, account_id, first.status, first.version, first.event_ids, first.error_type,
                first.reason, recorded_at, duplicate=True), p)
        staged_state = staged.get(account_id)
        state = staged_state[1] if staged_state else part.account(account_id)
        state, events, result = execute(state, command, recorded_at)
        future = None
        key = account_id.encode()
        for event in events:
            future = self._producer.send(s.events_topic, key=key, value=event.to_json(), partition=p)
        if result.accepted:
            staged[account_id] = (part, state)
            stats.accepted += 1
            stats.events += len(events)
        else:
            stats.rejected += 1
        staged_results[command_id] = (part, result)
        return future, self._send_result(result, p)

    def _send_result(self, result: CommandResult, partition: int):
        return self._producer.send(self.settings.results_topic, key=result.command_id.encode(),
                                   value=result.to_json(), partition=partition)

    def _invalid_result(self, record, reason: str, recorded_at: str) -> CommandResult | None:
        """A rejection for an invalid command whose command_id can be read; None when it cannot."""
        try:
            obj = json.loads(record.value)
        except (ValueError, TypeError):
            return None
        command_id = obj.get("command_id") if isinstance(obj, dict) else None
        if not isinstance(command_id, str) or not command_id:
            return None
        aggregate_id = obj.get("aggregate_id") if isinstance(obj.get("aggregate_id"), str) else ""
        return CommandResult(command_id, aggregate_id, "rejected", -1, error_type="InvalidCommand", reason=reason,
                             recorded_at=recorded_at)

    # -- snapshots ---------------------------------------------------------------------------------
    def _snapshot(self, parts: list[PartitionState]) -> None:
        """Write a snapshot of each of ``parts`` (their committed state) in one transaction of its own."""
        if not parts:
            return
        topic = self.settings.snapshots_topic
        self._producer.begin_transaction()
        try:
            for part in parts:
                for key, value in snapshot_records(part):
                    self._producer.send(topic, key=key, value=value, partition=part.partition)
            self._producer.commit_transaction()
        except KafkaError:
            self._producer.abort_transaction()
            raise
        for part in parts:
            part.events_since_snapshot = 0
        self.stats.snapshots += len(parts)
