"""The partition rebuild: one partition of the events topic read back into aggregate states.

Commands partition ``p`` maps to events partition ``p``, so the handler instance that is assigned ``p`` rebuilds
exactly that partition's aggregates: from its state store on this machine's disk (``event_store.state_store``,
under the handler's home) when there is one covering at least the latest snapshot, else from the latest snapshot
(``event_store.snapshots``), plus the events and command results after it. Either way the result is read
through the store (``PartitionState.stored``): what the replay changes is written to it with the positions
reached, every ``FLUSH_EVERY`` records and at the end. Every event is folded by the rule the read models apply (``read_models.sequence``); a
record that cannot be read or folded quarantines its aggregate and nothing else. No transaction is written here:
the transaction loop (``event_store.handler``) asks for a rebuild and gives the partition's state its commands.
See docs/DESIGN.md ("Guarantees").
"""
from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from kafka import TopicPartition
from kafka.errors import KafkaError

from event_store import kafka_log
from event_store.batch_decision import continue_waiting
from event_store.decider import event_id_for
from event_store.domains import DOMAINS, EVENT_TYPES
from event_store.envelope import CommandResult, EventEnvelope
from event_store.errors import InvalidRecord
from event_store.snapshots import PartitionState, restore_snapshot, segment_ranges
from event_store.state_store import StateStore, store_path
from event_store.stored_state import StateCache
from lakehouse.errors import Refused
from lakehouse.settings import Settings

__all__ = ["PartitionRebuilder", "RebuildStats", "RebuildCounts", "RebuildDeferred", "RetainedLogMissing",
           "continue_waiting", "FLUSH_EVERY"]

# During a long replay, what changed is written to the state store every so many records (with the positions
# reached), so a rebuild's memory follows the cache rather than the log. Also what bounds LMDB's own heap: a write
# transaction copies each page it changes into memory of its own, which LMDB keeps for reuse afterwards (per
# partition's store), so the pages one flush touches stay held. Measured with bench/long_log.py at 1M events over
# 100k accounts: 20,000 -> peak RssAnon 389 MiB; 5,000 -> see bench/README.md (issue 42).
FLUSH_EVERY = 5_000


@dataclass
class RebuildStats:
    """How one partition's state came back: from a snapshot or not, and how many records were read after it."""
    partition: int
    from_snapshot: bool
    aggregates: int
    events_read: int
    results_read: int
    seconds: float
    snapshot_records: int = 0  # records of the snapshots partition read for its snapshot
    whole_snapshots_partition: bool = False  # read whole: the latest snapshot was not where its manifest said
    from_store: bool = False  # started from the state store on this machine's disk (event_store.state_store)
    cpu_seconds: float = 0.0  # the process's CPU time meanwhile: the cost on a core of its own, whatever the load



@dataclass
class RebuildCounts:
    """Records a rebuild skipped, by kind (the command handler passes its HandlerStats, which has these fields)."""
    unreadable_events: int = 0  # events records that could not be read (their aggregates are quarantined)
    repeated_events: int = 0  # an event id seen before, or an event at a version already taken (forged)
    unreadable_results: int = 0  # command-results records skipped
    quarantined_aggregates: int = 0  # aggregates quarantined after an unreadable events record


class RetainedLogMissing(Refused):
    """A partition's state cannot be rebuilt: what it would start from (its state store, its latest snapshot, or
    nothing) covers the events log only up to an offset that retention has deleted since. Folding what is left
    would give a partial state, so the handler refuses (docs/DESIGN.md, "After retention")."""


class RebuildDeferred(Exception):
    """A partition cannot be rebuilt right now (the broker does not answer, an open transaction blocks its log);
    it stays paused and is tried again."""


def _aggregate_of(record) -> tuple[list[str], str | None]:
    """The aggregate an events record belongs to as far as it can be told: the aggregate types it may be of
    (its aggregate_type when registered, else the owner of its event_type, else every registered one) and its
    id (its key, else its aggregate_id)."""
    try:
        obj = json.loads(record.value)
    except (ValueError, TypeError):
        obj = None
    obj = obj if isinstance(obj, dict) else {}
    aggregate_type, event_type = obj.get("aggregate_type"), obj.get("event_type")
    if isinstance(aggregate_type, str) and aggregate_type in DOMAINS:
        types = [aggregate_type]
    elif isinstance(event_type, str) and event_type in EVENT_TYPES:
        types = [EVENT_TYPES[event_type]]
    else:
        types = list(DOMAINS)
    if record.key:
        try:
            return types, record.key.decode("utf-8") or None
        except UnicodeDecodeError:
            pass
    aggregate_id = obj.get("aggregate_id")
    return types, aggregate_id if isinstance(aggregate_id, str) and aggregate_id else None


def _repeats_a_derived_id(part: PartitionState, key: tuple[str, str], state: Any, event: EventEnvelope) -> bool:
    """Whether ``event`` (a record whose id is not the derivation of its own fields, not in ``part.event_ids``)
    repeats the id of an event seen before: its id is the derivation of another version ``v`` of its own
    aggregate and command (a record copied under another version), and ``v`` is taken (the aggregate is at ``v``
    or later) or waits with that id. Only ids that look like a derived one (a UUID of version 5) are tried, each
    version of the aggregate once: records of this kind come from forgers, never from the handler.

    What the rule of the read models would decide otherwise: a record whose id is the derivation of a taken
    version that no record of the log ever carried (a forger computing ids of commands never run) counts here as
    a repeat; an id copied from another aggregate or another command is not recognised (its record counts as
    new, as an id never seen)."""
    event_id = event.event_id
    if len(event_id) != 36 or event_id[14] != "5":
        return False
    aggregate_type, aggregate_id = key
    command_id = event.command_id
    waiting = part.waiting.get(key) or {}
    for v in itertools.chain(range(1, state.version + 1), waiting):
        if event_id_for(aggregate_type, aggregate_id, v, command_id) == event_id:
            return v <= state.version or waiting[v].event_id == event_id
    return False


class PartitionRebuilder:
    """Rebuilds partitions of the events topic into ``PartitionState``s with two consumers of its own (no group):
    a ``read_committed`` reader and a ``read_uncommitted`` one that sees the high watermark (an open transaction).

    ``tick`` is called between the steps of a long read (the handler's keepalive: it may raise to stop the
    rebuild), ``wait(seconds)`` pauses between tries; ``stable_wait_s`` bounds the wait for an open transaction
    to end. Nothing connects before ``open()``."""

    def __init__(self, settings: Settings, instance_id: str = "0", log: Callable[[str], None] = print,
                 use_snapshots: bool = True, counts: RebuildCounts | None = None,
                 tick: Callable[[], None] = lambda: None, wait: Callable[[float], None] = time.sleep,
                 stable_wait_s: float = 35.0):
        self.settings = settings
        self.instance_id = instance_id
        self.log = log
        self.use_snapshots = use_snapshots
        self.stats = counts if counts is not None else RebuildCounts()
        self.rebuilds: list[RebuildStats] = []
        self._keepalive = tick
        self._wait = wait
        self._stable_wait_s = stable_wait_s
        self.reader = None  # read_committed, no group
        self.watermarks = None  # read_uncommitted, no group: the high watermark, to see open transactions
        self._snapshot_read = [0, False]  # the current rebuild's RebuildStats.snapshot_records and whole_...
        self._stores: dict[int, StateStore] = {}  # per partition, opened on its first rebuild
        # The decoded states of every partition it rebuilds, one bound for the handler (handler_state_cache_mb).
        self.cache = StateCache(settings.handler_state_cache_mb << 20)

    def open(self) -> None:
        # Short request timeouts: a rebuild that waits for an absent broker gives way to stop() and keepalives.
        self.reader = kafka_log.make_consumer(self.settings, request_timeout_ms=5_000)
        self.watermarks = kafka_log.make_consumer(self.settings, isolation_level="read_uncommitted",
                                                  request_timeout_ms=5_000)

    def close(self) -> None:
        for client in (self.reader, self.watermarks):
            if client is not None:
                client.close()
        self.reader = self.watermarks = None
        for store in self._stores.values():
            store.close()
        self._stores.clear()

    def store(self, p: int) -> StateStore:
        """Partition ``p``'s state store under the handler's home (event_store.state_store); its cache is the
        PartitionState's (``PartitionState.stored``: the handler's one cache, the partition's entries dropped
        when it is read anew), so a store shared with another owner never serves a value cached before that
        owner wrote."""
        store = self._stores.get(p)
        if store is None:
            store = self._stores[p] = StateStore(store_path(self.settings.home, self.settings.events_topic, p),
                                                 cache_bytes=0)
        return store

    def renew(self) -> None:
        """New rebuild readers: after a broker restart kafka-python's consumers may keep a stale fetch state and
        read nothing more (seen in tests/integration/test_handler_broker_restart.py); fresh ones do."""
        # The broker's API version, known already: without it kafka-python's constructor connects first, and
        # waits (tens of seconds, deaf to stop()) for a broker that is away.
        api_version = self.reader.config.get("api_version")
        for client in (self.reader, self.watermarks):
            try:
                client.close()
            except Exception as e:  # noqa: BLE001 -- a reader that cannot close cleanly is dropped anyway
                self.log(f"handler {self.instance_id}: closing a rebuild reader: {e!r}")
        self.reader = kafka_log.make_consumer(self.settings, request_timeout_ms=5_000, api_version=api_version)
        self.watermarks = kafka_log.make_consumer(self.settings, isolation_level="read_uncommitted",
                                                  request_timeout_ms=5_000, api_version=api_version)

    def rebuild(self, p: int) -> PartitionState:
        """Partition ``p``'s aggregates and idempotency window: the latest snapshot plus the records after it."""
        s = self.settings
        started, cpu_started = time.monotonic(), time.process_time()
        events_tp, results_tp = TopicPartition(s.events_topic, p), TopicPartition(s.results_topic, p)
        snapshots_tp = TopicPartition(s.snapshots_topic, p)
        # One offsets request for all three (each costs a round trip): where the committed log ends now.
        ends = self._wait_until_stable([events_tp, results_tp, snapshots_tp])
        self._snapshot_read = [0, False]
        store = self.store(p)
        cache = self.cache
        # The store on this machine's disk first: it covers the log up to its positions, and only the log after
        # them is read. Unless it covers more than the log holds (the topics were made anew), or less than the
        # latest snapshot (this machine held the partition long ago: the log after the store may be gone with
        # retention): then it is emptied and the partition comes from the snapshots topic and the log, as on a
        # machine that never held it.
        positions = store.positions() if self.use_snapshots else None
        from_store = positions is not None and positions[0] <= ends[events_tp] and positions[1] <= ends[results_tp]
        if positions is not None and not from_store:
            self.log(f"handler {self.instance_id}: partition {p}: the state store covers the log up to {positions}, "
                     f"more than it holds ({ends[events_tp]}, {ends[results_tp]}): not used")
        elif from_store:
            snapshot_at = self._snapshot_positions(p, ends[snapshots_tp])
            if snapshot_at is not None and snapshot_at[0] > positions[0]:
                from_store = False
                self.log(f"handler {self.instance_id}: partition {p}: the state store covers the log up to "
                         f"{positions}, the latest snapshot more ({snapshot_at}): restored from the snapshot")
        if from_store:
            self._refuse_a_deleted_start(p, events_tp, positions[0], "its state store on this machine")
            part = PartitionState.stored(p, store, s.idempotency_window, cache=cache)
            from_snapshot = False
        else:
            # The latest snapshot goes straight into the store (event_store.snapshots.restore_snapshot: memory of
            # one batch of entries, whatever the partition holds), then the partition is read through it.
            loaded = self._load_snapshot(p, ends[snapshots_tp], store) if self.use_snapshots else None
            from_snapshot = loaded is not None
            self._refuse_a_deleted_start(p, events_tp, loaded.events_offset if loaded else 0,
                                         "its latest snapshot" if loaded else "the start of the log (no snapshot)")
            if loaded is not None:
                part = PartitionState.stored(p, store, s.idempotency_window, cache=cache)
                part.id_segments = loaded.id_segments
            else:
                part = PartitionState.stored(p, store, s.idempotency_window, cache=cache,
                                             loaded=PartitionState(p, window=s.idempotency_window))
        end = ends[events_tp]
        events_read = 0
        tick = self._keepalive
        for record in kafka_log.read_partition(self.reader, events_tp, part.events_offset, end, tick=tick):
            if events_read and events_read % FLUSH_EVERY == 0:
                part.events_offset = record.offset
                part.flush()
            # No record may stop the handler: whatever fails to parse or to fold quarantines its aggregate
            # (logged and counted); every other aggregate goes on.
            try:
                event = EventEnvelope.from_json(record.value)
            except InvalidRecord as e:
                self._unreadable_event(part, record, str(e))
                continue
            except Exception as e:  # noqa: BLE001 -- defensive: nothing from the log may stop the handler
                self._unreadable_event(part, record, f"{type(e).__name__}: {e}")
                continue
            try:
                self.apply_logged(part, event, record)
            except Exception as e:  # noqa: BLE001 -- e.g. a payload evolve() cannot fold
                self._unreadable_event(part, record, f"{type(e).__name__}: {e}")
                continue
            events_read += 1
        part.events_offset = max(part.events_offset, end)
        part.events_since_snapshot += events_read
        end = ends[results_tp]
        results_read = 0
        for record in kafka_log.read_partition(self.reader, results_tp, part.results_offset, end, tick=tick):
            if results_read and results_read % FLUSH_EVERY == 0:
                part.results_offset = record.offset
                part.flush()
            try:
                result = CommandResult.from_json(record.value)
                if result.aggregate_id and result.error_type != "InvalidCommand":
                    part.remember(result)
            except Exception as e:  # noqa: BLE001 -- an unreadable result only costs its idempotency entry
                self.stats.unreadable_results += 1
                self.log(f"handler {self.instance_id}: unreadable command result {record.topic}/{p}/{record.offset} "
                         f"skipped: {type(e).__name__}: {e}")
                continue
            results_read += 1
        part.results_offset = max(part.results_offset, end)
        part.flush()
        stats = RebuildStats(p, from_snapshot, len(part.states), events_read, results_read,
                             time.monotonic() - started, *self._snapshot_read, from_store=from_store,
                             cpu_seconds=time.process_time() - cpu_started)
        self.rebuilds.append(stats)
        self.log(f"handler {self.instance_id}: partition {p}: {len(part.states)} aggregates from "
                 f"{'a snapshot + ' if from_snapshot else 'the state store + ' if from_store else ''}"
                 f"{events_read} events and {results_read} results in {stats.seconds:.2f}s "
                 f"(CPU {stats.cpu_seconds:.2f}s)")
        return part

    def apply_logged(self, part: PartitionState, event: EventEnvelope, record) -> None:
        """Fold an event read from the log by the rule the read models apply (read_models.sequence): each
        aggregate's versions once and in order; an event id seen before counts once, wherever its repeat claims to
        be; the first event at a version takes it (a different event at a taken version counts nowhere); an event
        after a gap waits until the gap is filled. An event of an aggregate type that is not registered, or
        that does not own its event type, raises ValueError (the rebuild quarantines its aggregate).

        Without keeping every event id (issue 42): an event id derives from the event's own fields
        (``decider.event_id_for``: aggregate, version, command), so a record whose id is that derivation
        ("derived") can only repeat an id seen before at the same version of the same aggregate, which the version
        rule already refuses, or an id a record of another kind carried first, which ``part.event_ids`` holds.
        ``part.event_ids`` keeps only the ids that are not the derivation of their record's fields (forged
        records, records of releases that derived ids otherwise) and derived ids that took no version: what the
        log's writers other than this handler add, not what the log's length adds (``_repeats_a_derived_id``)."""
        aggregate_type = event.aggregate_type
        domain = DOMAINS.get(aggregate_type)
        if domain is None or EVENT_TYPES.get(event.event_type) != aggregate_type:
            raise ValueError(f"event {event.event_id}: {event.event_type} is not an event of aggregate type "
                             f"{aggregate_type!r} (registered: "
                             f"{', '.join(f'{t}: {sorted(d.events)}' for t, d in DOMAINS.items())})")
        event_id, odd = event.event_id, part.event_ids
        if event_id in odd:
            self.stats.repeated_events += 1
            return
        key = (aggregate_type, event.aggregate_id)
        state = part.state(*key)
        version = event.aggregate_version
        derived = event_id == event_id_for(aggregate_type, event.aggregate_id, version, event.command_id)
        if not derived:
            if _repeats_a_derived_id(part, key, state, event):
                self.stats.repeated_events += 1
                return
            odd.add(event_id)
        if version <= state.version:
            self.stats.repeated_events += 1
            return
        if version > state.version + 1:
            if part.wait(key, event):
                self.log(f"handler {self.instance_id}: events record {record.topic}/{part.partition}/{record.offset}: "
                         f"version {version} of {aggregate_type} {event.aggregate_id} follows version {state.version}; it "
                         f"waits for the versions in between, as in the read models")
            elif derived and part.waiting[key][version].event_id != event_id:
                odd.add(event_id)  # took no version: a later record carrying its id must find it
            return
        part.states[key] = continue_waiting(part, key, domain.evolve(state, event))
        part.events_held += 1

    def _unreadable_event(self, part: PartitionState, record, reason: str) -> None:
        """An events record the rebuild cannot read or fold: its aggregate (the record's key, which every writer
        sets to the aggregate id) is quarantined until an operator resolves it; every other aggregate goes on.
        When the record does not tell its aggregate type, the id is quarantined in every domain: better a
        refused command than a command decided on a history with a hole."""
        self.stats.unreadable_events += 1
        where = f"{record.topic}/{part.partition}/{record.offset}"
        types, aggregate_id = _aggregate_of(record)
        if aggregate_id is None:
            self.log(f"handler {self.instance_id}: unreadable events record {where} skipped (no key names its "
                     f"aggregate): {reason}")
            return
        for aggregate_type in types:
            key = (aggregate_type, aggregate_id)
            part.states[key] = DOMAINS[aggregate_type].quarantined(part.state(*key), where, reason)
            self.stats.quarantined_aggregates += 1
        self.log(f"handler {self.instance_id}: unreadable events record {where}: {' or '.join(types)} "
                 f"{aggregate_id} quarantined until resolved (eventlake resolve-quarantine {aggregate_id} --record "
                 f"{where} --reason ...): {reason}")

    def _refuse_a_deleted_start(self, p: int, events_tp: TopicPartition, start: int, source: str) -> None:
        """RetainedLogMissing when the events log no longer holds offset ``start`` (retention deleted it), where a
        rebuild from ``source`` would start reading: nothing may need an offset retention deleted."""
        try:
            earliest = self.reader.beginning_offsets([events_tp])[events_tp]
        except KafkaError as e:
            raise RebuildDeferred(f"the broker does not answer offset requests ({e!r})") from None
        if start < earliest:
            raise RetainedLogMissing(
                f"handler {self.instance_id}: partition {p}: a rebuild from {source} must read {events_tp.topic} "
                f"from offset {start}, but the log's earliest retained offset is {earliest}: offsets "
                f"{start}..{earliest - 1} were deleted "
                f"by retention, and folding the rest would give a partial state. Restore the partition from a "
                f"snapshot at offset {earliest} or later (the snapshots topic, or a home whose state store covers "
                f"it); the events topic must keep unlimited retention until one exists")

    def _snapshot_positions(self, p: int, end: int) -> tuple[int, int] | None:
        """The (events, results) offsets the latest snapshot of partition ``p`` covers, from its manifest alone
        (where ``_load_snapshot`` looks first), or None when it is not found there."""
        if end == 0:
            return None
        tp = TopicPartition(self.settings.snapshots_topic, p)
        tick = self._keepalive
        try:
            tail = list(kafka_log.read_partition(self.reader, tp, max(0, end - 3), end, tick=tick))
            manifests = [r for r in tail if r.key == str(p).encode()]
            pointers = [r for r in tail if r.key == f"{p}/latest".encode()]
            if not manifests and pointers:
                at = json.loads(pointers[-1].value)["manifest_offset"]
                manifests = [r for r in kafka_log.read_partition(self.reader, tp, at, at + 1, tick=tick)
                             if r.key == str(p).encode()]
            if not manifests:
                return None
            manifest = json.loads(manifests[-1].value)
            return manifest["events_offset"], manifest["results_offset"]
        except (ValueError, KeyError, TypeError):
            return None

    def _load_snapshot(self, p: int, end: int, store: StateStore) -> PartitionState | None:
        """The latest snapshot of partition ``p`` restored into ``store`` (its bookkeeping returned, or None),
        reading only its own records when it can.

        A snapshot's manifest is the last transaction of its steps and nothing else writes snapshots partition
        ``p`` while they run, so the latest manifest sits just before the end (the commit marker), or, while the
        next snapshot was being written (a crash mid-snapshot), where the record ending its last step says; the
        rest of the snapshot lies between the first offset the manifest names and itself, its earlier id segments
        where it says. If that does not hold, the whole partition is read. A snapshot that cannot be read is
        ignored: the state is rebuilt from the whole log instead.
        """
        s = self.settings
        tp = TopicPartition(s.snapshots_topic, p)
        if end == 0:
            return None
        tick = self._keepalive
        try:
            tail = list(kafka_log.read_partition(self.reader, tp, max(0, end - 3), end, tick=tick))
            manifests = [r for r in tail if r.key == str(p).encode()]
            pointers = [r for r in tail if r.key == f"{p}/latest".encode()]
            if not manifests and pointers:  # a snapshot was being written: its steps say where the latest is
                at = json.loads(pointers[-1].value)["manifest_offset"]
                manifests = [r for r in kafka_log.read_partition(self.reader, tp, at, at + 1, tick=tick)
                             if r.key == str(p).encode()]
            if manifests:
                manifest = manifests[-1]
                try:
                    records = []
                    for start, stop in segment_ranges(json.loads(manifest.value), manifest.offset):
                        records += kafka_log.read_partition(self.reader, tp, start, stop, tick=tick)
                    self._snapshot_read = [len(tail) + len(records), False]
                    return restore_snapshot(records, p, s.idempotency_window, store)
                except InvalidRecord:
                    pass  # not where the manifest says after all (e.g. compacted): read everything
            self._snapshot_read = [0, True]

            def counted(records):  # streamed: the partition holds every snapshot not yet compacted away
                for record in records:
                    self._snapshot_read[0] += 1
                    yield record
            return restore_snapshot(counted(kafka_log.read_partition(self.reader, tp, 0, end, tick=tick)), p,
                                    s.idempotency_window, store)
        except (ValueError, KeyError, TypeError) as e:
            self.log(f"handler {self.instance_id}: snapshot of partition {p} unreadable ({type(e).__name__}: {e}); "
                     f"rebuilding from the whole log")
            return None

    def wait_until_visible(self, partitions: Iterable[int], timeout_s: float) -> bool:
        """Wait until what is written so far to the events and results topics' ``partitions`` can be read by a
        ``read_committed`` reader; False (and a log line) if it cannot be seen within ``timeout_s``.

        A committed transaction is not yet readable when its commit returns: the broker writes its commit markers
        to the partitions after it answers, so their last stable offsets move a moment later (under load, long
        enough for a reader started at once to stop short of the transaction: a projection run until caught up
        right after the handler was, seen in CI). The high watermarks read here include every record written so
        far; the wait ends when the stable offsets reach them (an open transaction of another instance is also
        waited for, up to ``timeout_s``)."""
        s = self.settings
        tps = [TopicPartition(topic, p) for p in sorted(partitions) for topic in (s.events_topic, s.results_topic)]
        if not tps:
            return True
        try:
            self._wait_until_stable(tps, timeout_s)
            return True
        except RebuildDeferred as e:
            self.log(f"handler {self.instance_id}: what was written is not yet known to be readable by "
                     f"read_committed readers ({e})")
            return False

    def _wait_until_stable(self, tps: list[TopicPartition],
                           timeout_s: float | None = None) -> dict[TopicPartition, int]:
        """Wait until no open transaction (e.g. of a killed instance) holds back the end of ``tps``; their
        last stable offsets. Raises RebuildDeferred when the broker does not answer or the wait is longer than
        ``timeout_s`` (default: ``stable_wait_s``)."""
        deadline = time.monotonic() + (self._stable_wait_s if timeout_s is None else timeout_s)
        while True:
            self._keepalive()
            try:
                stable = self.reader.end_offsets(tps)
                high = self.watermarks.end_offsets(tps)
            except KafkaError as e:
                raise RebuildDeferred(f"the broker does not answer offset requests ({e!r})") from None
            if all(stable[tp] >= high[tp] for tp in tps):
                return stable
            if time.monotonic() > deadline:
                raise RebuildDeferred(f"partitions {sorted(str(tp) for tp in tps)} stay blocked by an open "
                                       f"transaction (stable offsets {stable}, high watermarks {high}); is another "
                                       f"handler with a different instance id writing them?")
            self._wait(0.2)
