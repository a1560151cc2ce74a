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

import gc
import hashlib
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

import confluent_kafka
from kafka import TopicPartition
from kafka.errors import KafkaError

from event_store import kafka_log
from event_store.account import AGGREGATE_TYPE, AccountState, CommandRejected, decide, evolve, evolve_fields
from event_store.envelope import (CommandEnvelope, CommandResult, EventEnvelope, InvalidRecord, built, dumps,
                                  utc_now)
from event_store.schemas import EVENT_SCHEMA_VERSIONS
from event_store.snapshots import PartitionState, load_snapshot, snapshot_records
from eventlake.settings import Settings

__all__ = ["CommandHandler", "HandlerStats", "HandlerError", "RebuildStats", "execute", "execute_encoded",
           "event_id_for"]

# Event ids derive from the command id, so a batch redone after an aborted transaction writes the same ids.
_EVENT_ID_NAMESPACE = uuid.UUID("6f1c2b1e-7a4d-4e0b-9a59-3f0e2c1d8b71")
_EVENT_ID_SHA1 = hashlib.sha1(_EVENT_ID_NAMESPACE.bytes)
# An open transaction of a dead instance blocks a partition's readers until the broker aborts it.
_TRANSACTION_TIMEOUT_MS = 20_000
# The cyclic garbage collector while the loop runs. The handler keeps hundreds of thousands of live objects
# (states, the idempotency window) and allocates several per command; with Python's default thresholds
# (700, 10, 10) the collector's passes over them took about a third of the loop's time (bench/commands.py).
# The hot path makes no reference cycles, so collecting rarely loses nothing.
_GC_THRESHOLDS = (100_000, 50, 100)


class HandlerError(RuntimeError):
    """The handler cannot go on safely (e.g. a partition's log stays blocked by an open transaction)."""


def event_id_for(command_id: str, index: int) -> str:
    """The id of the ``index``-th event caused by ``command_id`` (deterministic, so redone batches match).

    ``uuid.uuid5(_EVENT_ID_NAMESPACE, f"{command_id}/{index}")``, computed without building UUID objects."""
    sha1 = _EVENT_ID_SHA1.copy()
    sha1.update(f"{command_id}/{index}".encode())
    h = sha1.hexdigest()
    # RFC 4122: version 5 in the high nibble of byte 6, variant 10 in the top bits of byte 8.
    return (f"{h[:8]}-{h[8:12]}-5{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:32]}")


_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


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
    commit_seconds: float = 0.0  # waiting for send_offsets_to_transaction + commit_transaction
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        secs = max(time.monotonic() - self.started, 1e-9)
        return (f"{self.commands} commands ({self.accepted} accepted, {self.rejected} rejected, "
                f"{self.duplicates} duplicate, {self.dead_lettered} dead-lettered) -> {self.events} events "
                f"in {self.transactions} transactions, {self.commands / secs:,.0f} commands/s"
                + (f", {self.commit_seconds / secs:.0%} of the time committing" if self.transactions else ""))


@dataclass
class RebuildStats:
    """How one partition's state came back: from a snapshot or not, and how many records were read after it."""
    partition: int
    from_snapshot: bool
    accounts: int
    events_read: int
    results_read: int
    seconds: float


def _rejection(state: AccountState, command: CommandEnvelope, e: CommandRejected, recorded_at: str) -> CommandResult:
    return CommandResult(command.command_id, command.aggregate_id, "rejected", state.version,
                         error_type=e.error_type, reason=e.reason, recorded_at=recorded_at)


def _accepted(command: CommandEnvelope, state: AccountState, event_ids: list[str], recorded_at: str) -> CommandResult:
    return built(CommandResult, command_id=command.command_id, aggregate_id=command.aggregate_id,
                 status="accepted", version=state.version, event_ids=tuple(event_ids), error_type=None,
                 reason=None, recorded_at=recorded_at, duplicate=False)


def execute(state: AccountState, command: CommandEnvelope, recorded_at: str | None = None
            ) -> tuple[AccountState, list[EventEnvelope], CommandResult]:
    """Pure: the new state, the event envelopes to append and the command's result (no Kafka)."""
    recorded_at = recorded_at or utc_now()
    try:
        new_events = decide(state, command)
    except CommandRejected as e:
        return state, [], _rejection(state, command, e, recorded_at)
    command_id, aggregate_id = command.command_id, command.aggregate_id
    correlation_id = command.correlation_id or command_id
    envelopes = []
    for i, new in enumerate(new_events):
        event_type = new.event_type
        event = built(EventEnvelope, event_id=event_id_for(command_id, i), event_type=event_type,
                      schema_version=EVENT_SCHEMA_VERSIONS[event_type], aggregate_type=AGGREGATE_TYPE,
                      aggregate_id=aggregate_id, aggregate_version=state.version + 1,
                      occurred_at=new.occurred_at, recorded_at=recorded_at, command_id=command_id,
                      correlation_id=correlation_id, causation_id=command_id, payload=new.payload)
        state = evolve(state, event)
        envelopes.append(event)
    return state, envelopes, _accepted(command, state, [e.event_id for e in envelopes], recorded_at)


def execute_encoded(state: AccountState, command: CommandEnvelope, recorded_at: str
                    ) -> tuple[AccountState, list[bytes], CommandResult]:
    """``execute`` with the events as their JSON (``EventEnvelope.to_json()``), without building envelopes:
    the handler's hot path. Same state, same bytes, same result (tests/unit/test_handler_core.py)."""
    try:
        new_events = decide(state, command)
    except CommandRejected as e:
        return state, [], _rejection(state, command, e, recorded_at)
    command_id, aggregate_id = command.command_id, command.aggregate_id
    correlation_id = command.correlation_id or command_id
    encoded, event_ids = [], []
    for i, new in enumerate(new_events):
        event_type, payload, version = new.event_type, new.payload, state.version + 1
        event_id = event_id_for(command_id, i)
        # The fields of EventEnvelope.to_dict, in its order.
        encoded.append(dumps({
            "event_id": event_id, "event_type": event_type, "schema_version": EVENT_SCHEMA_VERSIONS[event_type],
            "aggregate_type": AGGREGATE_TYPE, "aggregate_id": aggregate_id, "aggregate_version": version,
            "occurred_at": new.occurred_at, "recorded_at": recorded_at, "command_id": command_id,
            "correlation_id": correlation_id, "causation_id": command_id,
            "payload": payload if type(payload) is dict else dict(payload)}))
        state = evolve_fields(state, event_type, payload, version)
        event_ids.append(event_id)
    return state, encoded, _accepted(command, state, event_ids, recorded_at)


class _Rebalance:
    """Records assignment changes; the handler's loop applies them after ``consume`` returns."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.lock = threading.Lock()
        self.revoked: set[int] = set()

    def on_revoke(self, consumer, partitions):
        self.log(f"handler: partitions revoked: {sorted(tp.partition for tp in partitions)}")
        with self.lock:
            self.revoked |= {tp.partition for tp in partitions}

    on_lost = on_revoke

    def on_assign(self, consumer, partitions):
        # Not assigning here lets the client do the (incremental) assignment itself.
        self.log(f"handler: partitions assigned: {sorted(tp.partition for tp in partitions)}")

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
        self._delivered_events: dict[int, int] = {}
        self._delivered_results: dict[int, int] = {}
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
        s = self.settings
        # The handler's own two clients are librdkafka's (confluent-kafka): kafka-python's pure-Python send path
        # cost more than everything else the handler does (bench/commands.py). Same guarantees: idempotent,
        # acks=all, transactional, read_committed, offsets sent with the group metadata (KIP-447).
        self._producer = confluent_kafka.Producer({
            "bootstrap.servers": s.bootstrap_servers, "transactional.id": self.transactional_id,
            "enable.idempotence": True, "acks": "all", "linger.ms": 20, "batch.size": 1024 * 1024,
            "transaction.timeout.ms": _TRANSACTION_TIMEOUT_MS, "queue.buffering.max.messages": 1_000_000})
        # Fences any older instance with this id and aborts its open transaction before we read state.
        self._producer.init_transactions(60)
        self._reader = kafka_log.make_consumer(s)
        self._watermarks = kafka_log.make_consumer(s, isolation_level="read_uncommitted")
        # Static membership: a restarted instance takes its partitions back without waiting for a timeout.
        self._consumer = confluent_kafka.Consumer({
            "bootstrap.servers": s.bootstrap_servers, "group.id": s.handler_group_id,
            "group.instance.id": self.transactional_id, "isolation.level": "read_committed",
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky", "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 2_000, "max.poll.interval.ms": 60_000, "topic.metadata.refresh.interval.ms": 10_000})
        self._consumer.subscribe([s.commands_topic], on_assign=self._listener.on_assign,
                                 on_revoke=self._listener.on_revoke, on_lost=self._listener.on_lost)

    def close(self) -> None:
        """Snapshot what changed (so the next start is fast), then close the clients."""
        if self._producer is not None and self._consumer is not None and self.settings.snapshot_every_events:
            try:
                self._snapshot([p for p in self.partitions.values() if p.events_since_snapshot])
            except (KafkaError, confluent_kafka.KafkaException) as e:
                self.log(f"handler: no snapshot on close ({e}); the next start reads more of the log")
        for client in (self._consumer, self._reader, self._watermarks):
            if client is not None:
                client.close()
        if self._producer is not None:
            self._producer.flush(30)
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
        self._stopping.clear()
        thresholds = gc.get_threshold()
        gc.set_threshold(*_GC_THRESHOLDS)
        try:
            return self._loop(until_caught_up, deadline, progress_every_s)
        finally:
            gc.set_threshold(*thresholds)

    def _loop(self, until_caught_up: bool, deadline: float | None, progress_every_s: float) -> HandlerStats:
        last_progress = time.monotonic()
        while (deadline is None or time.monotonic() < deadline) and not self._stopping.is_set():
            batch = self._poll()
            self._apply_revocations()
            # Rebuild newly assigned partitions now (not on their first command), so a restart is ready at once.
            for tp in self._assignment():
                self._partition(tp.partition)
            if batch:
                self.process(batch)
            elif until_caught_up and self._caught_up():
                break
            if time.monotonic() - last_progress >= progress_every_s:
                self.log(f"handler {self.instance_id}: {self.stats.line()}")
                last_progress = time.monotonic()
        return self.stats

    def _poll(self) -> dict[TopicPartition, list]:
        """The next batch of command records (confluent-kafka messages), by partition, in offset order."""
        by_partition: dict[int, list] = {}
        for message in self._consumer.consume(num_messages=self.max_poll_records, timeout=0.2):
            if message.error():
                self.log(f"handler {self.instance_id}: consumer error {message.error()}")
                continue
            records = by_partition.get(message.partition())
            if records is None:
                records = by_partition[message.partition()] = []
            records.append(message)
        topic = self.settings.commands_topic
        return {TopicPartition(topic, p): records for p, records in by_partition.items()}

    def _assignment(self) -> set[TopicPartition]:
        return {TopicPartition(tp.topic, tp.partition) for tp in self._consumer.assignment()}

    def stop(self) -> None:
        """Ask ``run()`` (possibly in another thread) to return after the current batch."""
        self._stopping.set()

    def _caught_up(self) -> bool:
        assigned = self._consumer.assignment()
        if not assigned:
            return False
        ends = self._reader.end_offsets([TopicPartition(tp.topic, tp.partition) for tp in assigned])
        positions = {(tp.topic, tp.partition): tp.offset for tp in self._consumer.position(assigned)}
        committed = {(tp.topic, tp.partition): tp.offset for tp in self._consumer.committed(assigned, timeout=10)}
        for tp in assigned:
            key = (tp.topic, tp.partition)
            # Nothing consumed yet since the assignment: the committed offset is where we stand.
            at = positions[key] if positions[key] >= 0 else max(committed[key], 0)
            if at < ends[TopicPartition(tp.topic, tp.partition)]:
                return False
        return True

    def process(self, batch: dict) -> None:
        """Handle one polled batch of command records in one transaction."""
        assigned = self._assignment()
        owned = {tp: self._partition(tp.partition) for tp in batch if tp in assigned}
        if not owned:
            return
        producer = self._producer
        recorded_at = utc_now()
        staged: dict[str, tuple[PartitionState, AccountState]] = {}
        staged_results: dict[str, tuple[PartitionState, CommandResult]] = {}
        stats = HandlerStats(started=self.stats.started)
        self._delivered_events, self._delivered_results = {}, {}
        producer.begin_transaction()
        try:
            offsets = []
            for tp, part in owned.items():
                records = batch[tp]
                events_before = stats.events
                events: list[tuple[bytes, bytes]] = []
                results: list[tuple[bytes, bytes]] = []
                self._handle_records(records, part, staged, staged_results, stats, recorded_at, events, results)
                self._produce_partition(self.settings.events_topic, events, tp.partition, self._on_event_delivered)
                self._produce_partition(self.settings.results_topic, results, tp.partition,
                                        self._on_result_delivered)
                part_events = stats.events - events_before
                offsets.append(confluent_kafka.TopicPartition(tp.topic, tp.partition, records[-1].offset() + 1))
                owned[tp] = (part, part_events)
            commit_started = time.monotonic()
            producer.send_offsets_to_transaction(offsets, self._consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(60)
            self.stats.commit_seconds += time.monotonic() - commit_started
        except confluent_kafka.KafkaException as e:
            error = e.args[0]
            if error.fatal():
                raise HandlerError(f"handler {self.instance_id}: fatal producer error ({error}); e.g. fenced by a "
                                   f"newer instance with transactional id {self.transactional_id}; stopping") from None
            # Typically a rebalance took a partition away mid-batch (KIP-447 fencing of the offset commit).
            # Nothing of this batch is visible; re-read it where we still own the partition.
            self._abort(e, batch, owned)
            return
        # Only a committed transaction changes what the handler believes.
        for tp, (part, part_events) in owned.items():
            part.events_since_snapshot += part_events
            if tp.partition in self._delivered_events:
                part.events_offset = self._delivered_events[tp.partition] + 1
            if tp.partition in self._delivered_results:
                part.results_offset = self._delivered_results[tp.partition] + 1
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
            self._producer.abort_transaction(60)
        except confluent_kafka.KafkaException as e:
            raise HandlerError(f"handler {self.instance_id}: cannot abort after {error!r}: {e!r}") from e
        self.stats.aborted += 1
        self._apply_revocations()
        still = self._assignment()
        for tp in owned:
            if tp in still:
                self._consumer.seek(confluent_kafka.TopicPartition(tp.topic, tp.partition, batch[tp][0].offset()))
        self.log(f"handler {self.instance_id}: transaction aborted ({error!r}); the batch will be redone "
                 f"where this instance still owns the partition")

    def _handle_records(self, records: list, part: PartitionState, staged, staged_results, stats: HandlerStats,
                        recorded_at: str, events: list, results: list) -> None:
        """Handle one partition's command records in order: append their events and results (key, value) to
        ``events`` and ``results``, which ``process`` produces into the open transaction."""
        from_json, add_event, add_result = CommandEnvelope.from_json, events.append, results.append
        first_result, account = part.first_result, part.account
        accepted = rejected = new_events_total = 0
        for record in records:
            value = record.value()
            try:
                command = from_json(value)
            except InvalidRecord as e:
                rejected += self._handle_invalid(record, value, str(e), stats, recorded_at, results)
                continue
            account_id = command.aggregate_id
            command_id = command.command_id
            staged_first = staged_results.get(command_id)
            first = staged_first[1] if staged_first else first_result(account_id, command_id)
            if first is not None and first.aggregate_id == account_id:
                stats.duplicates += 1
                add_result((command_id.encode(), CommandResult(
                    first.command_id, account_id, first.status, first.version, first.event_ids, first.error_type,
                    first.reason, recorded_at, duplicate=True).to_json()))
                continue
            staged_state = staged.get(account_id)
            state = staged_state[1] if staged_state else account(account_id)
            state, new_events, result = execute_encoded(state, command, recorded_at)
            if new_events:
                key = account_id.encode()
                for event in new_events:
                    add_event((key, event))
            if result.status == "accepted":
                staged[account_id] = (part, state)
                accepted += 1
                new_events_total += len(new_events)
            else:
                rejected += 1
            staged_results[command_id] = (part, result)
            add_result((command_id.encode(), result.to_json()))
        stats.commands += len(records)
        stats.accepted += accepted
        stats.rejected += rejected
        stats.events += new_events_total

    def _handle_invalid(self, record, value: bytes | None, reason: str, stats: HandlerStats, recorded_at: str,
                        results: list) -> int:
        """An invalid command record: a readable command with a bad field is rejected with the reason (1 is
        returned: one more rejection); a record that is not a command at all (no command_id to answer to)
        goes to the dead-letter topic with its bytes (0)."""
        result = self._invalid_result(value, reason, recorded_at)
        if result is not None:
            results.append((result.command_id.encode(), result.to_json()))
            return 1
        stats.dead_lettered += 1
        self._produce(self.settings.dead_letters_topic, record.key(),
                      kafka_log.dead_letter_value(reason, value, record.topic(), record.partition(),
                                                  record.offset()))
        return 0

    def _produce_partition(self, topic: str, records: list[tuple[bytes, bytes]], partition: int,
                           on_last_delivered) -> None:
        """Produce ``records`` in order to ``topic``/``partition``. Only the last asks for a delivery report:
        its offset is all the handler needs (what a snapshot covers), and a report per record costs."""
        if not records:
            return
        produce = self._producer.produce
        last = len(records) - 1
        for i, (key, value) in enumerate(records):
            on_delivery = on_last_delivered if i == last else None
            try:
                produce(topic, value, key, partition, on_delivery)
            except BufferError:  # the local queue is full: let it drain, then retry once
                self._producer.poll(1)
                produce(topic, value, key, partition, on_delivery)

    def _produce(self, topic: str, key: bytes | None, value: bytes, partition: int | None = None,
                 on_delivery=None) -> None:
        kwargs = {} if partition is None else {"partition": partition}
        if on_delivery is not None:
            kwargs["on_delivery"] = on_delivery
        try:
            self._producer.produce(topic, value, key, **kwargs)
        except BufferError:  # the local queue is full: let it drain, then retry once
            self._producer.poll(1)
            self._producer.produce(topic, value, key, **kwargs)

    # Delivery reports arrive during commit_transaction: the last offset per partition becomes the offset a
    # snapshot covers.
    def _on_event_delivered(self, error, message) -> None:
        if error is None:
            self._delivered_events[message.partition()] = message.offset()

    def _on_result_delivered(self, error, message) -> None:
        if error is None:
            self._delivered_results[message.partition()] = message.offset()

    def _invalid_result(self, value: bytes | None, reason: str, recorded_at: str) -> CommandResult | None:
        """A rejection for an invalid command whose command_id can be read; None when it cannot."""
        try:
            obj = json.loads(value)
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
                    self._produce(topic, key, value, part.partition)
            self._producer.commit_transaction(60)
        except confluent_kafka.KafkaException:
            self._producer.abort_transaction(60)
            raise
        for part in parts:
            part.events_since_snapshot = 0
        self.stats.snapshots += len(parts)
