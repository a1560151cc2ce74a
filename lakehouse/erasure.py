"""A data subject's values erased from a Delta table and from its history (issue 45, slice 4; docs/forgetting.md).

``erase(where, predicate, columns, reason)``, on a table at a local path:

1. **Null.** The rows ``predicate`` selects that still hold a value in one of ``columns`` get those columns set to
   null: one UPDATE commit (delta-rs), whose commit info records the reason (``eventlake.erasure``). Rows, keys and
   every other column stay.
2. **Purge the history.** Every data file under the table that the current version no longer references (the
   files the UPDATE replaced, and the older ones Delta keeps for time travel until a VACUUM) and that holds a
   selected row with a value in ``columns`` is deleted. Time travel to a version that needs such a file then
   fails saying a file is missing: the version was purged, and no reader gets the values back. A file written in
   the last ``grace_s`` seconds is left alone (it may be a concurrent writer's file, not committed yet) and counted
   as deferred: run it again later.

A second run finds nothing to null and nothing to purge (a run killed at any point is run again). ``dry_run``
counts what a run would do and changes nothing. The predicate is SQL that both DuckDB (counting) and delta-rs
(the UPDATE) read: comparisons, ``IN`` lists, ``AND``/``OR``, quoted strings.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from lakehouse.errors import BadInput
from lakehouse.tables import TableNotFound

__all__ = ["Erasure", "ErasureError", "erase", "REASON_KEY", "DEFAULT_GRACE_S"]

REASON_KEY = "eventlake.erasure"  # in the UPDATE commit's commitInfo: why the values were erased
DEFAULT_GRACE_S = 900.0
UPDATE_ATTEMPTS = 5  # the UPDATE's commit, when another writer keeps committing to the table first


class ErasureError(BadInput, ValueError):
    """An erasure that cannot run as asked (a remote table, no columns, no reason)."""


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

    @property
    def complete(self) -> bool:
        """Nothing of the subject's values left in the table or its history (a dry run is never complete)."""
        return not self.dry_run and not self.files_deferred and self.rows_nulled == self.rows_holding

    def line(self) -> str:
        verb = "would null" if self.dry_run else "nulled"
        purge = "would delete" if self.dry_run else "deleted"
        deferred = (f", {self.files_deferred} written in the grace period left for the next run"
                    if self.files_deferred else "")
        at = f" (Delta version {self.version})" if self.version is not None else ""
        return (f"{self.table}: {self.rows_holding} row(s) held values; {verb} "
                f"{self.rows_holding if self.dry_run else self.rows_nulled}{at}; history: "
                f"{self.files_holding} old file(s) held values, {purge} "
                f"{self.files_holding - self.files_deferred if self.dry_run else self.files_purged}{deferred}")


def erase(where, predicate: str, columns: Sequence[str], reason: str, *, dry_run: bool = False,
          grace_s: float = DEFAULT_GRACE_S, now: float | None = None) -> Erasure:
    """Null ``columns`` in the rows ``predicate`` selects, then purge them from the table's history (module
    docstring). ``where``: the table's local folder."""
    import duckdb
    from deltalake import CommitProperties, DeltaTable
    from deltalake.exceptions import CommitFailedError, TableNotFoundError

    folder = Path(str(where))
    if "://" in str(where):
        raise ErasureError(f"table {where}: erasing from a table under a storage URI is not supported yet; only "
                           f"tables in local folders")
    if not columns:
        raise ErasureError(f"table {folder}: no columns to erase")
    if not reason.strip():
        raise ErasureError(f"table {folder}: an erasure needs a reason (it is recorded in the table's history)")
    started = time.time() if now is None else now
    try:
        table = DeltaTable(str(folder))
    except TableNotFoundError:
        raise TableNotFound(f"table {folder}: no Delta table there") from None
    present = [c for c in columns if c in table.schema().to_arrow().names]
    if not present:
        raise ErasureError(f"table {folder}: has none of the columns {', '.join(columns)}")
    holding = _holding(predicate, present)
    con = duckdb.connect()
    try:
        rows_holding = sum(_count(con, Path(uri.removeprefix("file://")), predicate, present)
                           for uri in table.file_uris())
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
                rows_holding = sum(_count(con, Path(uri.removeprefix("file://")), predicate, present)
                                   for uri in table.file_uris())
                continue
            nulled = int(metrics.get("num_updated_rows", rows_holding))
            version = table.version()
            break
        current = {Path(uri.removeprefix("file://")).resolve() for uri in table.file_uris()}
        files_holding = purged = deferred = 0
        for path in sorted(folder.rglob("*.parquet")):
            if "_delta_log" in path.parts or path.resolve() in current:
                continue
            if not _count(con, path, predicate, present):
                continue
            files_holding += 1
            if path.stat().st_mtime > started - grace_s:
                deferred += 1
            elif not dry_run:
                path.unlink(missing_ok=True)
                purged += 1
    finally:
        con.close()
    return Erasure(str(folder), rows_holding, nulled, version, files_holding, purged, deferred, dry_run)


def _holding(predicate: str, columns: Sequence[str]) -> str:
    values = " OR ".join(f'"{c}" IS NOT NULL' for c in columns)
    return f"({predicate}) AND ({values})"


def _count(con, path: Path, predicate: str, columns: Sequence[str]) -> int:
    """How many rows of the data file at ``path`` ``predicate`` selects with a value in ``columns`` (only the
    columns the file has: an older file may lack a column added since). A file's own columns only: the read models'
    tables are not partitioned."""
    import duckdb
    import pyarrow.parquet as pq

    names = set(pq.read_schema(path).names)
    mine = [c for c in columns if c in names]
    if not mine:
        return 0
    try:
        return con.execute(f"SELECT count(*) FROM read_parquet(?) WHERE {_holding(predicate, mine)}",
                           [str(path)]).fetchone()[0]
    except duckdb.BinderException:  # the predicate names a column this old file lacks: it cannot select a row
        return 0
