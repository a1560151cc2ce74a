"""What the command handler holds per owned partition (``PartitionState``): its aggregates' states, their
idempotency windows, the few event ids no derivation gives and the log positions it covers, in dicts or read
through the partition's state store (``PartitionState.stored``: ``event_store.stored_state`` over
``event_store.state_store``). Its snapshots are ``event_store.snapshots``'.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from event_store.domains import DOMAINS
from event_store.envelope import CommandResult, EventEnvelope, dumps
from event_store.stored_state import StateCache, StoredStates, StoredWindows

__all__ = ["PartitionState", "EventIds", "result_row", "result_from_row"]


class EventIds(set):
    """A partition's event ids: a set that also lists, in order, the ids added since its last snapshot
    (``unsaved``), which the next snapshot writes as its id segment. Ids read back from a snapshot go in through
    ``load`` (saved already)."""

    def __init__(self, ids: Iterable[str] = ()):
        super().__init__()
        self.unsaved: list[str] = []
        self.unstored: list[str] = []  # added since the state store (event_store.state_store) was last written
        self.update(ids)

    def add(self, event_id: str) -> None:
        if event_id not in self:
            set.add(self, event_id)
            self.unsaved.append(event_id)
            self.unstored.append(event_id)

    def update(self, *iterables: Iterable[str]) -> None:
        for ids in iterables:
            for event_id in ids:
                self.add(event_id)

    def load(self, ids: Iterable[str]) -> None:
        set.update(self, ids)

    def saved(self, count: int) -> None:
        """The first ``count`` unsaved ids are in a snapshot now."""
        del self.unsaved[:count]


@dataclass
class PartitionState:
    """The handler's state for one owned partition: in dicts, or read through its state store (``stored``)."""
    partition: int
    # Every aggregate's state by (aggregate type, aggregate id): ids are unique per aggregate type only.
    states: dict[tuple[str, str], Any] = field(default_factory=dict)
    # Per aggregate id, the FIRST result of its most recent commands, oldest first (bounded by ``window``); a plain
    # dict keeps insertion order and costs less than an OrderedDict. Each by command id as its snapshot row
    # (encoded when remembered, a list when loaded from a snapshot) until ``first_result`` asks for it.
    results: dict[str, dict] = field(default_factory=dict)
    events_offset: int = 0   # next offset of events partition p not folded into ``states``
    results_offset: int = 0  # next offset of results partition p not folded into ``results``
    events_since_snapshot: int = 0
    window: int = 100
    # Per (aggregate type, aggregate id), events read from the log after a gap (version -> event), applied once
    # the gap is filled (read_models.sequence). Only records written around the handler make gaps. Kept in the
    # state store and in snapshots (a gap never filled must not stop either: issue 42); added through ``wait``.
    waiting: dict[tuple[str, str], dict] = field(default_factory=dict)
    # The aggregates whose waiting events changed since the last flush.
    waiting_changed: set[tuple[str, str]] = field(default_factory=set)
    # The event ids of this partition's log that its records' own fields do not derive (forged records, records of
    # releases that derived ids otherwise) and derived ids that took no version: with the version rule, what a
    # record repeating an id is recognised by (event_store.partition_rebuild.apply_logged). The ids this handler
    # writes are derived and never kept: the set grows with what other writers add, not with the log (issue 42).
    # Kept in snapshots, so a repeat of an id from before one is caught too.
    event_ids: EventIds = field(default_factory=EventIds)
    # How many events of the partition's log its states hold (each version folded once): what a snapshot's cost
    # is measured against (event_store.handler.snapshot_due).
    events_held: int = 0
    # The id segments its latest snapshot lists (``{"id", "records", "ids", "offset"}``; offset: of its first record
    # on the snapshots partition), oldest first.
    id_segments: list[dict] = field(default_factory=list)
    # The slot (``a`` or ``b``) of its latest snapshot's chunks; the next snapshot writes the other one.
    slot: str | None = None
    # The offset of its latest snapshot's manifest on the snapshots partition, when known.
    manifest_offset: int | None = None
    # The parts of its latest snapshot written since this state was rebuilt (event_store.snapshots: a full base,
    # then the incremental snapshots after it, each {"snapshot_id", "prefix", "chunks", "first_offset",
    # "end_offset"}), or None: the next snapshot is then a full base.
    chain: list[dict] | None = None
    # The partition's state store (event_store.state_store) when ``states`` and ``results`` are read through it
    # (``stored``), else None (everything in the dicts above).
    store: Any = None

    @classmethod
    def stored(cls, partition: int, store, window: int, cache_bytes: int | None = None,
               loaded: "PartitionState | None" = None, cache: StateCache | None = None) -> "PartitionState":
        """A partition's state read through ``store`` (its states and windows on disk, the hot ones in ``cache``,
        shared with the handler's other partitions, or a cache of its own of about ``cache_bytes``): what the
        store holds when ``loaded`` is None, else ``loaded`` (a snapshot's state or one rebuilt in memory) written
        into it (the store emptied first) with its positions."""
        part = cls(partition, window=window, store=store)
        if cache is None:
            cache = StateCache(cache_bytes or 0)
        cache.forget(partition)  # what it cached of an earlier holding: the store may have changed since
        part.states = StoredStates(store, cache, scope=partition)
        part.results = StoredWindows(store)
        if loaded is None:
            events_offset, results_offset = store.positions() or (0, 0)
            meta = json.loads(store.meta() or b"{}")
            part.events_offset, part.results_offset = events_offset, results_offset
            part.events_since_snapshot = meta.get("events_since_snapshot", 0)
            part.events_held = meta.get("events_held", 0)
            part.slot, part.manifest_offset = meta.get("slot"), meta.get("manifest_offset")
            part.states.count = meta.get("aggregates", 0)
            for aggregate_type, aggregate_id, version, raw in store.waiting():
                part.waiting.setdefault((aggregate_type, aggregate_id), {})[version] = EventEnvelope.from_json(raw)
            # Every id again in the next snapshot: its manifest then lists one segment holding them all.
            part.event_ids.update(store.event_ids())
            part.event_ids.unstored.clear()
            return part
        store.clear()
        for name in ("events_offset", "results_offset", "events_since_snapshot", "events_held", "slot",
                     "manifest_offset"):
            setattr(part, name, getattr(loaded, name))
        part.event_ids.update(loaded.event_ids)
        for key, state in loaded.states.items():
            part.states[key] = state
        for aggregate_id, recent in loaded.results.items():
            for command_id, row in recent.items():
                part.results.add(aggregate_id, command_id, result_row(row))
        part.waiting = loaded.waiting
        part.waiting_changed = set(loaded.waiting)
        part.flush(mark=False)  # in the snapshot it came from already: the next snapshot is a full base anyway
        return part

    def wait(self, key: tuple[str, str], event: Any) -> bool:
        """Keep ``event`` of the aggregate ``key`` (type, id), read after a gap in its versions, until the gap is
        filled; False when an event already waits at its version (the first one read keeps it)."""
        waiting = self.waiting.setdefault(key, {})
        if event.aggregate_version in waiting:
            return False
        waiting[event.aggregate_version] = event
        self.waiting_changed.add(key)
        return True

    def flush(self, mark: bool = True) -> bool:
        """Write what changed since the last flush (states, windows, event ids, events waiting after a gap) with
        the positions into the store in one transaction; called once the handler's Kafka transaction is committed
        (Kafka is the source of truth: an aborted batch never reaches here). Events that waited and are folded
        now (a committed state at or past their version) are dropped first. False when nothing was written (no
        store, or a newer owner wrote the store)."""
        store = self.store
        if store is None:
            return False
        states, results = self.states, self.results
        waiting = self.waiting
        if waiting:
            changed = self.waiting_changed
            for key in [key for key in states.dirty if key in waiting]:
                version = states.dirty[key].version
                kept = {v: event for v, event in waiting[key].items() if v > version}
                if len(kept) != len(waiting[key]):
                    changed.add(key)
                    if kept:
                        waiting[key] = kept
                    else:
                        del waiting[key]
        encoded_waiting = {key: {v: event.to_json() for v, event in waiting.get(key, {}).items()}
                           for key in self.waiting_changed}
        meta = json.dumps({"events_since_snapshot": self.events_since_snapshot, "events_held": self.events_held,
                           "slot": self.slot, "manifest_offset": self.manifest_offset,
                           "aggregates": states.count, "cached_bytes": states.cache.held_by.get(self.partition, 0)}).encode()
        # Each state without its index keys (Domain.index_split: the account's payment ids), which are written
        # as keys of their own; the state kept in memory is the split one too.
        index: list[tuple[str, str, str]] = []
        dirty = states.dirty
        for key, state in dirty.items():
            split = DOMAINS[key[0]].index_split
            if split is not None:
                state, keys = split(state)
                if keys:
                    dirty[key] = state
                    index += [(key[0], key[1], k) for k in keys]
        encoded_states = {key: dumps(DOMAINS[key[0]].encode_state(state)) for key, state in dirty.items()}
        if not store.write(self.events_offset, self.results_offset, encoded_states, results.added(),
                           self.event_ids.unstored, meta=meta, index=index, window=self.window, mark=mark,
                           waiting=encoded_waiting):
            return False  # kept: written with the next flush (when this instance still owns the partition)
        states.written(encoded_states)
        results.dirty.clear()
        self.event_ids.unstored.clear()
        self.waiting_changed.clear()
        return True

    def state(self, aggregate_type: str, aggregate_id: str) -> Any:
        """The state of an aggregate: as held, or its domain's initial state. KeyError for an unknown type."""
        found = self.states.get((aggregate_type, aggregate_id))
        return found if found is not None else DOMAINS[aggregate_type].initial(aggregate_id)

    def known(self, command: Any, state: Any) -> Any:
        """``state`` as ``decide`` needs it for ``command``: with a state store, a state does not hold its index
        keys (the account's payment ids, ``Domain.index_split``), so the one key the command asks about
        (``Domain.index_probe``) is looked up in the store and, when there, made known to the state
        (``Domain.index_known``). Without a store, or for a domain without an index, ``state`` itself."""
        store = self.store
        if store is None:
            return state
        domain = DOMAINS[command.aggregate_type]
        if domain.index_probe is None:
            return state
        key = domain.index_probe(command)
        if key is None or not store.has_index(command.aggregate_type, command.aggregate_id, key):
            return state
        return domain.index_known(state, key)

    def owner_of(self, aggregate_type: str, aggregate_id: str, staged: dict | None = None) -> str | None:
        """Another aggregate type that has an aggregate with this id here (in ``states`` or in ``staged``, states
        not yet committed), or None. Every aggregate with an id lives in its partition (keyed by id)."""
        for other in DOMAINS:
            key = (other, aggregate_id)
            if other != aggregate_type and (key in self.states or (staged is not None and key in staged)):
                return other
        return None

    def first_result(self, aggregate_id: str, command_id: str) -> CommandResult | None:
        if self.store is not None:  # one entry of the store (or of what the next flush writes), never a window
            row = self.results.first(aggregate_id, command_id)
            return None if row is None else result_from_row(aggregate_id, json.loads(row))
        recent = self.results.get(aggregate_id)
        found = recent.get(command_id) if recent else None
        if isinstance(found, bytes):  # still its row, encoded: made into a result on first use
            found = recent[command_id] = result_from_row(aggregate_id, json.loads(found))
        elif isinstance(found, list):  # still the snapshot's row
            found = recent[command_id] = result_from_row(aggregate_id, found)
        return found

    def remember(self, result: CommandResult) -> None:
        """Keep ``result`` as the answer to its command_id, unless an earlier one is already kept."""
        results = self.results
        if self.store is not None:  # one entry, written by the next flush
            results.add(result.aggregate_id, result.command_id, bytes(memoryview(result_row(result))))
            return
        recent = results.get(result.aggregate_id)
        if recent is None:
            recent = {}
        elif result.command_id in recent:
            return
        results[result.aggregate_id] = recent  # (with a store: changed, written by the next flush)
        # Kept as its snapshot row, encoded: most are never asked for again, every snapshot writes them all, and
        # bytes are no work for the garbage collector (two lists per command were most of the handler's young
        # objects: event_store.collector). Copied into bytes of their own size: orjson's output is its buffer
        # shrunk in place, and kept for long each pinned ~4 KB of the heap (66,700 rows: 266 MiB, 11 copied).
        recent[result.command_id] = bytes(memoryview(result_row(result)))
        if len(recent) > self.window:
            del recent[next(iter(recent))]

    def snapshot_written(self, writer: Any) -> None:
        """The manifest of ``writer``'s snapshot of this partition is committed: its id segments are listed by
        the next snapshot, its ids are saved, and the events after its cut count toward the next one."""
        self.id_segments += writer.segments
        self.event_ids.saved(writer.unsaved_ids)
        self.events_since_snapshot = max(0, self.events_since_snapshot - writer.events_counted)
        self.slot = writer.slot
        self.manifest_offset = writer.manifest_offset
        self.chain = writer.chain
        if writer.epoch is not None:
            self.store.snapshot_done(writer.epoch)  # what it wrote is no longer a change for the next one
        self.flush()  # the store's bookkeeping names the slot the next snapshot must not write

    def remember_row(self, aggregate_id: str, row: list) -> None:
        """Keep a snapshot's row as the first result of its command (in memory, bounded by ``window``)."""
        recent = self.results.get(aggregate_id)
        if recent is None:
            recent = {}
        self.results[aggregate_id] = recent
        recent.setdefault(row[0], row)
        if len(recent) > self.window:
            del recent[next(iter(recent))]


def result_row(r: CommandResult | list | bytes) -> bytes:
    """A kept result as its snapshot row, encoded."""
    if isinstance(r, bytes):
        return r
    if isinstance(r, list):
        return dumps(r)
    return dumps([r.command_id, r.status, r.version, list(r.event_ids), r.error_type, r.reason, r.recorded_at])


def result_from_row(aggregate_id: str, row: list) -> CommandResult:
    """A snapshot's row of a kept result, as the result."""
    command_id, status, version, event_ids, error_type, reason, recorded_at = row
    return CommandResult(command_id, aggregate_id, status, version, tuple(event_ids), error_type, reason, recorded_at)
