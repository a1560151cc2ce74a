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
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

from event_store.domains import DOMAINS
from event_store.envelope import CommandResult, dumps
from event_store.errors import InvalidRecord

__all__ = ["PartitionState", "snapshot_records", "load_snapshot"]

_CHUNK_BYTES = 512 * 1024  # well under the broker's default max.message.bytes (1 MiB)
# Snapshots of an older layout (without the partition's event ids, or without aggregate types: 2) are not loaded:
# the partition is rebuilt from its log instead, once, and snapshotted anew.
_FORMAT = 3
_IDS_PER_ENTRY = 10_000


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
    event_ids: set[str] = field(default_factory=set)

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


def snapshot_records(part: PartitionState) -> list[tuple[bytes, bytes]]:
    """(key, value) records of one snapshot of ``part``: chunks first, the manifest last."""
    snapshot_id = str(uuid.uuid4())
    # Each entry is encoded once; a chunk is those encodings joined into one JSON document. An aggregate's state
    # is one entry (its type, its id, its domain's encoding of it); an aggregate id's recent results another.
    chunks: list[list[bytes]] = [[]]
    size = 0
    entries = [dumps({"aggregate_type": aggregate_type, "aggregate_id": aggregate_id,
                      "state": DOMAINS[aggregate_type].encode_state(state)})
               for (aggregate_type, aggregate_id), state in part.states.items()]
    entries += [dumps({"aggregate_id": aggregate_id, "results": [_result_row(r) for r in recent.values()]})
                for aggregate_id, recent in part.results.items()]
    for entry in entries:
        if size + len(entry) > _CHUNK_BYTES and chunks[-1]:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += len(entry) + 1
    ids = list(part.event_ids)  # in no order: sorting them took most of the time of a large snapshot
    for i in range(0, len(ids), _IDS_PER_ENTRY):
        entry = dumps({"event_ids": ids[i:i + _IDS_PER_ENTRY]})
        if size + len(entry) > _CHUNK_BYTES and chunks[-1]:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += len(entry) + 1
    p = part.partition
    head = b'{"snapshot_id":' + dumps(snapshot_id) + b',"entries":['
    records = [(f"{p}/{i}".encode(), head + b",".join(chunk) + b"]}") for i, chunk in enumerate(chunks)]
    manifest = {"snapshot_id": snapshot_id, "format": _FORMAT, "partition": p, "chunks": len(chunks),
                "events_offset": part.events_offset, "results_offset": part.results_offset,
                "aggregates": len(part.states)}
    records.append((str(p).encode(), json.dumps(manifest).encode()))
    return records


def load_snapshot(records: Iterable, partition: int, window: int) -> PartitionState | None:
    """The latest complete snapshot of ``partition`` among ``records`` (its snapshots partition), or None."""
    latest: dict[str, bytes] = {}
    for record in records:
        if record.key is not None and record.value is not None:
            latest[record.key.decode()] = record.value
    manifest_raw = latest.get(str(partition))
    if manifest_raw is None:
        return None
    manifest = json.loads(manifest_raw)
    if manifest.get("format") != _FORMAT:
        return None
    part = PartitionState(partition, events_offset=manifest["events_offset"],
                          results_offset=manifest["results_offset"], window=window)
    for i in range(manifest["chunks"]):
        chunk = json.loads(latest.get(f"{partition}/{i}", b"{}"))
        if chunk.get("snapshot_id") != manifest["snapshot_id"]:
            raise InvalidRecord(f"snapshot {manifest['snapshot_id']} of partition {partition}: chunk {i} is "
                                f"missing or from another snapshot; delete the snapshot key to rebuild from the log")
        for entry in chunk["entries"]:
            if "event_ids" in entry:
                part.event_ids.update(entry["event_ids"])
            elif "state" in entry:
                aggregate_type = entry["aggregate_type"]
                domain = DOMAINS.get(aggregate_type)
                if domain is None:
                    raise InvalidRecord(f"snapshot {manifest['snapshot_id']} of partition {partition}: aggregate "
                                        f"type {aggregate_type!r} is not registered here (known: "
                                        f"{', '.join(DOMAINS)}); the partition is rebuilt from the log")
                part.states[(aggregate_type, entry["aggregate_id"])] = domain.decode_state(entry["state"])
            else:
                for row in entry["results"]:
                    part._remember_row(entry["aggregate_id"], row)
    return part
