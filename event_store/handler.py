"""The command handler's transaction loop: the single writer of the events topic, scaled out through a
consumer group.

Each instance consumes some partitions of the commands topic (a Kafka consumer group shares them out),
decides each command against in-memory aggregate state (``event_store.decider``), and writes the resulting
events, the command results and the consumer offsets in ONE Kafka transaction. Readers use ``read_committed``,
so a crash mid-batch leaves no trace and the batch is redone on restart.

Commands partition ``p`` maps to events partition ``p`` (events are written to the partition their command
came from), so an instance that is assigned partition ``p`` rebuilds exactly that partition's aggregates
(``event_store.partition_rebuild``): from the latest snapshot (``event_store.snapshots``) plus the events and
results after it. On revoke the partition's state is dropped. The transactional id is stable per instance
(``<group>-<instance id>``) and the offsets are sent with the consumer's group metadata (KIP-447), so a zombie
instance is fenced. Its Kafka clients come from ``event_store.kafka_clients``. See docs/DESIGN.md.

This module is the coordinator; each of its jobs has a module: what a batch's records come to
(``event_store.batch_decision``, pure), the producer, its transactions, retries and fencing
(``event_store.handler_transactions``), the group membership and the consumer (``event_store.handler_group``),
the snapshots' schedule (``event_store.handler_snapshots``) and the counters (``event_store.handler_stats``).
"""
from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Callable

import confluent_kafka
from kafka import TopicPartition

from event_store import kafka_clients, kafka_log
from event_store.batch_decision import (PRODUCER_MESSAGE_MAX_BYTES, DeadLetter, DecisionCounts, RecordLimits,
                                        StagedChanges, command_ids, decide_records, fit_result, version_of)
from event_store.collector import CollectorPaced
from event_store.decider import EventTimeLimit
from event_store.keys_topic import KeysTopicError
from event_store.personal_data import KeyRaceLost
from event_store.sealing import Sealer
from lakehouse.lineage import Lineage, LineageRun, kafka_topic
from event_store.envelope import CommandResult, format_time, utc_now
from event_store.handler_group import GroupMembership, check_partition_counts
from event_store.handler_stats import HandlerStats
from event_store.handler_transactions import (BROKER_AWAY_ERRORS, REBALANCE_ERRORS,
                                              TRANSACTION_TIMEOUT_MS, HandlerError, PartitionsMoved,
                                              TransactionalProducer)
from event_store.partition_rebuild import PartitionRebuilder, RebuildStats
from event_store.handler_snapshots import SnapshotSchedule, snapshot_due
from event_store.snapshots import PartitionState
from lakehouse.settings import Settings

__all__ = ["CommandHandler", "HandlerStats", "HandlerError", "snapshot_due"]


class _Stopping(Exception):
    """``stop()`` was called while the handler waited (for the broker, a rebuild, a commit): unwind now."""


# Returned by _transact when a rebalance took a partition away mid-transaction (its records come again).
_LOST = object()
# A command whose own transaction fails this many times (non-retriable errors) is answered NotWritable.
_SINGLE_COMMAND_ATTEMPTS = 3


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
        self.stats = HandlerStats()
        self._stopping = threading.Event()
        # Which commands partitions this instance owns; its consumer (event_store.handler_group).
        self.group = GroupMembership(settings, instance_id, self.transactional_id, log, self.max_poll_records,
                                     self.partitions, self.stats, check_stop=self._check_stop)
        # Rebuilds partitions on assignment; its skipped records are counted in self.stats.
        self._rebuilder = PartitionRebuilder(settings, instance_id, log, use_snapshots, counts=self.stats,
                                             tick=self.group.keepalive, wait=self.group.wait,
                                             stable_wait_s=TRANSACTION_TIMEOUT_MS / 1000 + 15)
        # The most bytes one record may take, per topic written (set by start(): see _read_size_limits).
        self.limits: RecordLimits | None = None
        self._delivered_events: dict[int, int] = {}
        self._delivered_results: dict[int, int] = {}
        # The broker's refusals of this transaction's records (delivery reports with an error): the cause of an
        # abort that a later call may report only as "Erroneous state".
        self._refused: list = []
        self._tx: TransactionalProducer | None = None  # the transactional producer (start() makes it)
        # The partitions' snapshots, a step after each commit (event_store.handler_snapshots).
        self.snapshots = SnapshotSchedule(settings, instance_id, log, self.stats, self.partitions, _Stopping)
        # Personal data sealed under each subject's key before it reaches the events topic (personal_data_seal;
        # event_store.sealing); with it off, forgotten subjects' commands are refused all the same.
        self.sealer = Sealer.for_settings(settings)
        # Its OpenLineage run (lakehouse.lineage): started with the handler, ended by close().
        self.lineage = Lineage.for_settings(settings, log)
        self._lineage_run: LineageRun | None = None

    @property
    def rebuilds(self) -> list[RebuildStats]:
        """How each partition's state came back, in the order of the rebuilds."""
        return self._rebuilder.rebuilds

    @property
    def record_limits(self) -> dict[str, int]:
        """The most bytes one record may take, per topic the handler writes to (known once started)."""
        return self.limits.record_limits if self.limits is not None else {}

    @property
    def transactional_id(self) -> str:
        return f"{self.settings.handler_group_id}-{self.instance_id}"

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        kafka_log.ensure_topics(self.settings, log=self.log)
        check_partition_counts(self.settings)
        s = self.settings
        batch_bytes = self._read_size_limits()
        # The handler's own two clients are librdkafka's (confluent-kafka): kafka-python's pure-Python send path
        # cost more than everything else the handler does (bench/commands.py). Same guarantees: idempotent,
        # acks=all, transactional, read_committed, offsets sent with the group metadata (KIP-447).
        config = kafka_clients.transactional_producer_config(
            s, self.transactional_id, batch_bytes=batch_bytes, message_max_bytes=PRODUCER_MESSAGE_MAX_BYTES,
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS)
        self._tx = TransactionalProducer(config, self.instance_id, self.transactional_id, self.log, self.stats,
                                         keepalive=self.group.keepalive, wait=self.group.wait,
                                         drop_state=self.group.drop_partitions, read_again=self.group.seek_committed)
        # Fences any older instance with this id and aborts its open transaction before we read state.
        self._tx.init(60)
        self.snapshots.tx = self._tx
        if self.sealer.sealing:
            self.log(f"handler {self.instance_id}: personal data is sealed under its subjects' keys in "
                     f"{self.sealer.keys.directory} (personal_data_seal=on; docs/forgetting.md)")
        self._rebuilder.open()
        self.group.join()
        keys = (s.keys_topic,) if self.sealer.sealing and self.sealer.keys.topic is not None else ()
        self._lineage_run = self.lineage.start(
            f"handler.{s.handler_group_id}", [kafka_topic(s, s.commands_topic)],
            [kafka_topic(s, topic) for topic in (s.events_topic, s.results_topic, s.dead_letters_topic,
                                                 s.snapshots_topic, *keys)])

    def _read_size_limits(self) -> int:
        """Read what one record may weigh in each topic the handler writes commands' outcomes to (the topic's
        max.message.bytes, capped by the producer's message.max.bytes); returns the producer's batch.size."""
        s = self.settings
        topics = (s.events_topic, s.results_topic, s.dead_letters_topic)
        self.limits = RecordLimits.of(*topics, kafka_log.max_message_bytes(s, topics))
        return self.limits.batch_bytes

    def close(self, error: BaseException | None = None) -> None:
        """Snapshot what changed (so the next start is fast), then close the clients. Bounded in time: with the
        broker away nothing is snapshotted (the next start reads more of the log; nothing is lost). The run's
        lineage ends as COMPLETE, or FAIL with ``error``."""
        run, self._lineage_run = self._lineage_run, None
        if run is not None:
            if error is None:
                self.lineage.complete(run)
            else:
                self.lineage.fail(run, error)
        if self._tx is not None and self.group.consumer is not None and self.settings.snapshot_every_events:
            self.snapshots.on_close([p for p in self.partitions.values() if p.events_since_snapshot])
        self.group.close()
        self._rebuilder.close()
        if self._tx is not None:
            self._tx.flush()
        self._tx = None

    def __enter__(self) -> "CommandHandler":
        self.start()
        return self

    def __exit__(self, kind, error, trace) -> None:
        self.close(error if isinstance(error, Exception) else None)

    def _check_stop(self) -> None:
        """Unwind now (raise _Stopping) when stop() was called: the group's keepalive asks between long work's
        steps."""
        if self._stopping.is_set():
            raise _Stopping()

    def run(self, until_caught_up: bool = False, max_seconds: float | None = None,
            progress_every_s: float = 5.0) -> HandlerStats:
        if self.group.consumer is None:
            self.start()
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        self._stopping.clear()
        try:
            with CollectorPaced() as collector:  # event_store.collector: short collections between batches
                return self._loop(until_caught_up, deadline, progress_every_s, collector)
        except _Stopping:
            self.log(f"handler {self.instance_id}: stopped while waiting; nothing uncommitted is kept (the "
                     f"commands of an unfinished transaction are handled on the next start)")
            return self.stats

    def _loop(self, until_caught_up: bool, deadline: float | None, progress_every_s: float,
              collector: CollectorPaced) -> HandlerStats:
        last_progress = time.monotonic()
        while (deadline is None or time.monotonic() < deadline) and not self._stopping.is_set():
            batch = self.group.poll()
            # Newly assigned partitions are rebuilt now (not on their first command), so a restart is ready at once.
            self.group.rebuild_unready(self._rebuilder)
            self.group.rejoin_if_stuck()
            if batch:
                self.process(batch)
            elif until_caught_up and self.group.caught_up(self._rebuilder.reader.end_offsets):
                # Caught up means readable too: a projection run until caught up next sees every event written.
                self._rebuilder.wait_until_visible(self.partitions, TRANSACTION_TIMEOUT_MS / 1000)
                break
            else:  # idle: what the last writes mapped of the state stores is handed back
                for part in list(self.partitions.values()):
                    if part.store is not None:
                        part.store.settle()
            collector.tick()
            self.stats.collections, self.stats.collector_seconds = collector.collections, collector.seconds
            self.stats.longest_collection_s = collector.longest_s
            if time.monotonic() - last_progress >= progress_every_s:
                self.log(f"handler {self.instance_id}: {self.stats.line()}")
                last_progress = time.monotonic()
        return self.stats

    def stop(self) -> None:
        """Ask ``run()`` (possibly in another thread, or a signal handler) to return: after the current batch,
        or at once when it waits (for the broker, a rebuild, a commit)."""
        self._stopping.set()

    # -- transactions ------------------------------------------------------------------------------
    def process(self, batch: dict) -> None:
        """Handle one polled batch of command records in one transaction. Never loops on a batch: if its
        transaction fails for any reason but a rebalance, its commands are redone one per transaction, and a
        command that cannot be written even alone is answered NotWritable and skipped."""
        started = time.monotonic()
        try:
            self._process(batch)
        finally:
            self.stats.batches += 1
            self.stats.batch_seconds += time.monotonic() - started

    def _process(self, batch: dict) -> None:
        failure = self._transact(batch)
        while failure is not None and failure is not _LOST and failure.code() in BROKER_AWAY_ERRORS:
            self._tx.wait_for_broker(failure, "redoing a transaction", self.settings.events_topic)
            failure = self._transact(batch)
        if failure is None or failure is _LOST:
            return
        self.stats.batch_retries += 1
        count = sum(len(records) for records in batch.values())
        self.log(f"handler {self.instance_id}: a transaction of {count} commands failed ({failure}); redoing them "
                 f"one command per transaction")
        for tp, records in batch.items():
            for record in records:
                if tp.partition not in self.partitions or not self._process_single(tp, record):
                    break  # the partition moved or rewound: its records come again from the consumer

    def _process_single(self, tp: TopicPartition, record) -> bool:
        """One command in transactions of its own; False when a rebalance took its partition (rewound)."""
        failure = None
        refusals: dict = {}  # the broker's own words on this command's records, over its attempts
        for attempt in range(1, _SINGLE_COMMAND_ATTEMPTS + 1):
            failure = self._transact({tp: [record]})
            while failure is not None and failure is not _LOST and failure.code() in BROKER_AWAY_ERRORS:
                # The broker's absence is no fault of this command: it does not count as an attempt.
                self._tx.wait_for_broker(failure, "redoing a command's transaction", self.settings.events_topic)
                failure = self._transact({tp: [record]})
            if failure is None:
                return True
            if failure is _LOST:
                return False
            self.stats.command_retries += 1
            for error in self._refusals():
                refusals.setdefault(error.code(), error)
            self.log(f"handler {self.instance_id}: command record {tp.topic}/{tp.partition}/{record.offset()}: its "
                     f"own transaction failed ({failure}), attempt {attempt} of {_SINGLE_COMMAND_ATTEMPTS}")
            self.group.wait(0.5 * attempt)
        return self._reject_unwritable(tp, record, failure, list(refusals.values()))

    def _transact(self, batch: dict):
        """``batch`` in one transaction: None once committed, _LOST when a rebalance took a partition away (the
        consumer is rewound where it still owns them), else the Kafka error the transaction was aborted for."""
        owned = {}
        for tp, records in batch.items():
            part = self.partitions.get(tp.partition)
            if part is None:  # not rebuilt yet, or revoked: its records are read again when it is ready
                self.group.rewind(tp, records[0].offset())
            else:
                owned[tp] = part
        if not owned:
            return None
        tx = self._tx
        now = datetime.now(timezone.utc)
        recorded_at = format_time(now)
        time_limit = EventTimeLimit.at(now, self.settings.max_event_time_ahead_s)
        staged = StagedChanges()
        counts = DecisionCounts()
        self.sealer.refresh()  # a subject forgotten meanwhile is refused from this transaction on
        self._delivered_events, self._delivered_results, self._refused = {}, {}, []
        generations = {tp.partition: self.group.generation.get(tp.partition) for tp in owned}
        tx.begin()
        try:
            offsets = []
            for tp, part in owned.items():
                records = batch[tp]
                events_before = counts.events
                writes = decide_records(records, part, staged, counts, recorded_at, time_limit, self.limits,
                                        self.sealer)
                for dead_letter in writes.dead_letters:
                    self._produce_dead_letter(dead_letter)
                tx.produce_partition(self.settings.events_topic, writes.events, tp.partition,
                                     self._on_event_delivered)
                tx.produce_partition(self.settings.results_topic, writes.results, tp.partition,
                                     self._on_result_delivered)
                part_events = counts.events - events_before
                offsets.append(confluent_kafka.TopicPartition(tp.topic, tp.partition, records[-1].offset() + 1))
                owned[tp] = (part, part_events)
            self.sealer.sync()  # the keys this transaction's tokens need are durable before its events are
            tx.commit(offsets, lambda: self.group.consumer.consumer_group_metadata(),
                      lambda: self.group.moved(generations))
        except _Stopping:
            self._tx.abort_quietly()
            raise
        except (KeyRaceLost, KeysTopicError) as e:
            # The keys this batch sealed with are not settled on the keys topic (another instance made one of them
            # first, or the topic cannot be written): nothing of it may commit. Decided again, it seals with the
            # keys the topic holds.
            self._tx.abort(e)
            for tp in owned:
                self.group.rewind(tp, batch[tp][0].offset())
            self.log(f"handler {self.instance_id}: transaction aborted: {e}; its commands are read again")
            return _LOST
        except PartitionsMoved as e:
            # Committing could only fail now (KIP-447 fences the offsets of the old generation): abort, and
            # read the records again where this instance still owns the partition.
            self._tx.abort(e)
            if e.in_flight:  # the producer was renewed: the call it abandoned may have committed
                self._count_if_committed_anyway(owned, batch, counts, e)
            for tp in owned:
                self.group.rewind(tp, batch[tp][0].offset())
            self.log(f"handler {self.instance_id}: transaction aborted: {e}; its commands are read again where "
                     f"this instance still owns the partition")
            return _LOST
        except confluent_kafka.KafkaException as e:
            error = e.args[0]
            if error.fatal():
                self._tx.renew(error)  # its open transaction is ended; every partition is rebuilt
                self._count_if_committed_anyway(owned, batch, counts, error)
                return _LOST
            self._tx.abort(error)
            lost = [tp for tp in owned if tp.partition not in self.partitions]
            if lost or error.code() in REBALANCE_ERRORS:
                # A rebalance took a partition away mid-batch (KIP-447 fencing of the offset commit). Nothing
                # of this batch is visible; it is read again where this instance still owns the partition.
                for tp in owned:
                    self.group.rewind(tp, batch[tp][0].offset())
                self.log(f"handler {self.instance_id}: transaction aborted after a rebalance ({error}); its "
                         f"commands are read again where this instance still owns the partition")
                return _LOST
            return error
        # Only a committed transaction changes what the handler believes.
        for tp, (part, part_events) in owned.items():
            part.events_since_snapshot += part_events
            part.events_held += part_events
            if tp.partition in self._delivered_events:
                part.events_offset = self._delivered_events[tp.partition] + 1
            if tp.partition in self._delivered_results:
                part.results_offset = self._delivered_results[tp.partition] + 1
        for key, (part, state) in staged.states.items():
            part.states[key] = state
        for part, result in staged.results.values():
            if result.aggregate_id and result.error_type != "InvalidCommand":
                part.remember(result)  # its events' ids are derived (decider.event_id_for): not kept
        # Then the state store: the batch's changes with the positions, in one LMDB transaction (an aborted batch
        # never gets here; a kill -9 before it only leaves the store behind, and the next start reads the tail).
        for part, _ in owned.values():
            part.flush()
        counts.add_to(self.stats)
        self.stats.transactions += 1
        self.snapshots.after_commit()
        return None

    def _count_if_committed_anyway(self, owned: dict, batch: dict, counts: DecisionCounts, error) -> None:
        """After a renewal: a commit whose call failed (or hung) may have gone through at the broker before the old
        producer gave up (the new producer's init_transactions then completes it instead of aborting it). Its
        offsets went with it: where the committed offsets read again stand at the batch's end, its commands and
        events are in the log (the rebuilt partitions hold them) and count as this instance's."""
        ends = {tp.partition: batch[tp][-1].offset() + 1 for tp in owned}
        if all(self.group.read_again_from.get(p) == end for p, end in ends.items()):
            counts.add_to(self.stats)
            self.stats.transactions += 1
            self.log(f"handler {self.instance_id}: the transaction the failed producer was committing ({error}) "
                     f"went through all the same: {counts.commands} commands, {counts.events} events")

    def _reject_unwritable(self, tp: TopicPartition, record, failure, refusals: list = ()) -> bool:
        """The last resort for a command whose own transaction keeps failing: answer it with a rejection naming
        the Kafka error (no command id: dead-letter it) and commit its offset, so that it never holds back the
        commands after it. Returns False when a rebalance took the partition meanwhile."""
        s = self.settings
        part = self.partitions[tp.partition]
        value = record.value()
        where = f"{tp.topic}/{tp.partition}/{record.offset()}"
        reason = (f"command record {where} could not be written, even in {_SINGLE_COMMAND_ATTEMPTS} transactions "
                  f"of its own: {failure}")
        unsaid = [str(error) for error in refusals if error.name() not in str(failure)]
        if unsaid:  # the abort's cause, where the last attempt's error does not name it
            reason += f"; the broker refused its records: {', '.join(unsaid)}"
        ids = command_ids(value)
        result = None
        if ids is not None:
            command_id, aggregate_id = ids
            result = fit_result(CommandResult(
                command_id, aggregate_id, "rejected", version_of(part, value), error_type="NotWritable",
                reason=reason, recorded_at=utc_now()), self.limits)
        generations = {tp.partition: self.group.generation.get(tp.partition)}
        for with_answer in (True, False):
            self._tx.begin()
            try:
                if with_answer and result is not None:
                    self._tx.produce(s.results_topic, result.command_id.encode(), result.to_json(), tp.partition)
                elif with_answer:
                    self._produce_dead_letter(DeadLetter(record.key(), reason, value, tp.topic, tp.partition,
                                                         record.offset()))
                self._tx.commit([confluent_kafka.TopicPartition(tp.topic, tp.partition, record.offset() + 1)],
                                lambda: self.group.consumer.consumer_group_metadata(),
                                lambda: self.group.moved(generations))
            except _Stopping:
                self._tx.abort_quietly()
                raise
            except PartitionsMoved as e:
                self._tx.abort(e)
                self.group.rewind(tp, record.offset())
                return False
            except confluent_kafka.KafkaException as e:
                error = e.args[0]
                if error.fatal():
                    self._tx.renew(error)  # every partition is rebuilt: this record comes again
                    return False
                self._tx.abort(error)
                if tp.partition not in self.partitions or error.code() in REBALANCE_ERRORS:
                    self.group.rewind(tp, record.offset())
                    return False
                if error.code() in BROKER_AWAY_ERRORS:
                    # The broker's absence is no fault of this command: write the same rejection once it answers.
                    self._tx.wait_for_broker(error, "writing the rejection again", self.settings.events_topic)
                    return self._reject_unwritable(tp, record, failure)
                self.log(f"handler {self.instance_id}: cannot write the rejection of {where} either ({error})")
                continue
            self.stats.commands += 1
            self.stats.rejected += 1
            self.stats.unwritable += 1
            self.stats.transactions += 1
            if with_answer and result is not None:
                if result.aggregate_id:
                    part.remember(result)
                    part.flush()
                self.log(f"handler {self.instance_id}: command {result.command_id} ({where}) rejected NotWritable "
                         f"and skipped: {failure}")
            else:
                self.log(f"handler {self.instance_id}: command record {where} SKIPPED "
                         f"{'(dead-lettered)' if with_answer else 'UNANSWERED'}: {failure}")
            return True
        raise HandlerError(f"handler {self.instance_id}: nothing can be written for command record {where}, not "
                           f"even its offset ({failure}); stopping")

    def _produce_dead_letter(self, dead_letter: DeadLetter) -> None:
        """A record that is no command, with the reason and its bytes (as much as the topic takes of them)."""
        d = dead_letter
        self._tx.produce(self.settings.dead_letters_topic, d.key, kafka_log.dead_letter_value(
            d.reason, d.value, d.topic, d.partition, d.offset, max_bytes=self.limits.max_dead_letter_bytes))

    # Delivery reports arrive during commit_transaction: the last offset per partition becomes the offset a
    # snapshot covers.
    def _on_event_delivered(self, error, message) -> None:
        if error is None:
            self._delivered_events[message.partition()] = message.offset()
        else:
            self._refused.append(error)

    def _on_result_delivered(self, error, message) -> None:
        if error is None:
            self._delivered_results[message.partition()] = message.offset()
        else:
            self._refused.append(error)

    def _refusals(self) -> list:
        """The errors the broker refused this transaction's records with (its delivery reports served first:
        after an abort they may still wait in the producer's queue)."""
        self._tx.producer.poll(0)
        return self._refused
