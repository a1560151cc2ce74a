"""One partition's command-handler state on disk (LMDB), with a bounded in-memory cache.

What Kafka Streams and Flink keep in RocksDB (issue 42): per owned partition, the aggregates' states, their
idempotency windows, the event ids the repeat rule still needs (``event_store.partition_rebuild.apply_logged``:
only the ids a record's own fields do not derive) and the log positions (``events_offset``, ``results_offset``)
they cover. ``write`` puts a batch's changes and the positions in ONE LMDB transaction, so whoever opens the store
sees a state together with the position it covers, never one without the other: a restart on the same machine
opens the store and replays only the log after its positions (``PartitionRebuilder``'s tail), whatever the
log's length. Kafka stays the source of truth: the store is written after the handler's Kafka transaction
commits, without an fsync per batch (a kill -9 loses nothing LMDB committed; an OS crash may lose the last
batches, which the replay from the older positions reads again, never the store's consistency). A batch written
twice leaves the store as written once (every write is a put of the key's whole value).

Values are bytes encoded by the caller (a domain's ``encode_state``, the window's rows). The cache keeps the most
recently used values up to ``cache_bytes`` (counted as the encoded size plus a fixed overhead per entry), so the
handler's memory follows the cache, not the number of aggregates. LMDB's own pages live in the OS page cache; the
ones the process has touched are handed back at most once a second after a write or a restore's transaction, and
every 65,536 entries of a snapshot's walk through the store (``lakehouse.mapped_pages``), so they do not count in
the handler's RSS as the store grows.

The handler reads its states and windows through a store (``event_store.stored_state``: its own cache of decoded
values) and writes each committed batch's changes; ``event_store.partition_rebuild`` starts a partition from its
store when its positions are within the log. Instances sharing a home: ``write`` never moves the positions back.
The snapshots topic (``event_store.snapshots``: incremental, from the marks writes leave) is what an instance that
never held the partition restores from. The fraud detector's states: ``event_store.account.fraud_state``.
Chosen over SQLite in WAL mode by bench/state_store.py (1M aggregates: 1.6x the batch rate, ~30x the random reads).
"""
from __future__ import annotations

import json
import struct
import threading
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import lmdb

from lakehouse.faults import store_write_point
from lakehouse.mapped_pages import Releaser

__all__ = ["StateStore", "store_path", "store_figures", "status_lines", "ENTRY_OVERHEAD"]

# Keys: one byte of kind, then the key's text. The positions' key sorts before all of them.
_POSITIONS = b"\x00positions"
_META = b"\x00meta"  # the caller's bookkeeping (JSON), written with the positions
_STATE, _EVENT_ID, _INDEX = b"s", b"i", b"p"
# The idempotency windows, one entry per (aggregate id, command id) (issue 42: a command costs one entry, not a
# rewrite of its aggregate's whole window): ``c`` + id + command id -> the entry's sequence number and its row;
# ``q`` + id + sequence number -> command id (the window's order, oldest first); ``n`` + id -> (oldest, next)
# sequence numbers. Older stores kept a window per aggregate under ``r``: they are emptied on open (_FORMAT).
_RESULT, _ORDER, _HEAD = b"c", b"q", b"n"
# Events read after a gap in their aggregate's versions (``PartitionState.waiting``): ``v`` + aggregate type + id +
# version -> the event (JSON), so the positions written beside them may pass them (a gap that is never filled, a
# forged record, must not keep the store from being written: issue 42).
_WAITING = b"v"
_SEQ = struct.Struct(">Q")
_HEADS = struct.Struct(">QQ")
# The store's layout: a store of another one (or of none: before payment ids and windows per entry) is emptied
# when opened, and its partition comes from the latest snapshot and the log once (docs/DESIGN.md).
_FORMAT_KEY = b"\x00format"
# Incremental snapshots (event_store.snapshots): each write also marks what it changed, ``d`` + ``s`` key of a
# state, ``d`` + ``p`` key of an index key, ``d`` + ``w`` + aggregate id of a window, with the store's snapshot
# epoch (``_EPOCH``). A snapshot starts by moving the epoch on (``begin_snapshot``) and writes what is marked with
# an older one (``changes``); once its manifest is committed, those marks go (``snapshot_done``).
_MARK, _MARK_WINDOW = b"d", b"w"
_EPOCH = b"\x00epoch"
_FORMAT = b"2"
_SEP = b"\x00"
# What a cached entry costs beyond its encoded value (the dict slot, the key, the bytes object's header).
ENTRY_OVERHEAD = 200
# The largest the memory map may grow to (address space only: the file grows with its content).
_MAP_SIZE = 1 << 40
# LMDB must not be opened twice in one process (closing either breaks the other's locks): every StateStore of
# one path in this process shares one environment, closed with the last of them.
_ENVS: dict[str, "_Shared"] = {}
_ENVS_LOCK = threading.Lock()
# While a snapshot walks the store: every so many entries it hands the pages it read back (lakehouse.mapped_pages;
# ~15-30 MB of pages here, ~3 ms each: a few per cent of a bare walk, far less of a snapshot's encoding).
_RELEASE_EVERY_ENTRIES = 65_536


def _new_env(key: str) -> lmdb.Environment:
    # sync/metasync off: durable against a killed process (the OS holds the pages); Kafka is the source of truth
    # for what an OS crash would lose (module docstring).
    return lmdb.open(key, map_size=_MAP_SIZE, sync=False, metasync=False, readahead=False, max_dbs=0)


class _Shared:
    """One path's LMDB environment, shared by every StateStore on it in this process, and renewed after writes.

    LMDB copies each page a write transaction changes into memory of its own (malloc'd, outside its map) and keeps
    those copies for the next transactions until the environment closes: the process then holds as many pages as
    the largest write it ever made touched. The stores grow, and a batch's puts spread over more pages; a burst
    makes a larger batch. In a soak at 2,000 commands/s the handler's heap grew by ~50 MB an hour of such copies
    (bench/README.md, "The soak"). ``renew`` closes the environment and opens it again (~0.1 ms): the copies are
    freed, the data is the file's. Not while a walk (a snapshot's cut, which holds a read transaction across
    batches) is open: then at the first write after it."""

    __slots__ = ("key", "env", "users", "walks", "lock")

    def __init__(self, key: str):
        self.key = key
        self.env = _new_env(key)
        self.users = 0
        self.walks: weakref.WeakSet = weakref.WeakSet()  # generators holding a read transaction
        self.lock = threading.Lock()  # a renewal against another thread's reads of figures (metrics)

    def walk(self, entries: Iterator) -> Iterator:
        self.walks.add(entries)
        return entries

    def renew(self) -> bool:
        """Close and reopen the environment unless a walk is open: -> whether it was."""
        if any(w.gi_frame is not None for w in list(self.walks)):  # started or not, and not finished
            return False
        with self.lock:
            self.env.close()
            self.env = _new_env(self.key)
        return True


def _open_env(path: Path) -> _Shared:
    key = str(path.resolve())
    with _ENVS_LOCK:
        held = _ENVS.get(key)
        if held is None:
            held = _ENVS[key] = _Shared(key)
            held.env.reader_check()  # read slots of killed processes (a snapshot's cut) freed
        held.users += 1
        return held


def _close_env(path: Path) -> None:
    key = str(path.resolve())
    with _ENVS_LOCK:
        held = _ENVS.get(key)
        if held is not None:
            held.users -= 1
            if held.users <= 0:
                del _ENVS[key]
                held.env.close()


def store_path(home: Path, events_topic: str, partition: int) -> Path:
    """Where the state store of ``partition`` of ``events_topic`` lives under the handler's ``home``."""
    return Path(home) / "handler-state" / f"{events_topic}-{partition}"


def _state_key(aggregate_type: str, aggregate_id: str) -> bytes:
    return _STATE + aggregate_type.encode() + _SEP + aggregate_id.encode()


def _result_key(aggregate_id: str, command_id: str) -> bytes:
    return _RESULT + aggregate_id.encode() + _SEP + command_id.encode()


def _order_key(aggregate_id: bytes, seq: int) -> bytes:
    return _ORDER + aggregate_id + _SEP + _SEQ.pack(seq)


def _event_id_key(event_id: str) -> bytes:
    return _EVENT_ID + event_id.encode()


def _index_key(aggregate_type: str, aggregate_id: str, key: str) -> bytes:
    return _INDEX + aggregate_type.encode() + _SEP + aggregate_id.encode() + _SEP + key.encode()


def _waiting_prefix(aggregate_type: str, aggregate_id: str) -> bytes:
    return _WAITING + aggregate_type.encode() + _SEP + aggregate_id.encode() + _SEP


class StateStore:
    """A partition's state store at ``path`` (created if missing), caching up to ``cache_bytes`` of values."""

    def __init__(self, path: Path | str, cache_bytes: int = 64 << 20):
        if cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, not {cache_bytes}")
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._shared = _open_env(self.path)
        self._pages = Releaser(self.path / "data.mdb")
        self._closed = False
        with self._env.begin(write=True) as txn:
            if txn.get(_FORMAT_KEY) != _FORMAT:
                _empty(txn)
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[bytes, bytes | None] = OrderedDict()
        self._cached = 0

    @property
    def _env(self) -> lmdb.Environment:
        return self._shared.env

    # Reading --------------------------------------------------------------------------------------------------
    def positions(self) -> tuple[int, int] | None:
        """(events_offset, results_offset) the stored state covers, or None for a store never written."""
        with self._env.begin() as txn:
            raw = txn.get(_POSITIONS)
        return None if raw is None else struct.unpack(">qq", raw)

    def meta(self) -> bytes | None:
        """The bookkeeping last written with the positions (``write(meta=...)``), or None."""
        with self._env.begin() as txn:
            raw = txn.get(_META)
        return None if raw is None else bytes(raw)

    def state(self, aggregate_type: str, aggregate_id: str) -> bytes | None:
        """The encoded state of an aggregate, or None."""
        return self._get(_state_key(aggregate_type, aggregate_id))

    def result(self, aggregate_id: str, command_id: str) -> bytes | None:
        """The row (encoded) of the first result of ``command_id`` on ``aggregate_id`` while in its idempotency
        window, or None."""
        raw = self._get(_result_key(aggregate_id, command_id))
        return None if raw is None else raw[_SEQ.size:]

    def window(self, aggregate_id: str) -> list[tuple[str, bytes]]:
        """(command id, row) of an aggregate id's idempotency window, oldest first."""
        with self._env.begin() as txn:
            return [(command_id, row) for _, command_id, row in _window_of(txn, _ORDER + aggregate_id.encode()
                                                                           + _SEP)]

    def has_index(self, aggregate_type: str, aggregate_id: str, key: str) -> bool:
        """Whether ``key`` is in the index of an aggregate (``Domain.index_split``: the account's payment ids)."""
        return self._get(_index_key(aggregate_type, aggregate_id, key)) is not None

    def has_event_id(self, event_id: str) -> bool:
        """Whether ``event_id`` is in the store's event-id index."""
        return self._get(_event_id_key(event_id)) is not None

    def states(self) -> Iterator[tuple[str, str, bytes]]:
        """Every stored (aggregate type, aggregate id, encoded state), in key order (for a snapshot), read past
        the cache."""
        with self._env.begin() as txn:
            cursor = txn.cursor()
            if cursor.set_range(_STATE):
                for n, (key, value) in enumerate(cursor):
                    if not key.startswith(_STATE):
                        break
                    if n % _RELEASE_EVERY_ENTRIES == _RELEASE_EVERY_ENTRIES - 1:
                        self._pages.now()  # a walk through the store: the pages it read handed back (as _cut)
                    aggregate_type, _, aggregate_id = key[1:].partition(_SEP)
                    yield aggregate_type.decode(), aggregate_id.decode(), bytes(value)
        self._pages.now()

    def event_ids(self) -> Iterator[str]:
        """Every id of the event-id index."""
        with self._env.begin() as txn:
            cursor = txn.cursor()
            if cursor.set_range(_EVENT_ID):
                for key in cursor.iternext(keys=True, values=False):
                    if not key.startswith(_EVENT_ID):
                        break
                    yield bytes(key[1:]).decode()

    def waiting(self) -> Iterator[tuple[str, str, int, bytes]]:
        """Every stored event waiting after a gap: (aggregate type, aggregate id, version, the event's JSON)."""
        with self._env.begin() as txn:
            cursor = txn.cursor()
            if cursor.set_range(_WAITING):
                for key, value in cursor:
                    if not key.startswith(_WAITING):
                        break
                    aggregate_type, _, rest = bytes(key[1:-_SEQ.size - 1]).partition(_SEP)
                    yield (aggregate_type.decode(), rest.decode(), _SEQ.unpack(key[-_SEQ.size:])[0], bytes(value))

    def cut(self) -> Iterator[tuple[str, str | None, str, bytes]]:
        """A consistent cut of the store as it is now, for a snapshot: a read transaction begun here (LMDB keeps
        what it sees unchanged while later batches are written) iterated as every (``"state"``, aggregate type,
        aggregate id, encoded state), then every (``"index"``, aggregate type, aggregate id, key) of the
        aggregates' indexes, then every (``"results"``, None, aggregate id, encoded window), past the cache. The transaction ends with the iteration (or when the iterator is dropped)."""
        return self._shared.walk(self._cut(self._env.begin(), self._pages))

    @staticmethod
    def _cut(txn, pages: Releaser) -> Iterator[tuple[str, str | None, str, bytes]]:
        try:
            cursor = txn.cursor()
            if cursor.set_range(_STATE):
                for n, (key, value) in enumerate(cursor):
                    if not key.startswith(_STATE):
                        break
                    if n % _RELEASE_EVERY_ENTRIES == _RELEASE_EVERY_ENTRIES - 1:
                        pages.now()
                    aggregate_type, _, aggregate_id = bytes(key[1:]).partition(_SEP)
                    yield "state", aggregate_type.decode(), aggregate_id.decode(), bytes(value)
            cursor = txn.cursor()
            if cursor.set_range(_INDEX):
                for n, key in enumerate(cursor.iternext(keys=True, values=False)):
                    if not key.startswith(_INDEX):
                        break
                    if n % _RELEASE_EVERY_ENTRIES == _RELEASE_EVERY_ENTRIES - 1:
                        pages.now()
                    aggregate_type, _, rest = bytes(key[1:]).partition(_SEP)
                    aggregate_id, _, index_key = rest.partition(_SEP)
                    yield "index", aggregate_type.decode(), aggregate_id.decode(), index_key
            rows: list[bytes] = []
            of = None
            for n, (aggregate_id, _, row) in enumerate(_window_of(txn, _ORDER)):
                if n % _RELEASE_EVERY_ENTRIES == _RELEASE_EVERY_ENTRIES - 1:
                    pages.now()
                if aggregate_id != of and rows:
                    yield "results", None, of, rows
                    rows = []
                of = aggregate_id
                rows.append(row)
            if rows:
                yield "results", None, of, rows
        finally:
            try:
                txn.abort()
            except lmdb.Error:  # the environment was closed first (the handler closed mid-snapshot)
                pass

    def begin_snapshot(self) -> int:
        """Move the snapshot epoch on: what is marked until now (the epoch returned, or older) is what a snapshot
        beginning now writes as its changes; later writes are marked for the next one."""
        with self._env.begin(write=True) as txn:
            epoch = _SEQ.unpack(txn.get(_EPOCH) or _SEQ.pack(0))[0]
            txn.put(_EPOCH, _SEQ.pack(epoch + 1))
        return epoch

    def snapshot_done(self, epoch: int) -> int:
        """A snapshot begun at ``epoch`` is committed: the marks of ``epoch`` and older go; how many."""
        gone = 0
        with self._env.begin(write=True) as txn:
            cursor = txn.cursor()
            if cursor.set_range(_MARK):
                while cursor.key().startswith(_MARK):
                    if _SEQ.unpack(cursor.value())[0] <= epoch:
                        gone += 1
                        if not cursor.delete():
                            break
                    elif not cursor.next():
                        break
        return gone

    def changes(self, epoch: int) -> Iterator[tuple[str, str | None, str, object]]:
        """What changed since the last committed snapshot (marked at ``epoch`` or older), as it is now, in the
        form of ``cut`` (states, then index keys, then whole windows), read in one transaction begun here."""
        return self._shared.walk(self._changes(self._env.begin(), epoch, self._pages))

    @staticmethod
    def _changes(txn, epoch: int, pages: Releaser) -> Iterator[tuple[str, str | None, str, object]]:
        try:
            for kind, prefix in (("state", _STATE), ("index", _INDEX), ("results", _MARK_WINDOW)):
                cursor = txn.cursor()
                head = _MARK + prefix
                if not cursor.set_range(head):
                    continue
                for n, (key, value) in enumerate(cursor):
                    if not key.startswith(head):
                        break
                    if n % _RELEASE_EVERY_ENTRIES == _RELEASE_EVERY_ENTRIES - 1:
                        pages.now()
                    if _SEQ.unpack(value)[0] > epoch:
                        continue
                    rest = bytes(key[2:])
                    if kind == "results":
                        aggregate_id = rest.decode()
                        yield kind, None, aggregate_id, [row for _, _, row in _window_of(txn, _ORDER + rest + _SEP)]
                        continue
                    if kind == "state":
                        raw = txn.get(bytes(key[1:]))
                        if raw is None:
                            continue
                        aggregate_type, _, aggregate_id = rest.partition(_SEP)
                        yield kind, aggregate_type.decode(), aggregate_id.decode(), bytes(raw)
                    else:
                        aggregate_type, _, rest = rest.partition(_SEP)
                        aggregate_id, _, index_key = rest.partition(_SEP)
                        yield kind, aggregate_type.decode(), aggregate_id.decode(), index_key
        finally:
            try:
                txn.abort()
            except lmdb.Error:
                pass

    def _get(self, key: bytes) -> bytes | None:
        cache = self._cache
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        with self._env.begin() as txn:
            value = txn.get(key)
        self._cache_put(key, value)
        return value

    # Writing --------------------------------------------------------------------------------------------------
    def write(self, events_offset: int, results_offset: int, states: Mapping[tuple[str, str], bytes] = {},
              results: Iterable[tuple[str, str, bytes]] = (), event_ids: Iterable[str] = (),
              meta: bytes | None = None, index: Iterable[tuple[str, str, str]] = (), window: int = 100,
              mark: bool = True, waiting: Mapping[tuple[str, str], Mapping[int, bytes]] = {}) -> bool:
        """Put a batch's changed states, results (each (aggregate id, command id, row) added to its aggregate's
        idempotency window unless the command is in it already, the oldest entry dropped past ``window``), index keys ((aggregate type, aggregate id, key), each a key of
        its own) and event ids, and the positions they cover (and ``meta``, the
        caller's bookkeeping), and for each aggregate in ``waiting`` its events waiting after a gap ({version: the
        event's JSON}, replacing what it had; empty: none), in one transaction: all of it is visible after, or none of it (an exception or a
        killed process). Positions never go backwards: when the store already covers more of either log (a
        newer owner of the partition wrote it; several instances may share a home), nothing is written and
        False is returned."""
        puts = [(_state_key(*key), value) for key, value in states.items()]
        puts += [(_event_id_key(event_id), b"") for event_id in event_ids]
        puts += [(_index_key(*entry), b"") for entry in index]
        with self._env.begin(write=True) as txn:
            raw = txn.get(_POSITIONS)
            if raw is not None:
                stored_events, stored_results = struct.unpack(">qq", raw)
                if stored_events > events_offset or stored_results > results_offset:
                    return False
            for key, value in puts:
                txn.put(key, value)
            for (aggregate_type, aggregate_id), events in waiting.items():
                prefix = _waiting_prefix(aggregate_type, aggregate_id)
                cursor = txn.cursor()
                if cursor.set_range(prefix):
                    while cursor.key().startswith(prefix):
                        if not cursor.delete():
                            break
                for version, raw in events.items():
                    txn.put(prefix + _SEQ.pack(version), raw)
            results = list(results)
            if mark:  # what the next incremental snapshot writes (module docstring of event_store.snapshots)
                epoch = txn.get(_EPOCH) or _SEQ.pack(0)
                for key, _ in puts:
                    if key[:1] in (_STATE, _INDEX):
                        txn.put(_MARK + key, epoch)
                for aggregate_id in {r[0] for r in results}:
                    txn.put(_MARK + _MARK_WINDOW + aggregate_id.encode(), epoch)
            puts += _add_results(txn, results, window)
            store_write_point()  # a crash test's kill -9 inside the write (lakehouse.faults)
            txn.put(_POSITIONS, struct.pack(">qq", events_offset, results_offset))
            if meta is not None:
                txn.put(_META, meta)
        for key, value in puts:  # only once committed
            self._cache_put(key, value)
        self._shared.renew()  # the pages LMDB copied for this write freed (_Shared)
        self._pages.maybe()
        return True

    def restore(self, states: Mapping[tuple[str, str], bytes], index: Iterable[tuple[str, str, Iterable[str]]],
                windows: Mapping[str, list[tuple[str, bytes]]], window: int) -> None:
        """Put part of a snapshot being restored (``event_store.snapshots.restore_snapshot``) in one transaction:
        states, index keys ((aggregate type, aggregate id, its keys)) and whole windows ((command id, row) oldest
        first, each replacing the aggregate's), unmarked and without positions (the restore writes them last)."""
        puts = [(_state_key(*key), value) for key, value in states.items()]
        for aggregate_type, aggregate_id, keys in index:
            prefix = _index_key(aggregate_type, aggregate_id, "")  # the aggregate's part once, then each key
            puts += [(prefix + k.encode(), b"") for k in keys]
        with self._env.begin(write=True) as txn:
            for aggregate_id, rows in windows.items():
                aid = aggregate_id.encode()
                prefix = _ORDER + aid + _SEP
                for _, command_id, _ in list(_window_of(txn, prefix)):  # the window it replaces, if any
                    txn.delete(_result_key(aggregate_id, command_id))
                cursor = txn.cursor()
                if cursor.set_range(prefix):
                    while cursor.key().startswith(prefix):
                        if not cursor.delete():
                            break
                rows = rows[-window:] if window > 0 else []
                for seq, (command_id, row) in enumerate(rows):
                    puts.append((_result_key(aggregate_id, command_id), _SEQ.pack(seq) + row))
                    puts.append((_order_key(aid, seq), command_id.encode()))
                puts.append((_HEAD + aid, _HEADS.pack(0, len(rows))))
            puts.sort()  # in key order: LMDB's inserts then touch each page once
            txn.cursor().putmulti(puts)
        self.drop_cache()
        self._shared.renew()
        self._pages.maybe()

    def clear(self) -> None:
        """Empty the store (positions included): it covers a log that is not there any more."""
        with self._env.begin(write=True) as txn:
            _empty(txn)
        self.drop_cache()

    def _cache_put(self, key: bytes, value: bytes | None) -> None:
        cache = self._cache
        old = cache.pop(key, 0)
        if old != 0:
            self._cached -= _cost(key, old)
        cost = _cost(key, value)
        if cost > self.cache_bytes:
            return
        cache[key] = value
        self._cached += cost
        while self._cached > self.cache_bytes:
            old_key, old_value = cache.popitem(last=False)
            self._cached -= _cost(old_key, old_value)

    # What it holds ------------------------------------------------------------------------------------------
    def cached_bytes(self) -> int:
        """What the cache holds, as counted against ``cache_bytes``."""
        return self._cached

    def cached_entries(self) -> int:
        return len(self._cache)

    def entries(self) -> int:
        """How many keys the store holds (the positions and the layout's key included)."""
        with self._shared.lock:
            return self._env.stat()["entries"]

    def size_on_disk(self) -> int:
        """Bytes of the store's files on disk."""
        return sum(f.stat().st_size for f in self.path.iterdir() if f.is_file())

    def drop_cache(self) -> None:
        self._cache.clear()
        self._cached = 0

    def settle(self) -> None:
        """When the handler is idle: hand back the pages its last writes mapped (lakehouse.mapped_pages)."""
        if not self._closed:
            self._pages.settle()

    def close(self) -> None:
        self.drop_cache()
        if not self._closed:
            self._closed = True
            _close_env(self.path)

    def __enter__(self) -> "StateStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def store_figures(path: Path | str) -> dict | None:
    """What a partition's store at ``path`` holds, read without changing it (for ``eventlake status``): its size on
    disk, entries, the positions it covers and the cache its handler held at its last write (``meta``'s
    ``cached_bytes``), or None when there is no store there."""
    path = Path(path)
    if not (path / "data.mdb").exists():
        return None
    shared = _open_env(path)
    try:
        with shared.lock:
            with shared.env.begin() as txn:
                raw, meta = txn.get(_POSITIONS), txn.get(_META)
            entries = shared.env.stat()["entries"]
    finally:
        _close_env(path)
    meta_fields = json.loads(bytes(meta)) if meta is not None else {}
    return {"size_on_disk": sum(f.stat().st_size for f in path.iterdir() if f.is_file()), "entries": entries,
            "positions": None if raw is None else struct.unpack(">qq", raw),
            "cached_bytes": meta_fields.get("cached_bytes"), "aggregates": meta_fields.get("aggregates")}


def status_lines(home: Path | str, events_topic: str) -> list[str]:
    """One line per handler partition with a state store under ``home``: size on disk, entries, cached MB and the
    log positions it covers (``eventlake status``)."""
    root = Path(home) / "handler-state"
    lines = []
    prefix = f"{events_topic}-"
    found = sorted((int(d.name[len(prefix):]), d) for d in root.glob(f"{prefix}*")
                   if d.name[len(prefix):].isdigit()) if root.is_dir() else []
    for partition, path in found:
        figures = store_figures(path)
        if figures is None:
            continue
        positions = figures["positions"]
        covers = (f"covers events to offset {positions[0]:,}, results to {positions[1]:,}" if positions
                  else "covers nothing yet")
        cached = figures["cached_bytes"]
        lines.append(f"handler state {events_topic}[{partition}]: {figures['size_on_disk'] / 2**20:,.1f} MiB on "
                     f"disk, {figures['entries']:,} entries"
                     + (f" ({figures['aggregates']:,} aggregates)" if figures["aggregates"] is not None else "")
                     + (f", {cached / 2**20:,.1f} MiB cached" if cached is not None else "")
                     + f", {covers} ({path})")
    return lines


def _empty(txn) -> None:
    """Delete every key, then write the store's layout (_FORMAT)."""
    cursor = txn.cursor()
    if cursor.first():
        while cursor.delete():
            pass
    txn.put(_FORMAT_KEY, _FORMAT)


def _window_of(txn, prefix: bytes) -> Iterator[tuple[str, str, bytes]]:
    """(aggregate id, command id, row) of the windows whose order keys start with ``prefix`` (one aggregate's,
    or all of them), each oldest first."""
    cursor = txn.cursor()
    if not cursor.set_range(prefix):
        return
    for key, command_id in cursor:
        if not key.startswith(prefix):
            break
        aggregate_id = bytes(key[1:-_SEQ.size - 1])
        raw = txn.get(_RESULT + aggregate_id + _SEP + bytes(command_id))
        if raw is not None:
            yield aggregate_id.decode(), bytes(command_id).decode(), bytes(raw[_SEQ.size:])


def _add_results(txn, results: Iterable[tuple[str, str, bytes]], window: int) -> list[tuple[bytes, bytes | None]]:
    """Add each result to its window inside ``txn`` (the first result of a command id stays; past ``window``
    entries the oldest goes): a command costs its entry, its order key and its aggregate's head, whatever the
    window's length. Returns what changed as (key, value or None when deleted) for the cache."""
    heads: dict[bytes, list[int]] = {}
    changed: list[tuple[bytes, bytes | None]] = []
    for aggregate_id, command_id, row in results:
        key = _result_key(aggregate_id, command_id)
        if txn.get(key) is not None:
            continue
        aid = aggregate_id.encode()
        head = heads.get(aid)
        if head is None:
            raw = txn.get(_HEAD + aid)
            head = heads[aid] = list(_HEADS.unpack(raw)) if raw is not None else [0, 0]
        value = _SEQ.pack(head[1]) + row
        txn.put(key, value)
        txn.put(_order_key(aid, head[1]), command_id.encode())
        changed.append((key, value))
        head[1] += 1
        while head[1] - head[0] > window:
            order = _order_key(aid, head[0])
            oldest = txn.get(order)
            txn.delete(order)
            if oldest is not None:
                old_key = _RESULT + aid + _SEP + bytes(oldest)
                txn.delete(old_key)
                changed.append((old_key, None))
            head[0] += 1
    for aid, head in heads.items():
        txn.put(_HEAD + aid, _HEADS.pack(*head))
    return changed


def _cost(key: bytes, value: bytes | None) -> int:
    return len(key) + (len(value) if value else 0) + ENTRY_OVERHEAD
