"""The handler's state of one partition read through its state store (issue 42): what changed since the last flush,
then a cache of decoded values bounded by ``Settings.handler_state_cache_mb``, then LMDB
(``event_store.state_store``). ``event_store.partition_state.PartitionState.stored`` builds its ``states`` and
``results`` from these; the snapshots (``event_store.snapshots``) read the store's cut instead.
"""
from __future__ import annotations

import orjson
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Iterator

from event_store.domains import DOMAINS
from event_store.state_store import ENTRY_OVERHEAD

__all__ = ["StateCache", "StoredMapping", "StoredStates", "StoredWindows"]

_MISSING = object()
# What a decoded state held in the cache costs beyond its encoded size, as a multiple of it (states: dataclasses
# of a few fields); measured with tracemalloc.
_STATE_DECODED = 2


class StateCache:
    """The decoded values the handler's state stores serve most recently, up to about ``cache_bytes`` (each
    counted as its encoded size plus ``ENTRY_OVERHEAD``: decoded it takes a few times that; the bound is the
    setting handler_state_cache_mb). One for all the partitions a handler owns (``PartitionRebuilder``), so the
    setting bounds the handler whatever it owns; each partition's entries under its own scope (``forget`` drops
    them when the partition is read anew: another owner may have written its store meanwhile)."""

    def __init__(self, cache_bytes: int):
        self.cache_bytes = cache_bytes
        self.entries: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()
        self.held = 0
        self.held_by: dict[Any, int] = {}  # per scope (partition), what its entries cost

    def _count(self, key: tuple, cost: int) -> None:
        self.held += cost
        self.held_by[key[0]] = self.held_by.get(key[0], 0) + cost

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
            self._count(key, -old[1])
        if cost > self.cache_bytes:
            return
        self.entries[key] = (value, cost)
        self._count(key, cost)
        while self.held > self.cache_bytes:
            old_key, (_, old_cost) = self.entries.popitem(last=False)
            self._count(old_key, -old_cost)

    def forget(self, scope) -> None:
        """Drop every entry of ``scope`` (keys ``(scope, ...)``)."""
        for key in [key for key in self.entries if key[0] == scope]:
            self._count(key, -self.entries.pop(key)[1])
        self.held_by.pop(scope, None)


class StoredMapping(Mapping):
    """A mapping read through a partition's state store: what changed since the last flush (``dirty``), then
    the cache, then LMDB. Setting a key marks it changed; ``PartitionState.flush`` writes the changes. Iterating
    it (and comparing it, as a Mapping) reads every key of the store: for tests and tools, never the handler's
    path."""
    kind = ""
    cut_kind = ""

    def __init__(self, store, cache: StateCache, scope=None):
        self.store, self.cache, self.scope = store, cache, scope
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
        cached = self.cache.get((self.scope, self.kind, key), _MISSING)
        if cached is _MISSING:
            cached, size = self._load(key)
            self.cache.put((self.scope, self.kind, key), cached, size)
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
        dirty, put, scope, kind, cost = self.dirty, self.cache.put, self.scope, self.kind, self.cost
        for key, raw in encoded.items():
            value = dirty[key]
            put((scope, kind, key), value, cost(raw, value))
        dirty.clear()


class StoredStates(StoredMapping):
    """Aggregate states by (aggregate type, aggregate id), read through the store."""
    kind, cut_kind = "s", "state"

    def _load(self, key):
        raw = self.store.state(*key)
        if raw is None:
            return None, 0
        # orjson: a fifth of json's time per state read from the store (the cold command path reads one per command).
        return DOMAINS[key[0]].decode_state(orjson.loads(raw)), len(raw) * _STATE_DECODED

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
