"""What the command handler holds per partition, and its snapshots on a compacted Kafka topic.

Commands partition ``p`` maps to events partition ``p`` (the handler writes an account's events to the
partition its commands came from), so one partition's aggregates can be rebuilt from events partition
``p`` alone. A snapshot of partition ``p`` is the state of its accounts, the idempotency window and the
events/results offsets that state covers; a restart reads the snapshot and only the records after it.

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
from typing import Iterable

from pyrsistent import pset

from event_store.account import AccountState
from event_store.envelope import CommandResult, dumps
from event_store.errors import InvalidRecord

__all__ = ["PartitionState", "snapshot_records", "load_snapshot"]

_CHUNK_BYTES = 512 * 1024  # well under the broker's default max.message.bytes (1 MiB)
# Snapshots of an older layout (without the partition's event ids) are not loaded: the partition is rebuilt
# from its log instead, once, and snapshotted anew.
_FORMAT = 2
_IDS_PER_ENTRY = 10_000


@dataclass
class PartitionState:
    """The handler's in-memory state for one owned partition."""
    partition: int
    accounts: dict[str, AccountState] = field(default_factory=dict)
    # Per account, the FIRST result of its most recent commands, oldest first (bounded by ``window``); a plain
    # dict keeps insertion order and costs less than an OrderedDict.
    results: dict[str, dict] = field(default_factory=dict)
    events_offset: int = 0   # next offset of events partition p not folded into ``accounts``
    results_offset: int = 0  # next offset of results partition p not folded into ``results``
    events_since_snapshot: int = 0
    window: int = 100
    # Per account, events read from the log after a gap (version -> event), applied once the gap is filled
    # (read_models.sequence). Only records written around the handler make gaps; not kept in snapshots.
    waiting: dict[str, dict] = field(default_factory=dict)
    # The id of every event of this partition the log holds (read back or written by this handler): a record
    # repeating one of them counts once, wherever its repeat claims to be (read_models.sequence); an account's
    # records all live in its partition. Kept in snapshots, so a repeat of an id from before one is caught too.
    event_ids: set[str] = field(default_factory=set)

    def account(self, account_id: str) -> AccountState:
        return self.accounts.get(account_id) or AccountState(account_id)

    def first_result(self, account_id: str, command_id: str) -> CommandResult | None:
        recent = self.results.get(account_id)
        found = recent.get(command_id) if recent else None
        if isinstance(found, list):  # still the snapshot's row: made into a result on first use
            found = recent[command_id] = _result_from_row(account_id, found)
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

    def _remember_row(self, account_id: str, row: list) -> None:
        recent = self.results.get(account_id)
        if recent is None:
            recent = self.results[account_id] = {}
        recent.setdefault(row[0], row)
        if len(recent) > self.window:
            del recent[next(iter(recent))]


def _result_row(r: CommandResult | list) -> list:
    if isinstance(r, list):
        return r
    return [r.command_id, r.status, r.version, list(r.event_ids), r.error_type, r.reason, r.recorded_at]


def _result_from_row(account_id: str, row: list) -> CommandResult:
    command_id, status, version, event_ids, error_type, reason, recorded_at = row
    return CommandResult(command_id, account_id, status, version, tuple(event_ids), error_type, reason, recorded_at)


def snapshot_records(part: PartitionState) -> list[tuple[bytes, bytes]]:
    """(key, value) records of one snapshot of ``part``: chunks first, the manifest last."""
    snapshot_id = str(uuid.uuid4())
    # Each account's entry is encoded once; a chunk is those encodings joined into one JSON document.
    chunks: list[list[bytes]] = [[]]
    size = 0
    for account_id in part.accounts.keys() | part.results.keys():
        state = part.accounts.get(account_id)
        entry = dumps({"state": None if state is None else _state_fields(state), "account_id": account_id,
                       "results": [_result_row(r) for r in part.results.get(account_id, {}).values()]})
        if size + len(entry) > _CHUNK_BYTES and chunks[-1]:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += len(entry) + 1
    ids = sorted(part.event_ids)
    for i in range(0, len(ids), _IDS_PER_ENTRY):
        entry = dumps({"event_ids": ids[i:i + _IDS_PER_ENTRY]})
        if size + len(entry) > _CHUNK_BYTES and chunks[-1]:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += len(entry) + 1
    p = part.partition
    head = b'{"snapshot_id":' + dumps(snapshot_id) + b',"accounts":['
    records = [(f"{p}/{i}".encode(), head + b",".join(chunk) + b"]}") for i, chunk in enumerate(chunks)]
    manifest = {"snapshot_id": snapshot_id, "format": _FORMAT, "partition": p, "chunks": len(chunks),
                "events_offset": part.events_offset, "results_offset": part.results_offset,
                "accounts": len(part.accounts)}
    records.append((str(p).encode(), json.dumps(manifest).encode()))
    return records


def _state_fields(state: AccountState) -> dict:
    """``dataclasses.asdict(state)`` with the payment ids as a list (JSON has no sets)."""
    fields = dict(state.__dict__)
    fields["payment_ids"] = sorted(state.payment_ids)
    return fields


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
        for entry in chunk["accounts"]:
            if "event_ids" in entry:
                part.event_ids.update(entry["event_ids"])
                continue
            if entry["state"] is not None:
                state = entry["state"]
                state["payment_ids"] = pset(state.get("payment_ids") or ())
                state["quarantine"] = tuple(state["quarantine"]) if state.get("quarantine") else None
                part.accounts[entry["account_id"]] = AccountState(**state)
            for row in entry["results"]:
                part._remember_row(entry["account_id"], row)
    return part
