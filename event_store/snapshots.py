"""What the command handler holds per partition, and its snapshots on a compacted Kafka topic.

Commands partition ``p`` maps to events partition ``p`` (the handler writes an aggregate's events to the
partition its commands came from), so one partition's aggregates can be rebuilt from events partition
``p`` alone. A snapshot of partition ``p`` is the state of its aggregates (of every domain, each encoded by its
domain and recorded with its aggregate type), the idempotency window and the events/results offsets that state
covers; a restart reads the snapshot and only the records after it.

On the snapshots topic (``cleanup.policy=compact``, same partition count, written to partition ``p``) a
snapshot is a manifest under key ``p`` plus chunks under keys ``p/<slot>/0``, ``p/<slot>/1``, ... (a snapshot can
be larger than one Kafka record), all carrying the same ``snapshot_id``. A snapshot is written in steps
(``SnapshotWriter``), each a transaction of its own of about ``STEP_BYTES``, between the handler's command
transactions, the manifest alone last: a snapshot of a long log is tens of MB, and written at once it held up
every command for seconds (bench/snapshot_steps.py). What it holds is a cut taken when it starts: the aggregates'
states (immutable values: copying the references is the cut), the offsets they cover and the ids not yet saved.
The idempotency window is written as the steps reach it, so it may hold results newer than its offset; a rebuild
reads the results after that offset again and keeps the first result per command, which is the same window.
Snapshots alternate between two slots (``a``, ``b``): a snapshot writes the slot its partition's latest manifest
does not name, so an unfinished one (a crash, a lost partition) never touches the chunks that manifest needs, and
compaction keeps the latest value per key (stale chunks with a higher index are ignored).

The partition's event ids its records' fields do not derive (``PartitionState.event_ids``: forged records and
the like, rare), which only grow, are not rewritten by every snapshot: a snapshot writes the ids
added since the one before as id segments of up to ``SEGMENT_IDS`` ids each (keys ``p/ids/<segment>/0``, ``/1``,
..., unique, so compaction never drops them), each in one step, and its manifest lists every segment of the
partition with the offset of its first record. With a snapshot due after a quarter of the events a partition
holds (``event_store.handler``), a snapshot writes a quarter of the ids rather than all of them. The segments of
a snapshot that never got its manifest stay on the topic unreferenced (a few MB per crash mid-snapshot).

With a state store (``PartitionState.stored``, issue 42; the handler always has one, under its home), the states
and windows live on disk (event_store.state_store) and only the hot ones in memory, in a cache bounded by
``Settings.handler_state_cache_mb``: ``states`` and ``results`` read through it (what changed since the last
flush, the cache, LMDB) with the same methods, and ``flush`` writes what a committed batch changed together with
the positions in one LMDB transaction. A snapshot then reads the store's cut (one LMDB read transaction taken
when it starts: the states and windows at its offsets exactly, encoded already) instead of the dicts.
"""
from __future__ import annotations

import itertools
import json
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from event_store.domains import DOMAINS
from event_store.envelope import CommandResult, dumps
from event_store.errors import InvalidRecord
from event_store.state_store import ENTRY_OVERHEAD

__all__ = ["PartitionState", "EventIds", "SnapshotWriter", "snapshot_records", "load_snapshot", "segment_ranges",
           "STEP_BYTES", "SEGMENT_IDS"]

_CHUNK_BYTES = 512 * 1024  # well under the broker's default max.message.bytes (1 MiB)
# Snapshots of an older layout (without the partition's event ids, or without aggregate types: 2; every event id
# in each snapshot: 3; written at once, chunks under p/<i>: 4) are not loaded: the partition is rebuilt from its
# log instead, once, and snapshotted anew.
# 5: every event id; its snapshots would load them all again, so they are not loaded either.
# 7: aggregates' index keys (the account's payment ids) as entries of their own beside the states (issue 42).
# A format-6 snapshot holds the ids inside its states, which load the same way: it is still loaded.
_FORMAT = 7
_LOADABLE = (6, 7)
_INDEX_PER_ENTRY = 1_000  # index keys of one aggregate per snapshot entry
_MISSING = object()
# What a decoded value held in the cache costs beyond its encoded size, as a multiple of it (states: dataclasses
# of a few fields); measured with tracemalloc.
_STATE_DECODED = 2
_IDS_PER_ENTRY = 10_000
# What one step of a snapshot encodes and commits while the handler takes no command: ~2 MB is tens of ms.
STEP_BYTES = 2 * 1024 * 1024
SEGMENT_IDS = 50_000  # event ids per id segment (about 2 MB of JSON: one step)


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
    # the gap is filled (read_models.sequence). Only records written around the handler make gaps; not kept in
    # snapshots.
    waiting: dict[tuple[str, str], dict] = field(default_factory=dict)
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
    # The partition's state store (event_store.state_store) when ``states`` and ``results`` are read through it
    # (``stored``), else None (everything in the dicts above).
    store: Any = None

    @classmethod
    def stored(cls, partition: int, store, window: int, cache_bytes: int,
               loaded: "PartitionState | None" = None) -> "PartitionState":
        """A partition's state read through ``store`` (its states and windows on disk, the hot ones in a cache of
        about ``cache_bytes``): what the store holds when ``loaded`` is None, else ``loaded`` (a snapshot's state
        or one rebuilt in memory) written into it (the store emptied first) with its positions."""
        part = cls(partition, window=window, store=store)
        cache = _Cache(cache_bytes)
        part.states = StoredStates(store, cache)
        part.results = StoredWindows(store)
        if loaded is None:
            events_offset, results_offset = store.positions() or (0, 0)
            meta = json.loads(store.meta() or b"{}")
            part.events_offset, part.results_offset = events_offset, results_offset
            part.events_since_snapshot = meta.get("events_since_snapshot", 0)
            part.events_held = meta.get("events_held", 0)
            part.slot, part.manifest_offset = meta.get("slot"), meta.get("manifest_offset")
            part.states.count = meta.get("aggregates", 0)
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
                part.results.add(aggregate_id, command_id, _result_row(row))
        part.waiting = loaded.waiting
        part.flush()
        return part

    def flush(self) -> bool:
        """Write what changed since the last flush (states, windows, event ids) with the positions into the store
        in one transaction; called once the handler's Kafka transaction is committed (Kafka is the source of
        truth: an aborted batch never reaches here). Not while events wait after a gap (the store would cover
        a position they are not folded at; they are not stored): what changed stays in memory until they are
        folded. False when nothing was written (no store, events waiting, or a newer owner wrote the store)."""
        store = self.store
        if store is None or self.waiting:
            return False
        states, results = self.states, self.results
        meta = json.dumps({"events_since_snapshot": self.events_since_snapshot, "events_held": self.events_held,
                           "slot": self.slot, "manifest_offset": self.manifest_offset,
                           "aggregates": states.count, "cached_bytes": states.cache.held}).encode()
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
                           self.event_ids.unstored, meta=meta, index=index, window=self.window):
            return False  # kept: written with the next flush (when this instance still owns the partition)
        states.written(encoded_states)
        results.dirty.clear()
        self.event_ids.unstored.clear()
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
            return None if row is None else _result_from_row(aggregate_id, json.loads(row))
        recent = self.results.get(aggregate_id)
        found = recent.get(command_id) if recent else None
        if isinstance(found, bytes):  # still its row, encoded: made into a result on first use
            found = recent[command_id] = _result_from_row(aggregate_id, json.loads(found))
        elif isinstance(found, list):  # still the snapshot's row
            found = recent[command_id] = _result_from_row(aggregate_id, found)
        return found

    def remember(self, result: CommandResult) -> None:
        """Keep ``result`` as the answer to its command_id, unless an earlier one is already kept."""
        results = self.results
        if self.store is not None:  # one entry, written by the next flush
            results.add(result.aggregate_id, result.command_id, bytes(memoryview(_result_row(result))))
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
        recent[result.command_id] = bytes(memoryview(_result_row(result)))
        if len(recent) > self.window:
            del recent[next(iter(recent))]

    def snapshot_written(self, writer: "SnapshotWriter") -> None:
        """The manifest of ``writer``'s snapshot of this partition is committed: its id segments are listed by
        the next snapshot, its ids are saved, and the events after its cut count toward the next one."""
        self.id_segments += writer.segments
        self.event_ids.saved(writer.unsaved_ids)
        self.events_since_snapshot = max(0, self.events_since_snapshot - writer.events_counted)
        self.slot = writer.slot
        self.manifest_offset = writer.manifest_offset
        self.flush()  # the store's bookkeeping names the slot the next snapshot must not write

    def _remember_row(self, aggregate_id: str, row: list) -> None:
        recent = self.results.get(aggregate_id)
        if recent is None:
            recent = {}
        self.results[aggregate_id] = recent
        recent.setdefault(row[0], row)
        if len(recent) > self.window:
            del recent[next(iter(recent))]


def _result_row(r: CommandResult | list | bytes) -> bytes:
    """A kept result as its snapshot row, encoded."""
    if isinstance(r, bytes):
        return r
    if isinstance(r, list):
        return dumps(r)
    return dumps([r.command_id, r.status, r.version, list(r.event_ids), r.error_type, r.reason, r.recorded_at])


def _window_bytes(recent: dict) -> bytes:
    """An idempotency window as a snapshot writes it: the JSON array of its rows, oldest first."""
    return b"[" + b",".join([_result_row(r) for r in recent.values()]) + b"]"


class _Cache:
    """The decoded values a partition's state store serves most recently, up to about ``cache_bytes`` (each
    counted as its encoded size plus ``ENTRY_OVERHEAD``: decoded it takes a few times that; the bound is the
    setting handler_state_cache_mb). Shared by a partition's states and windows."""

    def __init__(self, cache_bytes: int):
        self.cache_bytes = cache_bytes
        self.entries: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()
        self.held = 0

    def get(self, key: tuple, default=None):
        found = self.entries.get(key)
        if found is None:
            return default
        self.entries.move_to_end(key)
        return found[0]

    def put(self, key: tuple, value: Any, size: int) -> None:
        cost = size + ENTRY_OVERHEAD
        old = self.entries.pop(key, None)
        if old is not None:
            self.held -= old[1]
        if cost > self.cache_bytes:
            return
        self.entries[key] = (value, cost)
        self.held += cost
        while self.held > self.cache_bytes:
            _, (_, old_cost) = self.entries.popitem(last=False)
            self.held -= old_cost


class _Stored(Mapping):
    """A mapping read through a partition's state store: what changed since the last flush (``dirty``), then
    the cache, then LMDB. Setting a key marks it changed; ``PartitionState.flush`` writes the changes. Iterating
    it (and comparing it, as a Mapping) reads every key of the store: for tests and tools, never the handler's
    path."""
    kind = ""
    cut_kind = ""

    def __init__(self, store, cache: _Cache):
        self.store, self.cache = store, cache
        self.dirty: dict = {}
        self.count = 0  # how many keys the store and ``dirty`` hold together

    def _load(self, key):  # -> (decoded value or None, what it costs the cache)
        raise NotImplementedError

    def cost(self, raw: bytes, value) -> int:
        """What ``value`` (decoded from ``raw``) costs the cache, about its size in memory."""
        raise NotImplementedError

    def get(self, key, default=None):
        found = self.dirty.get(key, _MISSING)
        if found is not _MISSING:
            return found
        cached = self.cache.get((self.kind, key), _MISSING)
        if cached is _MISSING:
            cached, size = self._load(key)
            self.cache.put((self.kind, key), cached, size)
        return default if cached is None else cached

    def __contains__(self, key) -> bool:
        return self.get(key) is not None

    def __getitem__(self, key):
        found = self.get(key)
        if found is None:
            raise KeyError(key)
        return found

    def __setitem__(self, key, value) -> None:
        if key not in self.dirty and self.get(key) is None:
            self.count += 1
        self.dirty[key] = value

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator:
        dirty = self.dirty
        yield from list(dirty)
        for kind, aggregate_type, aggregate_id, _ in self.store.cut():
            if kind == self.cut_kind:
                key = (aggregate_type, aggregate_id) if aggregate_type is not None else aggregate_id
                if key not in dirty:
                    yield key

    def written(self, encoded: dict) -> None:
        """The changes are in the store: cached as written."""
        dirty, put, kind, cost = self.dirty, self.cache.put, self.kind, self.cost
        for key, raw in encoded.items():
            value = dirty[key]
            put((kind, key), value, cost(raw, value))
        dirty.clear()


class StoredStates(_Stored):
    """Aggregate states by (aggregate type, aggregate id), read through the store."""
    kind, cut_kind = "s", "state"

    def _load(self, key):
        raw = self.store.state(*key)
        if raw is None:
            return None, 0
        return DOMAINS[key[0]].decode_state(json.loads(raw)), len(raw) * _STATE_DECODED

    def cost(self, raw: bytes, value) -> int:
        return len(raw) * _STATE_DECODED


class StoredWindows:
    """The idempotency windows read through the store, one entry per (aggregate id, command id): what the next
    flush writes (``dirty``, in the order added), then the store (``StateStore.result``). A command costs one
    entry, found or added by itself; the store keeps each aggregate's window bounded when it writes
    (``StateStore.write(window=...)``). Iterating it reads every window of the store (for tests and tools)."""

    def __init__(self, store):
        self.store = store
        self.dirty: dict[tuple[str, str], bytes] = {}

    def first(self, aggregate_id: str, command_id: str) -> bytes | None:
        """The row of the first result of ``command_id`` on ``aggregate_id`` in its window, or None."""
        row = self.dirty.get((aggregate_id, command_id))
        return row if row is not None else self.store.result(aggregate_id, command_id)

    def add(self, aggregate_id: str, command_id: str, row: bytes) -> None:
        """Keep ``row`` as the first result of ``command_id``, unless one is kept already."""
        key = (aggregate_id, command_id)
        if key not in self.dirty and self.store.result(aggregate_id, command_id) is None:
            self.dirty[key] = row

    def added(self) -> list[tuple[str, str, bytes]]:
        return [(aggregate_id, command_id, row) for (aggregate_id, command_id), row in self.dirty.items()]

    def get(self, aggregate_id: str, default=None):
        """An aggregate id's window as {command id: row}, oldest first (stored, then not yet flushed)."""
        recent = dict(self.store.window(aggregate_id))
        for (of, command_id), row in self.dirty.items():
            if of == aggregate_id:
                recent.setdefault(command_id, row)
        return recent or default

    def __iter__(self) -> Iterator[str]:
        seen = set()
        for kind, _, aggregate_id, _ in self.store.cut():
            if kind == "results" and aggregate_id not in seen:
                seen.add(aggregate_id)
                yield aggregate_id
        for aggregate_id, _ in self.dirty:
            if aggregate_id not in seen:
                seen.add(aggregate_id)
                yield aggregate_id

    def items(self):
        return [(aggregate_id, self.get(aggregate_id)) for aggregate_id in self]


def _result_from_row(aggregate_id: str, row: list) -> CommandResult:
    command_id, status, version, event_ids, error_type, reason, recorded_at = row
    return CommandResult(command_id, aggregate_id, status, version, tuple(event_ids), error_type, reason, recorded_at)


def _packed(entries: Iterable[bytes], chunk_bytes: int) -> Iterator[list[bytes]]:
    """``entries`` (encoded JSON values) grouped into lists of up to ``chunk_bytes`` each, as they come."""
    chunk: list[bytes] = []
    size = 0
    for entry in entries:
        if size + len(entry) > chunk_bytes and chunk:
            yield chunk
            chunk, size = [], 0
        chunk.append(entry)
        size += len(entry) + 1
    if chunk:
        yield chunk


class SnapshotWriter:
    """One snapshot of ``part``, written in steps: ``step(budget)`` gives the records of the next transaction
    (id segments and chunks, then the manifest alone), ``delivered`` takes each record's offset from its delivery
    report, ``step_written`` is called once the step is committed; ``done`` when the manifest is. A step that was
    not committed is given again by the next ``step``. The handler calls ``part.snapshot_written(writer)`` when
    done. Everything the snapshot holds but the idempotency window is a cut taken here (module docstring)."""

    def __init__(self, part: PartitionState):
        self.part = part
        self.partition = part.partition
        self.snapshot_id = str(uuid.uuid4())
        self.slot = "b" if part.slot == "a" else "a"
        self.events_offset, self.results_offset = part.events_offset, part.results_offset
        self.events_counted = part.events_since_snapshot
        # The first ``unsaved_ids`` unsaved ids (the list only grows at its end) go in this snapshot's segments.
        self.unsaved_ids = len(part.event_ids.unsaved)
        self.event_id_count = len(part.event_ids)
        self.aggregate_count = len(part.states)
        self.events_held = part.events_held
        self.segments: list[dict] = []  # the id segments written, with their first record's offset
        self.chunks = 0
        self.first_offset: int | None = None  # of this snapshot's first record
        self.manifest_offset: int | None = None  # of its manifest, once written
        self.done = False
        if part.store is not None:  # the store's cut: states and windows as they are now, already encoded
            self._units = self._encoded(_entries_of_cut(part.store.cut()))
        else:
            self._units = self._encoded(_entries_of(list(part.states.items()), list(part.results), part.results))
        self._step: list[tuple[bytes, bytes]] | None = None  # the step given and not yet committed
        self._step_segments: list[dict] = []
        self._manifest = False
        self._offsets: dict[bytes, int] = {}

    def _encoded(self, entries: Iterator[bytes]) -> Iterator[tuple[list[tuple[bytes, bytes]], dict | None]]:
        """The snapshot's units, each written whole in one step: (records, its id segment or None)."""
        p, unsaved = self.partition, self.part.event_ids.unsaved
        for start in range(0, self.unsaved_ids, SEGMENT_IDS):
            segment_id = str(uuid.uuid4())
            stop = min(start + SEGMENT_IDS, self.unsaved_ids)
            head = b'{"segment":' + dumps(segment_id) + b',"event_ids":['
            # Each entry a list of ids; the order of ids never mattered (sorting them cost most of a snapshot).
            pieces = list(_packed((dumps(unsaved[i:min(i + _IDS_PER_ENTRY, stop)])
                                   for i in range(start, stop, _IDS_PER_ENTRY)), _CHUNK_BYTES))
            yield ([(f"{p}/ids/{segment_id}/{i}".encode(), head + b",".join(piece) + b"]}")
                    for i, piece in enumerate(pieces)], {"id": segment_id, "records": len(pieces), "ids": stop - start})
        head = b'{"snapshot_id":' + dumps(self.snapshot_id) + b',"entries":['
        for chunk in _packed(entries, _CHUNK_BYTES):
            yield [(f"{p}/{self.slot}/{self.chunks}".encode(), head + b",".join(chunk) + b"]}")], None
            self.chunks += 1

    def step(self, budget: int | None = STEP_BYTES) -> list[tuple[bytes, bytes]]:
        """The records of the next step (about ``budget`` bytes; None: everything left), the same again when the
        last one given was not committed."""
        if self._step is not None:
            for key, _ in self._step:
                self._offsets.pop(key, None)
            return self._step
        records: list[tuple[bytes, bytes]] = []
        self._step_segments = []
        size = 0
        while budget is None or size < budget:
            unit = next(self._units, None)
            if unit is None:
                break
            records += unit[0]
            size += sum(len(value) for _, value in unit[0])
            if unit[1] is not None:
                self._step_segments.append(unit[1])
        if not records:
            records = [(str(self.partition).encode(), json.dumps(self._manifest_value()).encode())]
            self._manifest = True
        elif self.part.manifest_offset is not None:
            # Last in every other step: where the partition's latest manifest is, so a restart after a crash
            # mid-snapshot finds it from the end of the partition as when no snapshot was being written.
            records.append((f"{self.partition}/latest".encode(),
                            json.dumps({"manifest_offset": self.part.manifest_offset}).encode()))
        self._step = records
        return records

    def _manifest_value(self) -> dict:
        return {"snapshot_id": self.snapshot_id, "format": _FORMAT, "partition": self.partition, "slot": self.slot,
                "chunks": self.chunks, "first_offset": self.first_offset, "events_offset": self.events_offset,
                "results_offset": self.results_offset, "aggregates": self.aggregate_count,
                "event_ids": self.event_id_count, "events_held": self.events_held, "id_segments": [*self.part.id_segments, *self.segments]}

    def delivered(self, key: bytes, offset: int) -> None:
        self._offsets[key] = offset

    def on_delivery(self, error, message) -> None:
        """A delivery report callback (confluent-kafka) for this snapshot's records."""
        if error is None:
            self.delivered(message.key(), message.offset())

    def step_written(self) -> bool:
        """The step given last is committed. False when a record's offset is unknown (no delivery report): the
        manifest could not say where the snapshot lies, so this snapshot cannot be finished."""
        offsets = [self._offsets.get(key) for key, _ in self._step]
        if None in offsets:
            return False
        if self.first_offset is None:
            self.first_offset = min(offsets)
        if self._manifest:
            self.manifest_offset = offsets[0]
        for segment in self._step_segments:
            self.segments.append({**segment, "offset": self._offsets[f"{self.partition}/ids/{segment['id']}/0"
                                                                    .encode()]})
        self._step, self._step_segments = None, []
        self.done = self._manifest
        return True


def _entries_of(states: list, result_ids: list, results) -> Iterator[bytes]:
    """A snapshot's entries, each encoded once (a chunk is those encodings joined into one JSON document): an
    aggregate's state is one entry (its type, its id, its domain's encoding of it); an aggregate id's recent
    results another."""
    return itertools.chain(
        (dumps({"aggregate_type": aggregate_type, "aggregate_id": aggregate_id,
                "state": DOMAINS[aggregate_type].encode_state(state)})
         for (aggregate_type, aggregate_id), state in states),
        (b'{"aggregate_id":' + dumps(aggregate_id) + b',"results":' + _window_bytes(recent) + b"}"
         for aggregate_id in result_ids if (recent := results.get(aggregate_id))))


def _entries_of_cut(cut: Iterator[tuple[str, str | None, str, bytes]]) -> Iterator[bytes]:
    """The same entries from a state store's cut (event_store.state_store.StateStore.cut), stored encoded."""
    index: list[str] = []
    index_of: tuple[str | None, str] | None = None
    for kind, aggregate_type, aggregate_id, raw in cut:
        if index and (kind != "index" or (aggregate_type, aggregate_id) != index_of
                      or len(index) >= _INDEX_PER_ENTRY):
            yield _index_entry(*index_of, index)
            index = []
        if kind == "state":
            yield (b'{"aggregate_type":' + dumps(aggregate_type) + b',"aggregate_id":' + dumps(aggregate_id)
                   + b',"state":' + raw + b"}")
        elif kind == "index":
            index_of = (aggregate_type, aggregate_id)
            index.append(raw.decode())
        elif raw:
            yield b'{"aggregate_id":' + dumps(aggregate_id) + b',"results":[' + b",".join(raw) + b"]}"
    if index:
        yield _index_entry(*index_of, index)


def _index_entry(aggregate_type: str, aggregate_id: str, keys: list[str]) -> bytes:
    """A snapshot entry of index keys of one aggregate (loaded after its state, which comes first in a chunk)."""
    return (b'{"aggregate_type":' + dumps(aggregate_type) + b',"aggregate_id":' + dumps(aggregate_id)
            + b',"index":' + dumps(keys) + b"}")


def snapshot_records(part: PartitionState) -> list[tuple[bytes, bytes]]:
    """(key, value) records of one snapshot of ``part`` written at once (the manifest last), numbered from
    offset 0 as if each step were a transaction of its own; ``part`` is left as it was."""
    writer = SnapshotWriter(part)
    records: list[tuple[bytes, bytes]] = []
    offset = 0
    while not writer.done:
        for key, value in writer.step(None):
            writer.delivered(key, offset)
            records.append((key, value))
            offset += 1
        offset += 1  # the commit marker
        writer.step_written()
    return records


def segment_ranges(manifest: dict, manifest_offset: int) -> list[tuple[int, int]]:
    """The (start, end) offset ranges of the snapshots partition that hold the snapshot of ``manifest`` (read
    at ``manifest_offset``): from its first record to its manifest (nothing else writes the partition meanwhile
    but its own retried steps), and each earlier id segment; overlapping ranges merged."""
    first = manifest.get("first_offset")
    ranges = [(first if first is not None else manifest_offset, manifest_offset + 1)]
    ranges += [(seg["offset"], seg["offset"] + seg["records"]) for seg in manifest.get("id_segments", [])]
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def load_snapshot(records: Iterable, partition: int, window: int) -> PartitionState | None:
    """The latest complete snapshot of ``partition`` among ``records`` (its snapshots partition), or None.
    InvalidRecord when a record the latest manifest names is missing or of another snapshot."""
    latest: dict[str, bytes] = {}
    manifest_offset = None
    for record in records:
        if record.key is not None and record.value is not None:
            key = record.key.decode()
            latest[key] = record.value
            if key == str(partition):
                manifest_offset = getattr(record, "offset", None)
    manifest_raw = latest.get(str(partition))
    if manifest_raw is None:
        return None
    manifest = json.loads(manifest_raw)
    if manifest.get("format") not in _LOADABLE:
        return None
    snapshot_id = manifest["snapshot_id"]
    part = PartitionState(partition, events_offset=manifest["events_offset"],
                          results_offset=manifest["results_offset"], window=window,
                          events_held=manifest.get("events_held", 0))
    for segment in manifest["id_segments"]:
        for i in range(segment["records"]):
            key = f"{partition}/ids/{segment['id']}/{i}"
            piece = json.loads(latest.get(key, b"{}"))
            if piece.get("segment") != segment["id"]:
                raise InvalidRecord(f"snapshot {snapshot_id} of partition {partition}: record {i} of id segment "
                                    f"{segment['id']} is missing; delete the snapshot key to rebuild from the log")
            for ids in piece["event_ids"]:
                part.event_ids.load(ids)
        part.id_segments.append(segment)
    part.slot, part.manifest_offset = manifest["slot"], manifest_offset
    for i in range(manifest["chunks"]):
        chunk = json.loads(latest.get(f"{partition}/{part.slot}/{i}", b"{}"))
        if chunk.get("snapshot_id") != snapshot_id:
            raise InvalidRecord(f"snapshot {snapshot_id} of partition {partition}: chunk {i} is "
                                f"missing or from another snapshot; delete the snapshot key to rebuild from the log")
        for entry in chunk["entries"]:
            if "state" in entry:
                aggregate_type = entry["aggregate_type"]
                domain = DOMAINS.get(aggregate_type)
                if domain is None:
                    raise InvalidRecord(f"snapshot {snapshot_id} of partition {partition}: aggregate "
                                        f"type {aggregate_type!r} is not registered here (known: "
                                        f"{', '.join(DOMAINS)}); the partition is rebuilt from the log")
                part.states[(aggregate_type, entry["aggregate_id"])] = domain.decode_state(entry["state"])
            elif "index" in entry:
                key = (entry["aggregate_type"], entry["aggregate_id"])
                known = DOMAINS[key[0]].index_known
                state = part.state(*key)
                for index_key in entry["index"]:
                    state = known(state, index_key)
                part.states[key] = state
            else:
                for row in entry["results"]:
                    part._remember_row(entry["aggregate_id"], row)
    return part
