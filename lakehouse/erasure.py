"""A data subject's values erased from a Delta table and from its history (issue 45, slice 4; docs/forgetting.md).

``erase(where, predicate, columns, reason)``, on a table in a local folder or under a storage URI (its files
listed, read and deleted through ``lakehouse.storage.file_system``: delta-rs' object store for a URI):

1. **Null.** The rows ``predicate`` selects that still hold a value in one of ``columns`` get those columns set to
   null: one UPDATE commit (delta-rs), whose commit info records the reason (``eventlake.erasure``). Rows, keys and
   every other column stay.
2. **Purge the history.** Every data file under the table that the current version no longer references (the
   files the UPDATE replaced, and the older ones Delta keeps for time travel until a VACUUM) and that holds a
   selected row with a value in ``columns`` is deleted. Time travel to a version that needs such a file then
   fails saying a file is missing: the version was purged, and no reader gets the values back. A file written in
   the last ``grace_s`` seconds is left alone (it may be a concurrent writer's file, not committed yet) and counted
   as deferred: run it again later.

3. **Purge the log.** A Delta commit keeps statistics of the files it adds (each column's minimum and maximum, a
   string cut to its first characters), so an old commit file may still quote a value. The values the run nulls
   (read from the current rows and from the old files still holding them, before either changes) are looked for
   in the table's commit files; when one holds any, a checkpoint of the current version is written and every
   commit file before it that holds one is deleted, with every older checkpoint (compressed: not searchable, and
   superseded by the new one). Readers start from the checkpoint; time travel to a purged version fails. Commits
   of the last ``grace_s`` seconds are left (a live writer may still read them), counted as deferred.

A second run finds nothing to null and nothing to purge (a run killed at any point is run again). ``dry_run``
counts what a run would do and changes nothing. The predicate is SQL that both DuckDB (counting) and delta-rs
(the UPDATE) read: comparisons, ``IN`` lists, ``AND``/``OR``, quoted strings.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from lakehouse.errors import BadInput
from lakehouse.faults import fault_point
from lakehouse.storage import StorageError, delta_table, file_system, is_remote, location
from lakehouse.tables import TableNotFound

__all__ = ["Erasure", "ErasureError", "erase", "REASON_KEY", "DEFAULT_GRACE_S", "values_held",
           "QuotingFiles", "purge_quoting"]

REASON_KEY = "eventlake.erasure"  # in the UPDATE commit's commitInfo: why the values were erased
DEFAULT_GRACE_S = 900.0
UPDATE_ATTEMPTS = 5  # the UPDATE's commit, when another writer keeps committing to the table first


class ErasureError(BadInput, ValueError):
    """An erasure that cannot run as asked (no columns, no reason)."""


class _Files:
    """A table's files, in a local folder or under a storage URI: listed with their times, read, deleted."""

    def __init__(self, where, table):
        self.fs, self.base = file_system(where)
        self.root = table.table_uri.rstrip("/")

    def of(self, uri: str) -> str:
        """The path in ``fs`` of a data file as ``DeltaTable.file_uris()`` names it."""
        if uri.startswith(self.root + "/"):
            return f"{self.base}/{uri[len(self.root) + 1:]}"
        return uri.removeprefix("file://")

    def listed(self, under: str = "") -> list[tuple[str, float]]:
        """(path, modified time in seconds) of every file under ``under`` (the table's folder by default)."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(f"{self.base}/{under}".rstrip("/"), recursive=True, allow_not_found=True)
        return sorted((info.path, info.mtime.timestamp() if info.mtime is not None else time.time())
                      for info in self.fs.get_file_info(selector) if info.type == pafs.FileType.File)

    def read(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as f:
            return f.read()

    def delete(self, path: str) -> None:
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            pass

    def parquet(self, path: str):
        """The data file at ``path`` as a lazy dataset (DuckDB reads only what a query needs)."""
        import pyarrow.dataset as ds

        return ds.dataset(path, filesystem=self.fs, format="parquet")


def _open(where):
    """``(DeltaTable, where as a location)`` of the table at ``where`` (a path, a URI or a location)."""
    from deltalake.exceptions import TableNotFoundError

    where = location(str(where)) if isinstance(where, str) and is_remote(where) else where
    try:
        return delta_table(where), where
    except TableNotFoundError:
        raise TableNotFound(f"table {where}: no Delta table there") from None
    except OSError as e:  # the store does not answer, or refuses (credentials)
        raise StorageError(f"table {where}: its store cannot be reached: {e}") from None


@dataclass(frozen=True)
class Erasure:
    """What ``erase`` found and did on one table."""
    table: str
    rows_holding: int  # selected rows with a value in the columns, in the current version, before
    rows_nulled: int
    version: int | None  # the UPDATE's commit (None: nothing to null, or a dry run)
    files_holding: int  # unreferenced data files that held selected values
    files_purged: int
    files_deferred: int  # too recent to delete safely: run again after the grace period
    dry_run: bool = False
    log_holding: int = 0  # commit files (before the run's checkpoint) that quoted a value, and older checkpoints
    log_purged: int = 0
    log_deferred: int = 0

    @property
    def complete(self) -> bool:
        """Nothing of the subject's values left in the table or its history (a dry run is never complete)."""
        return (not self.dry_run and not self.files_deferred and not self.log_deferred
                and self.rows_nulled == self.rows_holding)

    def line(self) -> str:
        verb = "would null" if self.dry_run else "nulled"
        purge = "would delete" if self.dry_run else "deleted"
        deferred = (f", {self.files_deferred} written in the grace period left for the next run"
                    if self.files_deferred else "")
        at = f" (Delta version {self.version})" if self.version is not None else ""
        log = ""
        if self.log_holding:
            log_deferred = f", {self.log_deferred} of the grace period left" if self.log_deferred else ""
            log = (f"; log: {self.log_holding} commit file(s) quoted values, {purge} "
                   f"{self.log_holding - self.log_deferred if self.dry_run else self.log_purged}{log_deferred}")
        return (f"{self.table}: {self.rows_holding} row(s) held values; {verb} "
                f"{self.rows_holding if self.dry_run else self.rows_nulled}{at}; history: "
                f"{self.files_holding} old file(s) held values, {purge} "
                f"{self.files_holding - self.files_deferred if self.dry_run else self.files_purged}{deferred}{log}")


def erase(where, predicate: str, columns: Sequence[str], reason: str, *, dry_run: bool = False,
          grace_s: float = DEFAULT_GRACE_S, now: float | None = None) -> Erasure:
    """Null ``columns`` in the rows ``predicate`` selects, then purge them from the table's history (module
    docstring). ``where``: a local folder, a URI or a location."""
    import duckdb
    from deltalake import CommitProperties
    from deltalake.exceptions import CommitFailedError

    name = str(where)
    if not columns:
        raise ErasureError(f"table {name}: no columns to erase")
    if not reason.strip():
        raise ErasureError(f"table {name}: an erasure needs a reason (it is recorded in the table's history)")
    started = time.time() if now is None else now
    table, where = _open(where)
    files = _Files(where, table)
    present = [c for c in columns if c in table.schema().to_arrow().names]
    if not present:
        raise ErasureError(f"table {name}: has none of the columns {', '.join(columns)}")
    holding = _holding(predicate, present)
    con = duckdb.connect()
    try:
        current_files = [files.of(uri) for uri in table.file_uris()]
        rows_holding = sum(_count(con, files, path, predicate, present) for path in current_files)
        values = set().union(*(_values(con, files, path, predicate, present) for path in current_files))
        nulled, version = 0, None
        for attempt in range(1, UPDATE_ATTEMPTS + 1):
            if not rows_holding or dry_run:
                break
            try:
                metrics = table.update(updates={c: "NULL" for c in present}, predicate=holding,
                                       commit_properties=CommitProperties(custom_metadata={REASON_KEY: reason}))
            except CommitFailedError:  # another writer (the projection) committed first: count again and retry
                if attempt == UPDATE_ATTEMPTS:
                    raise
                table.update_incremental()
                current_files = [files.of(uri) for uri in table.file_uris()]
                rows_holding = sum(_count(con, files, path, predicate, present) for path in current_files)
                values |= set().union(*(_values(con, files, path, predicate, present) for path in current_files))
                continue
            nulled = int(metrics.get("num_updated_rows", rows_holding))
            version = table.version()
            fault_point("after-update")
            break
        current = {files.of(uri) for uri in table.file_uris()}
        old_holding = []
        for path, modified in files.listed():
            if not path.endswith(".parquet") or "/_delta_log/" in path or path in current:
                continue
            if _count(con, files, path, predicate, present):
                old_holding.append((path, modified))
                values |= _values(con, files, path, predicate, present)
        # The log before the data files: a run killed in between finds the values again in the files left.
        log_holding, log_purged, log_deferred = _purge_log(table, files, values, started, grace_s, dry_run)
        purged, deferred = _delete_past_grace(files, old_holding, started, grace_s, dry_run)
    finally:
        con.close()
    return Erasure(name, rows_holding, nulled, version, len(old_holding), purged, deferred, dry_run,
                   log_holding, log_purged, log_deferred)


_NEEDLE_BYTES = 16  # how much of a value's start is looked for in the log
_STATS_PREFIX = 32  # Delta statistics keep a string's first characters (Spark: 32)
_UNESCAPED = re.compile(r'[^"\\\x00-\x1f]{4,}')  # a run of characters no JSON escaping changes


def _needles(values: set[str]) -> set[bytes]:
    """What a commit file quoting one of ``values`` holds: each value's start as it is, as JSON writes it and as
    JSON inside JSON (a commit's statistics are a JSON string), and each run of at least 4 characters of its first
    ``_STATS_PREFIX`` that no escaping changes. A needle that also matches other values only costs history."""
    import json

    out = set()
    for value in values:
        if not value:
            continue
        text = value
        for _ in range(3):
            out.add(text.encode()[:_NEEDLE_BYTES])
            text = json.dumps(text, ensure_ascii=False)[1:-1]
        out |= {run.encode()[:_NEEDLE_BYTES] for run in _UNESCAPED.findall(value[:_STATS_PREFIX])}
    return out


def _purge_log(table, files: _Files, values: set[str], started: float, grace_s: float,
               dry_run: bool) -> tuple[int, int, int]:
    """Step 3 of the module docstring -> (commit files and old checkpoints holding, deleted, deferred)."""
    needles = _needles(values)
    if not needles:
        return 0, 0, 0
    version = table.version()
    log = [(path, modified, path.rsplit("/", 1)[-1]) for path, modified in files.listed("_delta_log")]
    commits = [(path, modified) for path, modified, name in log if name.endswith(".json")
               and name.split(".")[0].isdigit() and int(name.split(".")[0]) < version
               and _quotes(files.read(path), needles)]
    if not commits:
        return 0, 0, 0
    if not dry_run:
        table.create_checkpoint()
        fault_point("after-checkpoint")
    checkpoints = [(path, modified) for path, modified, name in log
                   if ".checkpoint" in name and name.endswith(".parquet") and int(name.split(".")[0]) < version]
    holding = commits + checkpoints
    return (len(holding), *_delete_past_grace(files, holding, started, grace_s, dry_run))


def values_held(where, predicate: str, columns: Sequence[str]) -> set[str]:
    """The text values in ``columns`` of the rows ``predicate`` selects in the current version of the table at
    ``where`` (a local folder or a URI; none when it has no such column): what ``erase`` would null, sought by
    ``purge_quoting`` in the files outside the table that may quote them."""
    import duckdb

    try:
        table, where = _open(where)
    except TableNotFound:
        return set()
    present = [c for c in columns if c in table.schema().to_arrow().names]
    if not present:
        return set()
    files = _Files(where, table)
    with duckdb.connect() as con:
        return set().union(*(_values(con, files, files.of(uri), predicate, present) for uri in table.file_uris()))


@dataclass(frozen=True)
class QuotingFiles:
    """What ``purge_quoting`` found under one folder: files quoting an erased value, deleted."""
    folder: str
    holding: int
    deleted: int
    dry_run: bool = False

    def line(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        done = self.holding if self.dry_run else self.deleted
        return f"{self.folder}: {self.holding} file(s) quoted the subject's values; {verb} {done}"


def purge_quoting(folder: Path, values: set[str], dry_run: bool = False) -> QuotingFiles:
    """Delete every file under ``folder`` (reports a later run writes again: Data Docs pages, validation results)
    that quotes one of ``values``: as it is, as JSON or JSON in JSON writes it, as HTML escapes it, or a run of its
    first characters that no escaping changes (``_needles``; a page quoting a value shared with others goes too,
    which only costs a page the next run rebuilds)."""
    import html

    needles = _needles(values) | {html.escape(v, quote=True).encode()[:_NEEDLE_BYTES] for v in values if v}
    holding = deleted = 0
    if needles and folder.is_dir():
        for path in sorted(folder.rglob("*")):
            try:
                if not path.is_file() or path.is_symlink() or not _quotes(path.read_bytes(), needles):
                    continue
            except OSError:  # deleted meanwhile (a check run prunes its old results)
                continue
            holding += 1
            if not dry_run:
                path.unlink(missing_ok=True)
                deleted += 1
    return QuotingFiles(str(folder), holding, deleted, dry_run)


def _quotes(data: bytes, needles: set[bytes]) -> bool:
    return any(needle in data for needle in needles)


def _delete_past_grace(files: _Files, paths: list[tuple[str, float]], started: float, grace_s: float,
                       dry_run: bool) -> tuple[int, int]:
    """Delete each of ``paths`` (with their modified times) written before the grace period (a dry run: none) ->
    (deleted, left as too recent)."""
    purged = deferred = 0
    for path, modified in paths:
        if modified > started - grace_s:
            deferred += 1
        elif not dry_run:
            files.delete(path)
            purged += 1
            fault_point("after-first-delete")
    return purged, deferred


def _columns_of(files: _Files, path: str):
    import pyarrow.parquet as pq

    return pq.read_schema(path, filesystem=files.fs)


def _values(con, files: _Files, path: str, predicate: str, columns: Sequence[str]) -> set[str]:
    """The text values in ``columns`` of the rows of the data file at ``path`` that ``predicate`` selects."""
    import duckdb

    schema = _columns_of(files, path)
    names = set(schema.names)
    mine = [c for c in columns if c in names]
    text = [c for c in mine if str(schema.field(c).type) in ("string", "large_string", "string_view")]
    out: set[str] = set()
    if not text:
        return out
    con.register("erasure_file", files.parquet(path))
    try:
        for column in text:
            try:
                rows = con.execute(f'SELECT DISTINCT "{column}" FROM erasure_file WHERE ({predicate}) AND '
                                   f'"{column}" IS NOT NULL').fetchall()
            except duckdb.BinderException:
                continue
            out |= {r[0] for r in rows}
    finally:
        con.unregister("erasure_file")
    return out


def _holding(predicate: str, columns: Sequence[str]) -> str:
    values = " OR ".join(f'"{c}" IS NOT NULL' for c in columns)
    return f"({predicate}) AND ({values})"


def _count(con, files: _Files, path: str, predicate: str, columns: Sequence[str]) -> int:
    """How many rows of the data file at ``path`` ``predicate`` selects with a value in ``columns`` (only the
    columns the file has: an older file may lack a column added since). A file's own columns only: the read models'
    tables are not partitioned."""
    import duckdb

    names = set(_columns_of(files, path).names)
    mine = [c for c in columns if c in names]
    if not mine:
        return 0
    con.register("erasure_file", files.parquet(path))
    try:
        return con.execute(f"SELECT count(*) FROM erasure_file WHERE {_holding(predicate, mine)}").fetchall()[0][0]
    except duckdb.BinderException:  # the predicate names a column this old file lacks: it cannot select a row
        return 0
    finally:
        con.unregister("erasure_file")
