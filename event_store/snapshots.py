"""The command handler's snapshots of a partition on a compacted Kafka topic: writing them in steps
(``SnapshotWriter``) and loading them (``load_snapshot``). What a partition's state is (``PartitionState``) lives in
``event_store.partition_state`` (re-exported here), its store-backed mappings in ``event_store.stored_state``.

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

Events read after a gap in their aggregate's versions (``PartitionState.waiting``: only records written around
the handler make gaps) are in every snapshot, base or increment, all of them, as entries tagged with the snapshot
(``waiting_of``): a loader takes only the latest snapshot's, so an earlier part's list, as it was then, is not
taken. Without them, a partition whose gap is never filled could never be snapshotted (issue 42).

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
from typing import Iterable, Iterator

import orjson

from event_store.domains import DOMAINS
from event_store.envelope import EventEnvelope, dumps
from event_store.errors import InvalidRecord
from event_store.partition_state import EventIds, PartitionState, result_row

__all__ = ["PartitionState", "EventIds", "SnapshotWriter", "snapshot_records", "load_snapshot", "restore_snapshot",
           "segment_ranges", "MAX_INCREMENTS", "RESTORE_BATCH",
           "STEP_BYTES", "SEGMENT_IDS"]

_CHUNK_BYTES = 512 * 1024  # well under the broker's default max.message.bytes (1 MiB)
# Snapshots of an older layout (without the partition's event ids, or without aggregate types: 2; every event id
# in each snapshot: 3; written at once, chunks under p/<i>: 4) are not loaded: the partition is rebuilt from its
# log instead, once, and snapshotted anew.
# 5: every event id; its snapshots would load them all again, so they are not loaded either.
# 7: aggregates' index keys (the account's payment ids) as entries of their own beside the states (issue 42).
# A format-6 snapshot holds the ids inside its states, which load the same way: it is still loaded.
# 8: incremental: a manifest lists its parts, a full base then the changes after it (module docstring).
_FORMAT = 8
_LOADABLE = (6, 7, 8)
# A full base after this many incremental snapshots (so the keys on the compacted topic stay bounded: two slots
# of a base and at most this many increments each).
MAX_INCREMENTS = 8
# Store entries (states, index keys, window rows) per store transaction of a restore: the pages a transaction
# changes stay in LMDB's heap (partition_rebuild.FLUSH_EVERY), so a transaction stays small.
RESTORE_BATCH = 5_000
_INDEX_PER_ENTRY = 1_000  # index keys of one aggregate per snapshot entry
_IDS_PER_ENTRY = 10_000
# What one step of a snapshot encodes and commits while the handler takes no command: ~2 MB is tens of ms.
STEP_BYTES = 2 * 1024 * 1024
SEGMENT_IDS = 50_000  # event ids per id segment (about 2 MB of JSON: one step)


def _window_bytes(recent: dict) -> bytes:
    """An idempotency window as a snapshot writes it: the JSON array of its rows, oldest first."""
    return b"[" + b",".join([result_row(r) for r in recent.values()]) + b"]"


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
        self.epoch: int | None = None
        # Incremental when this instance wrote a complete snapshot since its rebuild (its chain) and the chain is
        # short enough; else a full base in the other slot.
        self.incremental = (part.store is not None and part.chain is not None
                            and len(part.chain) <= MAX_INCREMENTS)
        if self.incremental:
            self.slot = part.slot
            self.prefix = f"{self.partition}/{self.slot}/d{len(part.chain)}"
        else:
            self.prefix = f"{self.partition}/{self.slot}"
        # Every event waiting after a gap, in every snapshot (a base or an increment; few, and only where records
        # were written around the handler), encoded now: the cut of this moment.
        waiting = [_waiting_entry(self.snapshot_id, key, events) for key, events in part.waiting.items() if events]
        if part.store is not None:  # the store's cut: states and windows as they are now, already encoded
            self.epoch = part.store.begin_snapshot()
            cut = part.store.changes(self.epoch) if self.incremental else part.store.cut()
            self._units = self._encoded(itertools.chain(waiting, _entries_of_cut(cut)))
        else:
            self._units = self._encoded(itertools.chain(
                waiting, _entries_of(list(part.states.items()), list(part.results), part.results)))
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
            yield [(f"{self.prefix}/{self.chunks}".encode(), head + b",".join(chunk) + b"]}")], None
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

    @property
    def chain(self) -> list[dict]:
        """The parts of this snapshot: its base and increments before it (when incremental), then itself."""
        own = {"snapshot_id": self.snapshot_id, "prefix": self.prefix, "chunks": self.chunks,
               "first_offset": self.first_offset, "end_offset": self.manifest_offset}
        return [*(self.part.chain if self.incremental else ()), own]

    def _manifest_value(self) -> dict:
        return {"snapshot_id": self.snapshot_id, "format": _FORMAT, "partition": self.partition, "slot": self.slot,
                "chunks": self.chunks, "parts": self.chain, "incremental": self.incremental,
                "first_offset": self.first_offset, "events_offset": self.events_offset,
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


def _waiting_entry(snapshot_id: str, key: tuple[str, str], events: dict) -> bytes:
    """A snapshot entry of the events of one aggregate waiting after a gap (``PartitionState.waiting``), tagged
    with the snapshot that holds them: every snapshot lists all of them, so only its own are loaded (an earlier
    part's are as they were then)."""
    return (b'{"waiting_of":' + dumps(snapshot_id) + b',"aggregate_type":' + dumps(key[0]) + b',"aggregate_id":'
            + dumps(key[1]) + b',"events":[' + b",".join(event.to_json() for _, event in sorted(events.items()))
            + b"]}")


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
    ranges += [(piece["first_offset"], piece["end_offset"] + 1) for piece in manifest.get("parts", [])
               if piece.get("first_offset") is not None and piece.get("end_offset") is not None]
    ranges += [(seg["offset"], seg["offset"] + seg["records"]) for seg in manifest.get("id_segments", [])]
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def _latest_manifest(records: Iterable, partition: int) -> tuple[dict, dict, int | None] | None:
    """(the latest value per key, the latest manifest of ``partition``, its offset) among ``records``, or None."""
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
    return latest, manifest, manifest_offset


def _chunks(latest: dict, manifest: dict, partition: int) -> Iterator[list]:
    """The entries of each chunk of the snapshot, part by part (base, then increments), in order."""
    parts = manifest.get("parts") or [{"snapshot_id": manifest["snapshot_id"], "chunks": manifest["chunks"],
                                       "prefix": f"{partition}/{manifest['slot']}"}]
    for piece in parts:
        for i in range(piece["chunks"]):
            chunk = orjson.loads(latest.get(f"{piece['prefix']}/{i}", b"{}"))  # json's result, ~3x the speed
            if chunk.get("snapshot_id") != piece["snapshot_id"]:
                raise InvalidRecord(f"snapshot {manifest['snapshot_id']} of partition {partition}: chunk {i} of part "
                                    f"{piece['snapshot_id']} is missing or from another snapshot; delete the "
                                    f"snapshot key to rebuild from the log")
            yield chunk["entries"]


def restore_snapshot(records: Iterable, partition: int, window: int, store) -> PartitionState | None:
    """The latest complete snapshot of ``partition`` among ``records`` written straight into ``store`` (emptied
    first), entry by entry in transactions of about ``RESTORE_BATCH`` store entries, its positions last: memory stays that of
    a batch, whatever the partition holds (``load_snapshot`` decodes it all into memory). Returns the snapshot's
    bookkeeping (offsets, slot, id segments; no states), or None when there is none. InvalidRecord as
    ``load_snapshot``; a restore cut short leaves a store without positions, which the next start restores again."""
    found = _latest_manifest(records, partition)
    if found is None:
        return None
    latest, manifest, manifest_offset = found
    head = _bookkeeping(latest, manifest, manifest_offset, partition, window)
    store.clear()
    states: dict = {}
    index: list = []
    windows: dict = {}
    waiting: dict = {}
    held = 0
    for entries in _chunks(latest, manifest, partition):
        for entry in entries:
            if "waiting_of" in entry:
                if entry["waiting_of"] == manifest["snapshot_id"]:
                    waiting[(entry["aggregate_type"], entry["aggregate_id"])] = {
                        event["aggregate_version"]: dumps(event) for event in entry["events"]}
            elif "state" in entry:
                key = (entry["aggregate_type"], entry["aggregate_id"])
                domain = DOMAINS.get(key[0])
                if domain is None:
                    raise InvalidRecord(f"snapshot {manifest['snapshot_id']} of partition {partition}: aggregate "
                                        f"type {key[0]!r} is not registered here (known: {', '.join(DOMAINS)})")
                state = domain.decode_state(entry["state"])
                if domain.index_split is not None:
                    state, keys = domain.index_split(state)
                    if keys:
                        index.append((key[0], key[1], keys))
                        held += len(keys)
                states[key] = dumps(domain.encode_state(state))
                held += 1
            elif "index" in entry:
                index.append((entry["aggregate_type"], entry["aggregate_id"], entry["index"]))
                held += len(entry["index"])
            else:
                windows[entry["aggregate_id"]] = rows = [(row[0], dumps(row)) for row in entry["results"]]
                held += len(rows)
            if held >= RESTORE_BATCH:
                store.restore(states, index, windows, window)
                states, index, windows, held = {}, [], {}, 0
    store.restore(states, index, windows, window)
    meta = json.dumps({"events_since_snapshot": 0, "events_held": head.events_held, "slot": head.slot,
                       "manifest_offset": head.manifest_offset,
                       "aggregates": manifest.get("aggregates", 0)}).encode()
    store.write(head.events_offset, head.results_offset, event_ids=list(head.event_ids), meta=meta, mark=False,
                waiting=waiting)
    return head


def load_snapshot(records: Iterable, partition: int, window: int) -> PartitionState | None:
    """The latest complete snapshot of ``partition`` among ``records`` (its snapshots partition), or None.
    InvalidRecord when a record the latest manifest names is missing or of another snapshot."""
    found = _latest_manifest(records, partition)
    if found is None:
        return None
    latest, manifest, manifest_offset = found
    part = _bookkeeping(latest, manifest, manifest_offset, partition, window)
    index: dict[tuple[str, str], list[str]] = {}
    for entries in _chunks(latest, manifest, partition):
        _load_entries(part, entries, index, f"snapshot {manifest['snapshot_id']} of partition {partition}",
                      manifest["snapshot_id"])
    for key, keys in index.items():  # the index keys last: a later part's state replaces an earlier one whole
        known = DOMAINS[key[0]].index_known
        state = part.state(*key)
        for index_key in keys:
            state = known(state, index_key)
        part.states[key] = state
    return part


def _bookkeeping(latest: dict, manifest: dict, manifest_offset: int | None, partition: int,
                 window: int) -> PartitionState:
    """A partition state holding a snapshot's offsets, event ids (from its id segments), slot and manifest offset,
    without its states."""
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
    return part


def _load_entries(part: PartitionState, entries: list, index: dict, what: str, snapshot_id: str) -> None:
    """One chunk's entries into ``part`` (states replaced, windows replaced whole, the events waiting after a gap
    of snapshot ``snapshot_id``) and ``index`` (keys added)."""
    replaced: set[str] = set()
    for entry in entries:
        if "waiting_of" in entry:
            if entry["waiting_of"] == snapshot_id:
                part.waiting[(entry["aggregate_type"], entry["aggregate_id"])] = {
                    event.aggregate_version: event for event in map(EventEnvelope.from_json, map(dumps,
                                                                                                   entry["events"]))}
        elif "state" in entry:
            aggregate_type = entry["aggregate_type"]
            domain = DOMAINS.get(aggregate_type)
            if domain is None:
                raise InvalidRecord(f"{what}: aggregate type {aggregate_type!r} is not registered here (known: "
                                    f"{', '.join(DOMAINS)}); the partition is rebuilt from the log")
            part.states[(aggregate_type, entry["aggregate_id"])] = domain.decode_state(entry["state"])
        elif "index" in entry:
            index.setdefault((entry["aggregate_type"], entry["aggregate_id"]), []).extend(entry["index"])
        else:
            aggregate_id = entry["aggregate_id"]
            if aggregate_id not in replaced:  # an increment's window is the whole window as it was then
                replaced.add(aggregate_id)
                part.results.pop(aggregate_id, None)
            for row in entry["results"]:
                part.remember_row(aggregate_id, row)
