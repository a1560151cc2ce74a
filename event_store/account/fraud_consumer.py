"""The fraud detector as a plain Kafka consumer: the rules of ``fraud_rules`` per account, findings in well under a
second, no JVM. What ``eventlake detect-fraud`` runs by default; ``spark_apps.fraud_detector`` is the same detector as
a Structured Streaming app (``--engine spark``, and ``eventlake spark-submit fraud-detector`` on a cluster).

A Spark micro-batch has a floor of seconds (bench/freshness.py measured a payment -> ``FraudSuspected`` p50 of 6 s
with it); this consumer polls the events topic (``read_committed``), folds each account's new events in version
order through ``detect`` and sends each finding at once as a ``FlagFraud`` command, like the Spark app (the same
command: id derived from payment and rule, so a repeat is answered by the handler as a duplicate).

**State and restarts.** Each account's ``FraudState`` lives on disk, in a state store per partition of the events
topic (an account's events are in one partition): LMDB under ``<home>/fraud-detector-state/<topic>-<partition>``
(``event_store.state_store``; each state's JSON zlib-compressed, ~4x smaller: LMDB keeps it on its leaf pages
and the cache holds more), with the offset it is complete up to in the same transaction. What the detector holds
in memory is what changed since the last store write and a cache of encoded states bounded by the setting
``fraud_state_cache_mb`` (issue 42: its memory follows the cache and the recent traffic, not the number of
accounts). About once a second, on a stop and when a partition is taken away, the changed states are written with
that offset, *after* every finding up to it was delivered. The states keep device locations sealed (as the events
had them), so no location reaches the disk in clear.

A state store is local to its machine. For an instance elsewhere (a pod that lost its disk, another host taking the
partition), every ``snapshot_every_s`` seconds (first soon after start) and on a stop each partition's store is also
streamed to ``<checkpoints>/fraud-detector-consumer/partition-<n>.json`` (local folders and storage URIs alike,
``lakehouse.storage``; a header line with topic, partition and offset, then one line per account; written whole and
renamed into place). A partition assigned to this consumer starts from whichever of the two is further on (the
snapshot is copied into the store first), or from the log's start without either. After a crash the events since
then are read again: the state skips nothing it had not seen (``detect`` ignores versions it has folded), and the
findings they cause again carry the same command ids. So no finding is lost and none is recorded twice.

**Scale-out.** Instances share the consumer group ``<topic prefix>fraud-detector`` (``fraud_detector_group_id``):
each owns some partitions and their snapshots; a rebalance hands a partition over with its snapshot. The group's
committed offsets mirror the snapshots (for lag tools); they are never read back.

**Bad records** (not JSON, not a valid event: written around the handler) are skipped with a line naming partition,
offset and reason; they are the projection's dead letters, not the detector's.
"""
from __future__ import annotations

import threading
import time
import zlib
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterable

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from event_store import kafka_clients, kafka_log
from event_store.collector import CollectorPaced
from event_store.account import AGGREGATE_TYPE
from event_store.account.fraud_rules import FraudState, Observation, detect, flag_command_id
from event_store.account.fraud_state import (SNAPSHOT_FOLDER, STATE_FOLDER, STATE_KIND, HeldPartition, encode_state, snapshot_header, snapshot_states,
                                             state_store_path)
from event_store.envelope import CommandEnvelope, EventEnvelope, dumps, format_time, parse_time, utc_now
from event_store.errors import InvalidRecord
from event_store.personal_data import SubjectForgotten, is_sealed, token_subject
from event_store.sealing import Unsealer
from event_store.state_store import StateStore
from lakehouse.metrics import Sample, consumer_lag_samples
from lakehouse.settings import Settings
from lakehouse.storage import write_chunks

__all__ = ["event_time_ms", "FraudConsumer", "FraudStats", "figures", "findings_for", "observation"]

_STORE_EVERY_S = 1.0  # how often the changed states go to the state stores
_RESTORE_CHUNK = 10_000  # states per transaction when a snapshot is copied into a store
# Sealed locations remembered, the least recently used dropped first (each sealed once while remembered). An entry
# costs ~400 bytes (the key's two strings, the token, the dict's slot): 100,000 held ~40 MB, which a soak at 100k
# accounts saw as the detector growing for most of an hour (bench/README.md).
_TOKENS_HELD = 16_384
INPUT_TYPES = frozenset({"PaymentAuthorized", "PaymentDeclined", "DeviceLocationReported"})
_INPUT_MARKERS = tuple(t.encode() for t in sorted(INPUT_TYPES))  # looked for in the raw bytes before parsing
_CALL_TIMEOUT_S = 5.0
_MAX_RECORDS = 5_000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def event_time_ms(occurred_at: str) -> int:
    """Epoch milliseconds of an event time, truncated toward zero like the Spark app's ``unix_micros / 1000``."""
    delta = parse_time(occurred_at, "occurred_at") - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return micros // 1000 if micros >= 0 else -((-micros) // 1000)


def observation(event: EventEnvelope) -> Observation:
    p = event.payload
    amount = p.get("amount_minor")
    return Observation(event.event_type, int(event.aggregate_version), event_time_ms(event.occurred_at),
                       p.get("payment_id"), None if amount is None else int(amount), p.get("location"))


def findings_for(states, events: Iterable[EventEnvelope]) -> list[CommandEnvelope]:
    """Pure: fold ``events`` (any order; each account's in version order, as the Spark app sorts a batch) into
    ``states`` (changed in place) and return the ``FlagFraud`` commands of the findings, in the order found."""
    by_account: dict[str, list[EventEnvelope]] = defaultdict(list)
    for e in events:
        by_account[e.aggregate_id].append(e)
    commands = []
    issued_at = utc_now()
    for account, account_events in by_account.items():
        state = states.get(account) or FraudState()
        for e in sorted(account_events, key=lambda e: e.aggregate_version):
            state, found = detect(state, observation(e))
            for f in found:
                command_id = flag_command_id(f.payment_id, f.rule)
                occurred = format_time(_EPOCH + timedelta(milliseconds=f.time_ms))
                commands.append(CommandEnvelope(
                    command_id=command_id, command_type="FlagFraud", aggregate_id=account,
                    aggregate_type=AGGREGATE_TYPE,
                    payload={"payment_id": f.payment_id, "rule": f.rule, "evidence": f.evidence,
                             "occurred_at": occurred},
                    issued_at=issued_at, correlation_id=command_id, causation_id="fraud-detector"))
        states[account] = state
    return commands


@dataclass
class FraudStats:
    events: int = 0
    observed: int = 0
    findings: int = 0
    skipped: int = 0
    snapshots: int = 0  # snapshots under the checkpoints
    state_writes: int = 0  # writes of the changed states to the state stores
    consumers_renewed: int = 0  # consumers replaced after not rejoining their group (kafka_clients.RejoinWatch)
    by_rule: dict[str, int] = field(default_factory=dict)  # rule -> FlagFraud commands sent
    accounts: int = 0  # accounts whose state this instance holds (its partitions'), as of the last lag refresh
    lag: dict[int, int] = field(default_factory=dict)  # partition -> events past this instance (kafka_clients.LagWatch)
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        return (f"{self.events} events read ({self.observed} payments and device reports), {self.findings} FlagFraud "
                f"commands sent, {self.skipped} unreadable events skipped, {self.state_writes} state writes, "
                f"{self.snapshots} state snapshots written"
                + (f", {self.consumers_renewed} consumers renewed after not rejoining their group"
                   if self.consumers_renewed else ""))


def figures(stats: FraudStats) -> list[Sample]:
    """The fraud detector's Prometheus figures (``lakehouse.metrics``), read from ``stats`` at scrape time."""
    c = "counter"
    return [Sample("fraud_detector_events", c, "Events records read", stats.events),
            Sample("fraud_detector_observed_events", c, "Payments and device reports folded", stats.observed),
            *[Sample("fraud_detector_findings", c, "FlagFraud commands sent, by rule", n, {"rule": rule})
              for rule, n in sorted(dict(stats.by_rule).items())],
            Sample("fraud_detector_skipped_events", c, "Unreadable events records skipped", stats.skipped),
            Sample("fraud_detector_snapshots", c, "State snapshots written", stats.snapshots),
            Sample("fraud_detector_consumers_renewed", c, "Consumers replaced after not rejoining their group",
                   stats.consumers_renewed),
            Sample("fraud_detector_state_accounts", "gauge", "Accounts whose state this instance holds",
                   stats.accounts),
            *consumer_lag_samples(stats.lag)]


class FraudConsumer:
    """Consume events, send ``FlagFraud`` commands. ``run()`` until stopped, or until caught up.

    Like the fraud policy: a broker that goes away is waited out (librdkafka reconnects by itself), commands the
    broker did not take are sent again, and ``stop()`` (SIGTERM) ends ``run()`` within seconds whatever it waits
    for. A state is written only after every finding before its offset was delivered."""

    def __init__(self, settings: Settings, log: Callable[[str], None] = print, snapshot_every_s: float = 300.0):
        self.settings = settings
        self.log = log
        self.snapshot_every_s = snapshot_every_s
        self.stats = FraudStats()
        self.folder = settings.checkpoints / SNAPSHOT_FOLDER
        self._stopping = threading.Event()
        self._partitions: dict[int, HeldPartition] = {}
        # The states' cache, encoded (a decoded state takes ~6x its encoded size), shared out over the partitions.
        self._cache_bytes = (max(settings.fraud_state_cache_mb, 0) << 20) // max(settings.topic_partitions, 1)
        self._at_end: set[int] = set()
        self._broker_error: str | None = None
        self._sender: kafka_clients.RecordSender | None = None
        self._consumer = None
        # Sealed locations back in clear for the rules (null once forgotten; event_store.sealing). The stored
        # states keep them sealed again, under the subject their events named (account -> subject, for the
        # accounts changed since the last store write), so no location reaches the disk in clear;
        # (subject, location) -> its token, made once while remembered.
        self._unsealer = Unsealer(settings)
        self._subjects: dict[str, str] = {}
        self._tokens: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._rejoin = kafka_clients.RejoinWatch()
        self._lag = kafka_clients.LagWatch()

    def stop(self) -> None:
        self._stopping.set()

    # -- state stores and snapshots --------------------------------------------------------------------------
    def _snapshot_path(self, partition: int):
        return self.folder / f"partition-{partition}.json"

    def _load(self, partition: int) -> HeldPartition:
        path = self._snapshot_path(partition)
        try:
            header = snapshot_header(path)
        except (OSError, ValueError) as e:
            raise RuntimeError(f"fraud detector: cannot read the state snapshot {path}: {e}; move it away to "
                               f"rebuild the state of partition {partition} from the log's start") from None
        if header is not None and header.get("topic") != self.settings.events_topic:
            raise RuntimeError(f"fraud detector: the state snapshot {path} is of topic {header.get('topic')!r}, "
                               f"not {self.settings.events_topic!r}; move it away to start over")
        store = StateStore(state_store_path(self.settings, partition), cache_bytes=self._cache_bytes)
        stored = store.positions()
        snapshot_offset = -1 if header is None else int(header["offset"])
        if header is not None and (stored is None or stored[0] < snapshot_offset):
            self._restore(store, path, header)
            stored = store.positions()
        offset = OFFSET_BEGINNING if stored is None else stored[0]
        return HeldPartition(partition, store, offset, snapshot_offset, self._opened)

    def _restore(self, store: StateStore, path, header: dict) -> None:
        """Copy the snapshot at ``path`` into ``store`` (emptied first), streamed: a partition's states need not
        fit in memory."""
        store.clear()
        chunk: dict = {}
        for account, raw in snapshot_states(path, header):
            chunk[(STATE_KIND, account)] = zlib.compress(raw, 1)
            if len(chunk) >= _RESTORE_CHUNK:
                store.restore(chunk, (), {}, 0)
                chunk = {}
        if chunk:
            store.restore(chunk, (), {}, 0)
        store.write(int(header["offset"]), 0, meta=dumps({"written_at": header.get("written_at", "")}), mark=False)
        self.log(f"fraud detector: partition {header['partition']}'s state copied from the snapshot {path}")

    def _opened(self, account: str, state: FraudState) -> FraudState:
        """A stored state, its sealed device locations unsealed (null once forgotten)."""
        if not any(is_sealed(location) for _, location in state.devices):
            return state
        plain: dict = {}  # token -> value: the stored tokens of one location are one (see _sealed)
        for _, location in state.devices:
            if is_sealed(location) and location not in plain:
                self._subjects[account] = token_subject(location)
                plain[location] = self._unsealer.value(location, "location")
        return replace(state, devices=tuple((t, plain.get(location, location)) for t, location in state.devices))

    def _sealed(self, account: str, state: FraudState) -> tuple:
        """``encode_state`` of a state to store, the device locations sealed under the account's subject when
        its events were sealed (a forgotten subject's: null)."""
        subject = self._subjects.get(account)
        if subject is None or not state.devices:
            return encode_state(state)
        tokens = self._tokens
        devices = []
        for t, location in state.devices:
            token = None
            if location is not None:
                token = tokens.get((subject, location))
                if token is not None:
                    tokens.move_to_end((subject, location))
                else:
                    try:
                        token = tokens[(subject, location)] = self._unsealer.keys.seal(subject, "location", location)
                    except SubjectForgotten:
                        token = None
                    while len(tokens) > _TOKENS_HELD:
                        tokens.popitem(last=False)
            devices.append((t, token))
        return encode_state(replace(state, devices=tuple(devices)))

    def _save(self, held: HeldPartition) -> None:
        """The changed states and the offset they are complete up to, in one write of the state store."""
        if held.offset < 0 or (held.offset == held.saved_offset and not held.dirty):
            return
        states = {}
        for account, state in held.dirty.items():
            states[(STATE_KIND, account)] = zlib.compress(dumps(self._sealed(account, state)), 1)
            self._subjects.pop(account, None)
        if not held.store.write(held.offset, 0, states, meta=dumps({"written_at": utc_now()}), mark=False):
            self.log(f"fraud detector: partition {held.number}'s state store covers more than this instance "
                     f"(another instance owns it now); nothing written")
        held.dirty.clear()
        held.saved_offset = held.offset
        self.stats.state_writes += 1

    def _snapshot(self, held: HeldPartition) -> None:
        """Stream the partition's state store (just written) to its snapshot under the checkpoints."""
        if held.saved_offset < 0 or held.saved_offset == held.snapshot_offset:
            held.snapshot_due = time.monotonic() + self.snapshot_every_s
            return
        # The folder may be a storage URI (settings.checkpoints): written through its path object, not the OS's.
        self.folder.mkdir(parents=True, exist_ok=True)
        header = {"topic": self.settings.events_topic, "partition": held.number, "offset": held.saved_offset,
                  "written_at": utc_now(), "format": "lines"}

        def lines():
            yield dumps(header) + b"\n"
            batch = []
            for _, account, raw in held.store.states():
                batch.append(b"[" + dumps(account) + b"," + zlib.decompress(raw) + b"]\n")
                if len(batch) >= 1_000:
                    yield b"".join(batch)
                    batch = []
            yield b"".join(batch)

        partial = self.folder / f"partition-{held.number}.json.partial"
        write_chunks(partial, lines())
        partial.replace(self._snapshot_path(held.number))
        held.snapshot_offset = held.saved_offset
        held.snapshot_due = time.monotonic() + self.snapshot_every_s
        self.stats.snapshots += 1

    def _save_all(self, snapshots: bool = False) -> None:
        """Write every held partition's changes (and its snapshot when due, or ``snapshots``); only call when
        every finding so far is delivered."""
        committed = []
        now = time.monotonic()
        for held in self._partitions.values():
            self._save(held)
            if snapshots or now >= held.snapshot_due:
                self._snapshot(held)
            if held.saved_offset >= 0:
                committed.append(TopicPartition(self.settings.events_topic, held.number, held.saved_offset))
        if committed and self._consumer is not None:
            try:  # for lag tools only: never read back
                self._consumer.commit(offsets=committed, asynchronous=True)
            except KafkaException:
                pass

    def _drop(self, held: HeldPartition) -> None:
        for account in held.dirty:
            self._subjects.pop(account, None)
        held.close()

    # -- the group's callbacks (called from inside consume(), on this thread) ---------------------------------
    def _on_assign(self, consumer, partitions: list[TopicPartition]) -> None:
        starts = []
        for tp in partitions:
            held = self._load(tp.partition)
            self._partitions[tp.partition] = held
            self._at_end.discard(tp.partition)
            starts.append(TopicPartition(tp.topic, tp.partition, held.offset))
            where = "the log's start" if held.offset < 0 else f"offset {held.offset}"
            self.log(f"fraud detector: partition {tp.partition} from {where} "
                     f"({max(held.store.entries() - 3, 0)} accounts' state)")
        consumer.incremental_assign(starts)
        self._rejoin.assigned()

    def _on_revoke(self, consumer, partitions: list[TopicPartition]) -> None:
        if not partitions:  # e.g. a consumer replaced by RejoinWatch.renew_if_overdue, closed on another thread
            return
        if self._sender is not None:
            self._sender.flush(_CALL_TIMEOUT_S)
        delivered = self._sender is None or self._sender.all_delivered()
        for tp in partitions:
            held = self._partitions.pop(tp.partition, None)
            if held is not None:
                if delivered:
                    self._save(held)  # else the next owner reads from the older state: ids repeat
                self._drop(held)
            self._at_end.discard(tp.partition)
        consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer, partitions: list[TopicPartition]) -> None:
        """Partitions lost without a revoke (this consumer was out of its group too long): another instance may
        own them already, so their changes are dropped unsaved; their next owner starts from the stored state."""
        self._rejoin.lost()
        self.log(f"fraud detector: group session lost; partitions {sorted(tp.partition for tp in partitions)} "
                 f"dropped (their next owner starts from their last stored state)")
        for tp in partitions:
            held = self._partitions.pop(tp.partition, None)
            if held is not None:
                self._drop(held)
            self._at_end.discard(tp.partition)
        consumer.incremental_unassign(partitions)

    # -- the loop --------------------------------------------------------------------------------------------
    def run(self, until_caught_up: bool = False, max_seconds: float | None = None) -> FraudStats:
        with CollectorPaced() as collector:  # event_store.collector: short collections between batches
            return self._run(until_caught_up, max_seconds, collector)

    def _run(self, until_caught_up: bool, max_seconds: float | None, collector: CollectorPaced) -> FraudStats:
        s = self.settings
        kafka_log.ensure_topics(s, log=self.log)
        self._consumer = consumer = self._subscribed()
        self._sender = sender = kafka_clients.RecordSender(s, "fraud detector", self.log, self._stopping, flush_s=0.5)
        self.log(f"fraud detector: reading {s.events_topic}, flagging to {s.commands_topic} (state in "
                 f"{s.home / STATE_FOLDER}, snapshots in {self.folder})")
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        last_write = time.monotonic()
        stopped = False
        try:
            while not self._stopping.is_set() and (deadline is None or time.monotonic() < deadline):
                renewed = self._rejoin.renew_if_overdue(consumer, self._subscribed, self.log, "fraud detector")
                if renewed is not consumer:
                    self.stats.consumers_renewed += 1
                    self._consumer = consumer = renewed
                records = self._records(kafka_clients.take(consumer, _MAX_RECORDS, 0.1))
                if records:
                    commands = self._fold(records)
                    if not sender.send(s.commands_topic, [(c.aggregate_id.encode(), c.to_json()) for c in commands],
                                       "command(s)"):
                        stopped = True
                        break
                    for r in records:  # delivered: the states are complete up to these offsets
                        held = self._partitions.get(r.partition())
                        if held is not None:
                            held.offset = max(held.offset, r.offset() + 1)
                elif until_caught_up and self._caught_up(consumer):
                    break
                if self._lag.refresh(consumer, self._at_end):
                    self.stats.lag = self._lag.lag
                    self.stats.accounts = sum(max(held.store.entries() - 3, 0) for held in self._partitions.values())
                if self._partitions and time.monotonic() - last_write >= _STORE_EVERY_S:
                    self._save_all()
                    last_write = time.monotonic()
                collector.tick()
            if not stopped:
                self._save_all(snapshots=True)
        finally:
            sender.flush(_CALL_TIMEOUT_S)
            kafka_clients.close_within(consumer, _CALL_TIMEOUT_S, "fraud-detector")
            for held in self._partitions.values():
                self._drop(held)
            self._partitions.clear()
        return self.stats

    def _subscribed(self):
        s = self.settings
        consumer = kafka_clients.group_reader(s, s.fraud_detector_group, on_error=self._on_error)
        consumer.subscribe([s.events_topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                           on_lost=self._on_lost)
        return consumer

    def _records(self, messages: list) -> list:
        records = []
        for m in messages:
            error = m.error()
            if error is None:
                self._at_end.discard(m.partition())
                if m.partition() in self._partitions:
                    records.append(m)
            elif error.code() == KafkaError._PARTITION_EOF:
                self._at_end.add(m.partition())
            elif error.fatal() or not error.retriable():
                raise KafkaException(error)
            else:
                self._on_error(error)
        if records and self._broker_error is not None:
            self.log(f"fraud detector: reading events again after: {self._broker_error}")
            self._broker_error = None
        return records

    def _fold(self, records: list) -> list[CommandEnvelope]:
        by_partition: dict[int, list[EventEnvelope]] = defaultdict(list)
        self._unsealer.refresh()
        for r in records:
            self.stats.events += 1
            value = r.value()
            if not value or not any(marker in value for marker in _INPUT_MARKERS):
                continue  # not one of the three event types (a cheap look before parsing)
            try:
                event = EventEnvelope.from_json(value)
            except InvalidRecord as e:
                self.stats.skipped += 1
                self.log(f"fraud detector: skipped events record {r.partition()}/{r.offset()}: {e}")
                continue
            if event.event_type not in INPUT_TYPES or event.aggregate_type != AGGREGATE_TYPE:
                continue
            held = self._partitions[r.partition()]
            if r.offset() < held.offset:
                continue  # folded before (a re-delivery after a rebalance)
            location = event.payload.get("location")
            if is_sealed(location):
                self._subjects[event.aggregate_id] = token_subject(location)
            by_partition[r.partition()].append(self._unsealer.event(event))
        commands = []
        for partition, events in by_partition.items():
            self.stats.observed += len(events)
            try:
                commands += findings_for(self._partitions[partition], events)
            except InvalidRecord as e:  # an event time the envelope let through but that is no time
                self.stats.skipped += 1
                self.log(f"fraud detector: skipped a batch of partition {partition}: {e}")
        self.stats.findings += len(commands)
        for command in commands:
            rule = str(command.payload.get("rule"))
            self.stats.by_rule[rule] = self.stats.by_rule.get(rule, 0) + 1
        return commands

    def _caught_up(self, consumer) -> bool:
        assigned = consumer.assignment()
        return bool(assigned) and all(tp.partition in self._at_end for tp in assigned)

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            raise KafkaException(error)
        if self._broker_error is None:
            self._broker_error = error.str()
            self.log(f"fraud detector: waiting for the broker: {error.str()}")
