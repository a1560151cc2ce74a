"""What the Python engine knows of a table it writes between batches, on disk: the keys it holds (as 64-bit hashes)
and, for the sequence ledger, each aggregate's head (issue 42: nothing per event in the engine's memory).

One LMDB file per table under the projection's checkpoint (``INDEX_FOLDER``), the handler's store's choice
(``event_store.state_store``): bench/engine_memory.py ``--stores`` measured it against SQLite in WAL mode on this
access pattern (a batch's keys looked up, then written, in an index of millions). The index records the table's
identity and the version it covers in the same LMDB transaction as the keys. The table is the truth: the index is
written after the table's commit, so after a crash it may lag (never lead); before a batch reads it
(``up_to_date``) it is brought to the table's version by reading only the data files added since the version it
covers (another writer, a commit whose index write a kill -9 cut off, a compaction), or rebuilt from the whole
table when that cannot be told (no index, another table at the path, a version no longer in the Delta log).
Its memory is the versions this engine committed and has not recorded yet (a handful); LMDB's pages are the
kernel's page cache, not the engine's heap, and those a batch touched are handed back after its writes (at most
once a second: ``lakehouse.mapped_pages``), so they do not count in the engine's RSS as the tables grow."""
from __future__ import annotations

import hashlib
import json
import struct
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

import lmdb

from lakehouse.faults import store_write_point
from lakehouse.mapped_pages import Releaser

__all__ = ["KeyIndex", "INDEX_FOLDER", "key_hashes", "covered", "index_figures", "status_lines"]

INDEX_FOLDER = "python-engine-index"  # in the read models' checkpoint
_META = b"\x00meta"
_KEY, _HEAD = b"k", b"h"
_VERSION = struct.Struct(">Q")
_MAP_SIZE = 1 << 40  # address space only: the file grows with its content
_CHUNK_ROWS = 1_000_000  # rows read from the table at a time when rebuilding or catching up
# Keys per write transaction. LMDB copies each page a write transaction changes into memory of its own and keeps
# those copies for reuse after the commit: one transaction of a million random keys would hold a page per key
# for the process's life. The index needs no atomicity across keys (a key is a maybe; ``record`` comes after).
_PUT_CHUNK = 5_000

# LMDB refuses a second open of a file already open in the process ("The environment ... is already open in this
# process"): every KeyIndex on one file shares one environment, closed with its last user. Two engines one after
# the other in one process (a test reading an index after a run; a run after another) then work.
_OPEN: dict[str, list] = {}  # path -> [environment, users]
_OPEN_LOCK = threading.Lock()


def _shared(path: Path) -> lmdb.Environment | None:
    """The environment of ``path`` if the process has it open (one more user, released by ``_release``)."""
    with _OPEN_LOCK:
        entry = _OPEN.get(str(path))
        if entry is not None:
            entry[1] += 1
        return entry[0] if entry else None


def _acquire(path: Path) -> lmdb.Environment:
    with _OPEN_LOCK:
        entry = _OPEN.get(str(path))
        if entry is None:
            # No fsync per commit: a kill -9 loses nothing LMDB committed; an OS crash may lose the last commits,
            # which only makes the index lag the table (caught up before the next batch reads it).
            entry = _OPEN[str(path)] = [lmdb.open(str(path), subdir=False, map_size=_MAP_SIZE, metasync=False,
                                                  sync=False, readahead=False, max_dbs=0), 0]
        entry[1] += 1
        return entry[0]


def _release(path: Path) -> None:
    with _OPEN_LOCK:
        entry = _OPEN[str(path)]
        entry[1] -= 1
        if entry[1] == 0:
            entry[0].close()
            del _OPEN[str(path)]


def key_hashes(con, relation: str, columns) -> "object":
    """DuckDB's 64-bit hash of ``columns`` (as text: equal keys hash alike whatever their Arrow or Parquet type)
    for each row of ``relation`` -> a NumPy uint64 array."""
    return con.sql(f"SELECT {_hash_sql(columns)} AS h FROM {relation}").to_arrow_table().column("h").to_numpy()


def _hash_sql(columns) -> str:
    return "hash(" + ", ".join(f"CAST({c} AS VARCHAR)" for c in columns) + ")"


def covered(version: int | None, mine: set[int], latest: int) -> int | None:
    """The version an index covers once the versions in ``mine`` (this engine's own commits after ``version``,
    already applied to it, or compactions: the same rows) are counted: ``version`` moved on through them while
    they follow each other, up to ``latest``."""
    if version is None:
        return None
    while version < latest and version + 1 in mine:
        version += 1
    return version


class KeyIndex:
    """One table's keys (hashes of ``columns``) and, with ``heads``, its aggregates' last versions, on disk."""

    def __init__(self, folder: Path, table_path: str, columns: Iterable[str], heads: bool = False,
                 log: Callable[[str], None] = print):
        self.table_path, self.columns, self.with_heads, self.log = str(table_path), tuple(columns), heads, log
        self.path = Path(folder) / f"{hashlib.sha1(self.table_path.encode()).hexdigest()[:16]}.lmdb"
        self._env: lmdb.Environment | None = None
        self._pages = Releaser(self.path)  # the pages a batch touched, handed back (lakehouse.mapped_pages)
        self._mine: set[int] = set()  # versions this engine committed and applied (or compacted), not recorded yet
        self._lock = threading.Lock()  # a compaction on the background thread tells its version

    # -- what it holds in memory -------------------------------------------------------------------------------
    def in_memory(self) -> int:
        """Entries this holds in memory between batches (the versions not recorded yet): a handful, however long
        the table (tests/unit/test_known_tables.py)."""
        with self._lock:
            return len(self._mine)

    # -- the store ---------------------------------------------------------------------------------------------
    def _open(self) -> lmdb.Environment:
        if self._env is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._env = _acquire(self.path)
        return self._env

    def settle(self) -> None:
        """When the engine is idle: hand back the pages its last batch mapped (lakehouse.mapped_pages)."""
        if self._env is not None:
            self._pages.settle()

    def close(self) -> None:
        if self._env is not None:
            self._env = None
            _release(self.path)

    def stored(self) -> dict | None:
        """What the index covers: {"table": path, "id": the Delta table's id, "version": its version}, or None."""
        with self._open().begin() as txn:
            meta = txn.get(_META)
        return json.loads(meta) if meta else None

    def entries(self) -> int:
        """Keys and heads on disk."""
        return self._open().stat()["entries"] - (self.stored() is not None)

    def size_on_disk(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def written(self, version: int) -> None:
        """This engine committed ``version`` and applied it here (``add``), or compacted the table (same rows)."""
        with self._lock:
            self._mine.add(version)

    # -- brought up to the table -------------------------------------------------------------------------------
    def up_to_date(self, con, table) -> None:
        """Bring the index to ``table``'s version (a loaded DeltaTable): nothing to do when every commit since the
        version it covers is this engine's own; else the files added since read (``_catch_up``) or, when that
        cannot be told, the whole table (``_rebuild``). ``con``: a DuckDB connection to read them with."""
        latest, table_id = table.version(), table.metadata().id
        meta = self.stored()
        with self._lock:
            version = covered(meta["version"], self._mine, latest) if meta else None
            self._mine = {v for v in self._mine if version is None or v > version}
        if meta and meta["id"] == table_id and version == latest:
            if version != meta["version"]:
                self.record(version)
            return
        if meta is None or meta["id"] != table_id or version > latest or not self._catch_up(con, table, version):
            self._rebuild(con, table)

    def _rebuild(self, con, table) -> None:
        from python_engine.delta_writes import register_delta

        started = time.perf_counter()
        version = table.version()
        register_delta(con, "index_source", self.table_path, table)
        self.close()  # a new file: a rebuild cut short leaves no meta, so it is rebuilt again
        for stale in (self.path, Path(f"{self.path}-lock")):
            stale.unlink(missing_ok=True)
        self._load(con, "index_source", replace_heads=True)
        self.record(version, table.metadata().id)
        self.log(f"projection: read the keys of {self.table_path} (version {version}) into its index "
                 f"{self.path}: {self.entries()} entries ({time.perf_counter() - started:.2f}s)")

    def _catch_up(self, con, table, version: int) -> bool:
        """The rows of the data files ``table`` holds that it did not hold at ``version``, added: -> False when
        that cannot be told (``version`` gone from the Delta log, a table whose files DuckDB cannot read alone)."""
        from deltalake import DeltaTable

        from python_engine.delta_writes import sql_text

        protocol = table.protocol()
        if protocol.reader_features or protocol.min_reader_version > 1 or table.metadata().partition_columns:
            return False
        started = time.perf_counter()
        try:
            before = set(DeltaTable(self.table_path, version=version).file_uris())
        except Exception:  # noqa: BLE001 -- that version's log expired (or the table was replaced): rebuild
            return False
        added = [f for f in table.file_uris() if f not in before]
        if added:
            con.execute(f"CREATE OR REPLACE TEMP VIEW index_source AS SELECT * FROM read_parquet([{sql_text(added)}],"
                        f" union_by_name = true)")
            self._load(con, "index_source", replace_heads=False)
        self.record(table.version(), table.metadata().id)
        self.log(f"projection: caught up the index of {self.table_path} from version {version} to "
                 f"{table.version()}: {len(added)} file(s) read ({time.perf_counter() - started:.2f}s)")
        return True

    def _load(self, con, relation: str, replace_heads: bool) -> None:
        """Every row of ``relation``'s keys (and heads) put, a chunk at a time (memory bounded by the chunk)."""
        reader = con.sql(f"SELECT {_hash_sql(self.columns)} AS h FROM {relation}").to_arrow_reader(_CHUNK_ROWS)
        for chunk in reader:
            self._put(chunk.column(0).to_numpy(), {})
        if self.with_heads:
            reader = con.sql(f"SELECT aggregate_id, max(aggregate_version) AS v FROM {relation} GROUP BY 1"
                             ).to_arrow_reader(_CHUNK_ROWS)
            for chunk in reader:
                heads = dict(zip(chunk.column(0).to_pylist(), chunk.column(1).to_pylist()))
                self._put([], heads, at_least=not replace_heads)

    def record(self, version: int, table_id: str | None = None) -> None:
        """The index covers the table (of id ``table_id``, else the one recorded) at ``version``."""
        meta = self.stored() or {}
        with self._open().begin(write=True) as txn:
            txn.put(_META, json.dumps({"table": self.table_path, "id": table_id or meta.get("id"),
                                       "version": version}).encode())
            store_write_point()

    # -- a batch's questions and its writes --------------------------------------------------------------------
    def heads(self, aggregate_ids: Iterable[str]) -> dict[str, int]:
        """The last version of each of ``aggregate_ids`` the table holds (an aggregate it does not: absent)."""
        keys = sorted(_HEAD + a.encode() for a in aggregate_ids)
        with self._open().begin() as txn:
            found = txn.cursor().getmulti(keys)
        return {k[1:].decode(): _VERSION.unpack(v)[0] for k, v in found}

    def hits(self, hashes) -> int:
        """How many of ``hashes`` are among the keys (a hit is a maybe: two keys can share a hash; a miss is
        certain)."""
        keys = _hash_keys(hashes)
        if not keys:
            return 0
        with self._open().begin() as txn:
            return len(txn.cursor().getmulti(keys))

    def add(self, version: int | None, hashes, heads: dict[str, int] | None = None) -> None:
        """This engine committed ``version`` to the table, holding ``hashes`` (and moving ``heads`` on): put here
        (after the commit: the index never leads the table)."""
        self._put(hashes, heads or {}, at_least=True)
        if version is None:
            return
        self.written(version)
        meta = self.stored()
        if meta is not None:
            with self._lock:
                moved = covered(meta["version"], self._mine, version)
                self._mine = {v for v in self._mine if v > moved}
            if moved != meta["version"]:
                self.record(moved)

    def _put(self, hashes, heads: dict[str, int], at_least: bool = True) -> None:
        env = self._open()
        keys = _hash_keys(hashes)
        for at in range(0, len(keys), _PUT_CHUNK):
            with env.begin(write=True) as txn:
                txn.cursor().putmulti([(k, b"") for k in keys[at:at + _PUT_CHUNK]])
                store_write_point()  # a crash test's kill -9 inside the write (lakehouse.faults)
        items = sorted((_HEAD + a.encode(), v) for a, v in heads.items())
        for at in range(0, len(items), _PUT_CHUNK):
            with env.begin(write=True) as txn:
                cursor, chunk = txn.cursor(), items[at:at + _PUT_CHUNK]
                if at_least:  # a head never moves back (a file read again holds older versions too)
                    held = {k: _VERSION.unpack(v)[0] for k, v in cursor.getmulti([k for k, _ in chunk])}
                    chunk = [(k, v) for k, v in chunk if v > held.get(k, 0)]
                cursor.putmulti([(k, _VERSION.pack(v)) for k, v in chunk])
                store_write_point()
        self._pages.maybe()


def _hash_keys(hashes) -> list[bytes]:
    """LMDB keys of 64-bit hashes, sorted (LMDB's B+tree takes sorted keys fastest)."""
    import numpy as np

    if not len(hashes):
        return []
    raw = np.unique(np.asarray(hashes).astype(np.uint64)).astype(">u8").tobytes()
    return [_KEY + raw[i:i + 8] for i in range(0, len(raw), 8)]


def index_figures(path: Path | str) -> dict | None:
    """What the index file at ``path`` holds, read without changing it (for ``eventlake status``, beside a running
    engine): the table it indexes, the Delta version it covers, its entries and its size on disk; None when it
    cannot be read."""
    path = Path(path)
    shared = _shared(path)  # open in this process (an engine beside): its environment, not a second one
    try:
        env = shared if shared is not None else lmdb.open(str(path), subdir=False, readonly=True, max_dbs=0,
                                                          map_size=_MAP_SIZE)
    except lmdb.Error:
        return None
    try:
        with env.begin() as txn:
            meta = txn.get(_META)
        entries = env.stat()["entries"] - (meta is not None)
    finally:
        if shared is not None:
            _release(path)
        else:
            env.close()
    meta = json.loads(meta) if meta else {}
    return {"table": meta.get("table"), "version": meta.get("version"), "entries": entries,
            "size_on_disk": path.stat().st_size}


def status_lines(checkpoints: Path | str) -> list[str]:
    """One line per table index of the Python engine under each projection checkpoint in ``checkpoints``: the
    table, the version covered, entries and size on disk (issue 42: what the engine keeps is on disk)."""
    lines = []
    for folder in sorted(Path(checkpoints).glob(f"projection-*/{INDEX_FOLDER}")):
        for path in sorted(folder.glob("*.lmdb")):
            figures = index_figures(path)
            if figures is None:
                continue
            covers = "covers nothing yet" if figures["version"] is None else f"covers version {figures['version']}"
            table = figures["table"] or "a table (none recorded yet)"
            lines.append(f"python engine index of {table}: {figures['size_on_disk'] / 2**20:,.1f} MiB on "
                         f"disk, {figures['entries']:,} keys and heads, {covers} ({path})")
    return lines
