"""The fraud detector's account states on disk (issue 42): where each partition's state store and snapshot live, the
encoding of a state, the snapshots' format (a header line, then one line per account), and ``HeldPartition``: what
an instance holds of one partition while it owns it. ``event_store.account.fraud_consumer`` (the module docstring
says how states are written and restored) runs the detector over it.
"""
from __future__ import annotations

import json
import time
import zlib
from typing import Callable, Iterator

import orjson

from event_store.account.fraud_rules import FraudState
from event_store.envelope import dumps
from event_store.state_store import StateStore
from lakehouse.settings import Settings
from lakehouse.storage import read_chunks

__all__ = ["SNAPSHOT_FOLDER", "STATE_FOLDER", "STATE_KIND", "HeldPartition", "encode_state", "decode_state",
           "state_store_path", "snapshot_header", "snapshot_states", "snapshot_positions", "status_line"]

SNAPSHOT_FOLDER = "fraud-detector-consumer"  # under the checkpoints: a partition's snapshot for other machines
STATE_FOLDER = "fraud-detector-state"  # under the home: the partitions' state stores
STATE_KIND = "account"  # the state store's aggregate type for the accounts' states


def encode_state(state: FraudState) -> tuple:
    """A state as JSON arrays (tuples serialise as arrays: nothing copied)."""
    return state.last_version, state.max_amount, state.attempts, state.devices


def decode_state(value: list) -> FraudState:
    last_version, max_amount, attempts, devices = value
    return FraudState(last_version, max_amount, tuple(map(tuple, attempts)), tuple(map(tuple, devices)))


def state_store_path(settings: Settings, partition: int):
    """Where the detector's state store of ``partition`` lives (local to the machine, under the home)."""
    return settings.home / STATE_FOLDER / f"{settings.events_topic}-{partition}"


def snapshot_header(path) -> dict | None:
    """The first line of a partition's snapshot at ``path`` (an older snapshot, one JSON object, whole), or None
    when there is none."""
    if not path.exists():
        return None
    head = b""
    for chunk in read_chunks(path, 1 << 16):
        head += chunk
        if b"\n" in head:
            break
    line = head.split(b"\n", 1)[0]
    if b'"states"' in line:  # the format before state stores: everything in one object
        line = path.read_bytes()
    return json.loads(line)


def snapshot_states(path, header: dict) -> Iterator[tuple[str, bytes]]:
    """(account, its encoded state) of the snapshot at ``path`` whose first line is ``header``, streamed."""
    if "states" in header:  # the older format: all in one object, read whole
        for account, value in header["states"].items():
            yield account, dumps(value)
        return
    rest, first = b"", True
    for chunk in read_chunks(path):
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            if first:
                first = False
                continue
            if line:
                account, value = json.loads(line)
                yield account, dumps(value)
    if rest.strip() and not first:
        account, value = json.loads(rest)
        yield account, dumps(value)


def snapshot_positions(settings: Settings) -> dict[int, tuple[int, str]]:
    """partition -> (the offset its state is complete up to on disk, when it was written): the further of its state
    store on this machine and its snapshot under the checkpoints; {} without any. Unreadable ones are left out (the
    detector names them when it starts)."""
    folder = settings.checkpoints / SNAPSHOT_FOLDER
    out = {}
    if folder.exists():
        for path in folder.iterdir():
            if not (path.name.startswith("partition-") and path.name.endswith(".json")):
                continue
            try:
                snapshot = snapshot_header(path)
                out[int(snapshot["partition"])] = (int(snapshot["offset"]), str(snapshot.get("written_at", "")))
            except (OSError, ValueError, KeyError, TypeError):
                continue
    stores = settings.home / STATE_FOLDER
    prefix = f"{settings.events_topic}-"
    if stores.is_dir():
        for path in stores.iterdir():
            tail = path.name[len(prefix):]
            if not (path.name.startswith(prefix) and tail.isdigit() and (path / "data.mdb").exists()):
                continue
            with StateStore(path, cache_bytes=0) as store:
                positions, meta = store.positions(), store.meta()
            if positions is not None and positions[0] > out.get(int(tail), (-1, ""))[0]:
                out[int(tail)] = (positions[0], str(json.loads(meta).get("written_at", "")) if meta else "")
    return out


def status_line(settings: Settings, log_end: int | None) -> str | None:
    """``eventlake status``'s line for the detector: its lag at its last state writes (None: it never ran)."""
    positions = snapshot_positions(settings)
    if not positions:
        return None
    done = sum(offset for offset, _ in positions.values())
    lag = "unknown" if log_end is None else f"{max(log_end - done, 0)}"
    newest = max(written for _, written in positions.values())
    return (f"fraud detector (eventlake detect-fraud): lag {lag} events at its last state snapshots "
            f"({len(positions)} partition(s), newest {newest})")


class HeldPartition:
    """What this consumer holds of one partition: its state store, the states changed since the store's last write,
    and the offsets they are complete up to."""

    def __init__(self, number: int, store: StateStore, offset: int, snapshot_offset: int,
                 opened: Callable[[str, FraudState], FraudState]):
        self.number = number
        self.store = store
        self.dirty: dict[str, FraudState] = {}
        self.offset = offset              # the next offset to fold (state complete below it)
        self.saved_offset = offset        # what the state store covers
        self.snapshot_offset = snapshot_offset  # what the snapshot under the checkpoints covers (-1: none)
        self.snapshot_due = 0.0 if snapshot_offset < offset or snapshot_offset < 0 else time.monotonic()
        self._opened = opened

    # The mapping findings_for folds into: the states changed since the last store write, then the store (its
    # cache of encoded states, then LMDB).
    def get(self, account: str, default=None):
        state = self.dirty.get(account)
        if state is None:
            raw = self.store.state(STATE_KIND, account)
            if raw is None:
                return default
            state = self._opened(account, decode_state(orjson.loads(zlib.decompress(raw))))
        return state

    def __setitem__(self, account: str, state: FraudState) -> None:
        self.dirty[account] = state

    def close(self) -> None:
        self.store.close()
