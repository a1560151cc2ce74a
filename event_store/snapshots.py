"""What the command handler holds per partition, and its snapshots on a compacted Kafka topic.

Commands partition ``p`` maps to events partition ``p`` (the handler writes an aggregate's events to the
partition its commands came from), so one partition's aggregates can be rebuilt from events partition
``p`` alone. A snapshot of partition ``p`` is the state of its aggregates (of every domain, each encoded by its
domain and recorded with its aggregate type), the idempotency window and the events/results offsets that state
covers; a restart reads the snapshot and only the records after it.

On the snapshots topic (``cleanup.policy=compact``, same partition count, written to partition ``p``) a
snapshot is a manifest under key ``p`` plus chunks under keys ``p/0``, ``p/1``, ... (a snapshot can be larger
than one Kafka record). Manifest and chunks are written in one transaction and carry the same
``snapshot_id``; compaction keeps the latest value per key, so the latest manifest always finds its chunks
(stale chunks with a higher index are ignored).

The partition's event ids, which only grow, are not rewritten by every snapshot: a snapshot writes the ids
added since the one before as an id segment (keys ``p/ids/<segment>/0``, ``/1``, ..., unique, so compaction
never drops them) in the same transaction, just before its chunks, and its manifest lists every segment of the
partition with the offset of its first record (the new one's is known once written: it sits just before the
chunks). With a snapshot due after a quarter of the events a partition holds (``event_store.handler``), a
snapshot writes a quarter of the ids rather than all of them, and a partition has a few dozen segments.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

from event_store.domains import DOMAINS
from event_store.envelope import CommandResult, dumps
from event_store.errors import InvalidRecord

__all__ = ["PartitionState", "EventIds", "Snapshot", "take_snapshot", "snapshot_records", "load_snapshot",
           "segment_ranges"]

_CHUNK_BYTES = 512 * 1024  # well under the broker's default max.message.bytes (1 MiB)
# Snapshots of an older layout (without the partition's event ids, or without aggregate types: 2; every event id
# in each snapshot: 3) are not loaded: the partition is rebuilt from its log instead, once, and snapshotted anew.
_FORMAT = 4
_IDS_PER_ENTRY = 10_000


class EventIds(set):
    """A partition's event ids: a set that also lists, in order, the ids added since its last snapshot
    (``unsaved``), which the next snapshot writes as its id segment. Ids read back from a snapshot go in through
    ``load`` (saved already)."""

    def __init__(self, ids: Iterable[str] = ()):
        super().__init__()
        self.unsaved: list[str] = []
        self.update(ids)

    def add(self, event_id: str) -> None:
        if event_id not in self:
            set.add(self, event_id)
            self.unsaved.append(event_id)

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
    """The handler's in-memory state for one owned partition."""
    partition: int
    # Every aggregate's state by (aggregate type, aggregate id): ids are unique per aggregate type only.
    states: dict[tuple[str, str], Any] = field(default_factory=dict)
    # Per aggregate id, the FIRST result of its most recent commands, oldest first (bounded by ``window``); a plain
    # dict keeps insertion order and costs less than an OrderedDict.
    results: dict[str, dict] = field(default_factory=dict)
    events_offset: int = 0   # next offset of events partition p not folded into ``states``
    results_offset: int = 0  # next offset of results partition p not folded into ``results``
    events_since_snapshot: int = 0
    window: int = 100
    # Per (aggregate type, aggregate id), events read from the log after a gap (version -> event), applied once
    # the gap is filled (read_models.sequence). Only records written around the handler make gaps; not kept in
    # snapshots.
    waiting: dict[tuple[str, str], dict] = field(default_factory=dict)
    # The id of every event of this partition the log holds (read back or written by this handler): a record
    # repeating one of them counts once, wherever its repeat claims to be (read_models.sequence); an aggregate's
    # records all live in its partition. Kept in snapshots, so a repeat of an id from before one is caught too.
    event_ids: EventIds = field(default_factory=EventIds)
    # The id segments its latest snapshot lists (``{"id", "records", "ids", "offset"}``; offset: of its first record
    # on the snapshots partition), oldest first.
    id_segments: list[dict] = field(default_factory=list)

    def state(self, aggregate_type: str, aggregate_id: str) -> Any:
        """The state of an aggregate: as held, or its domain's initial state. KeyError for an unknown type."""
        found = self.states.get((aggregate_type, aggregate_id))
        return found if found is not None else DOMAINS[aggregate_type].initial(aggregate_id)

    def owner_of(self, aggregate_type: str, aggregate_id: str, staged: dict | None = None) -> str | None:
        """Another aggregate type that has an aggregate with this id here (in ``states`` or in ``staged``, states
        not yet committed), or None. Every aggregate with an id lives in its partition (keyed by id)."""
        for other in DOMAINS:
            key = (other, aggregate_id)
            if other != aggregate_type and (key in self.states or (staged is not None and key in staged)):
                return other
        return None

    def first_result(self, aggregate_id: str, command_id: str) -> CommandResult | None:
        recent = self.results.get(aggregate_id)
        found = recent.get(command_id) if recent else None
        if isinstance(found, list):  # still the snapshot's row: made into a result on first use
            found = recent[command_id] = _result_from_row(aggregate_id, found)
        return found

    def remember(self, result: CommandResult) -> None:
        """Keep ``result`` as the answer to its command_id, unless an earlier one is already kept."""
        recent = self.results.get(result.aggregate_id)
        if recent is None:
            recent = self.results[result.aggregate_id] = {}
        elif result.command_id in recent:
            return
        # Kept as its snapshot row: most are never asked for again, and every snapshot writes them all.
        recent[result.command_id] = [result.command_id, result.status, result.version, list(result.event_ids),
                                     result.error_type, result.reason, result.recorded_at]
        if len(recent) > self.window:
            del recent[next(iter(recent))]

    def snapshot_written(self, snapshot: "Snapshot", manifest_offset: int) -> None:
        """``snapshot`` of this partition is committed, its manifest at ``manifest_offset``: its id segment is
        listed by the next snapshot, and its ids are saved."""
        if snapshot.segment is not None:
            offset = manifest_offset - snapshot.chunks - snapshot.segment["records"]
            self.id_segments.append({**snapshot.segment, "offset": offset})
            self.event_ids.saved(snapshot.segment["ids"])
        self.events_since_snapshot = 0

    def _remember_row(self, aggregate_id: str, row: list) -> None:
        recent = self.results.get(aggregate_id)
        if recent is None:
            recent = self.results[aggregate_id] = {}
        recent.setdefault(row[0], row)
        if len(recent) > self.window:
            del recent[next(iter(recent))]


def _result_row(r: CommandResult | list) -> list:
    if isinstance(r, list):
        return r
    return [r.command_id, r.status, r.version, list(r.event_ids), r.error_type, r.reason, r.recorded_at]


def _result_from_row(aggregate_id: str, row: list) -> CommandResult:
    command_id, status, version, event_ids, error_type, reason, recorded_at = row
    return CommandResult(command_id, aggregate_id, status, version, tuple(event_ids), error_type, reason, recorded_at)


@dataclass
class Snapshot:
    """One snapshot of a partition: its records (the new id segment's, the chunks, the manifest last), how many
    chunks, and the id segment it adds (None when no id was added since the last one)."""
    records: list[tuple[bytes, bytes]]
    chunks: int
    segment: dict | None


def _packed(entries: Iterable[bytes]) -> list[list[bytes]]:
    """``entries`` (encoded JSON values) grouped into records of up to _CHUNK_BYTES each."""
    chunks: list[list[bytes]] = [[]]
    size = 0
    for entry in entries:
        if size + len(entry) > _CHUNK_BYTES and chunks[-1]:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += len(entry) + 1
    return chunks


def take_snapshot(part: PartitionState) -> Snapshot:
    """The records of one snapshot of ``part``: the ids added since its last snapshot as a new id segment, its
    aggregates' states and recent results as chunks, then the manifest."""
    snapshot_id = str(uuid.uuid4())
    p = part.partition
    records: list[tuple[bytes, bytes]] = []
    segment = None
    unsaved = part.event_ids.unsaved
    if unsaved:
        head = b'{"segment":' + dumps(snapshot_id) + b',"event_ids":['
        # Each entry a list of ids; the order of ids never mattered (sorting them cost most of a snapshot's time).
        pieces = _packed(dumps(unsaved[i:i + _IDS_PER_ENTRY]) for i in range(0, len(unsaved), _IDS_PER_ENTRY))
        records += [(f"{p}/ids/{snapshot_id}/{i}".encode(), head + b",".join(piece) + b"]}")
                    for i, piece in enumerate(pieces)]
        segment = {"id": snapshot_id, "records": len(pieces), "ids": len(unsaved)}
    # Each entry is encoded once; a chunk is those encodings joined into one JSON document. An aggregate's state
    # is one entry (its type, its id, its domain's encoding of it); an aggregate id's recent results another.
    entries = [dumps({"aggregate_type": aggregate_type, "aggregate_id": aggregate_id,
                      "state": DOMAINS[aggregate_type].encode_state(state)})
               for (aggregate_type, aggregate_id), state in part.states.items()]
    entries += [dumps({"aggregate_id": aggregate_id, "results": [_result_row(r) for r in recent.values()]})
                for aggregate_id, recent in part.results.items()]
    chunks = _packed(entries)
    head = b'{"snapshot_id":' + dumps(snapshot_id) + b',"entries":['
    records += [(f"{p}/{i}".encode(), head + b",".join(chunk) + b"]}") for i, chunk in enumerate(chunks)]
    segments = [*part.id_segments, {**segment, "offset": None}] if segment else list(part.id_segments)
    manifest = {"snapshot_id": snapshot_id, "format": _FORMAT, "partition": p, "chunks": len(chunks),
                "events_offset": part.events_offset, "results_offset": part.results_offset,
                "aggregates": len(part.states), "event_ids": len(part.event_ids), "id_segments": segments}
    records.append((str(p).encode(), json.dumps(manifest).encode()))
    return Snapshot(records, len(chunks), segment)


def snapshot_records(part: PartitionState) -> list[tuple[bytes, bytes]]:
    """(key, value) records of one snapshot of ``part``: the new id segment's, the chunks, the manifest last."""
    return take_snapshot(part).records


def segment_ranges(manifest: dict, manifest_offset: int) -> list[tuple[int, int]]:
    """The (start, end) offset ranges of the snapshots partition that hold the snapshot of ``manifest`` (read
    at ``manifest_offset``): its chunks and new id segment just before it, and each earlier id segment."""
    newest = sum(seg["records"] for seg in manifest.get("id_segments", []) if seg.get("offset") is None)
    ranges = [(max(0, manifest_offset - manifest["chunks"] - newest), manifest_offset + 1)]
    ranges += [(seg["offset"], seg["offset"] + seg["records"]) for seg in manifest.get("id_segments", [])
               if seg.get("offset") is not None]
    return ranges


def load_snapshot(records: Iterable, partition: int, window: int) -> PartitionState | None:
    """The latest complete snapshot of ``partition`` among ``records`` (its snapshots partition), or None.
    InvalidRecord when a record the latest manifest names is missing or of another snapshot."""
    latest: dict[str, bytes] = {}
    offsets: dict[str, int | None] = {}
    for record in records:
        if record.key is not None and record.value is not None:
            key = record.key.decode()
            latest[key] = record.value
            offsets[key] = getattr(record, "offset", None)
    manifest_raw = latest.get(str(partition))
    if manifest_raw is None:
        return None
    manifest = json.loads(manifest_raw)
    if manifest.get("format") != _FORMAT:
        return None
    snapshot_id = manifest["snapshot_id"]
    part = PartitionState(partition, events_offset=manifest["events_offset"],
                          results_offset=manifest["results_offset"], window=window)
    for segment in manifest["id_segments"]:
        for i in range(segment["records"]):
            key = f"{partition}/ids/{segment['id']}/{i}"
            piece = json.loads(latest.get(key, b"{}"))
            if piece.get("segment") != segment["id"]:
                raise InvalidRecord(f"snapshot {snapshot_id} of partition {partition}: record {i} of id segment "
                                    f"{segment['id']} is missing; delete the snapshot key to rebuild from the log")
            for ids in piece["event_ids"]:
                part.event_ids.load(ids)
        first = offsets.get(f"{partition}/ids/{segment['id']}/0")
        part.id_segments.append({**segment, "offset": first if first is not None else segment["offset"]})
    for i in range(manifest["chunks"]):
        chunk = json.loads(latest.get(f"{partition}/{i}", b"{}"))
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
            else:
                for row in entry["results"]:
                    part._remember_row(entry["aggregate_id"], row)
    return part
