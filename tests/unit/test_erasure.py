"""A subject's values erased from a Delta table and its history (lakehouse.erasure), on real delta-rs tables: the
current rows nulled with the reason in the commit, every old file that held them deleted (time travel to before
says a file is missing), other rows and columns untouched, a second run a no-op, a dry run changing nothing."""
import os
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from lakehouse.erasure import REASON_KEY, ErasureError, erase
from lakehouse.storage import location
from lakehouse.tables import TableNotFound

ADA = "account_id IN ('acc-ada-1', 'acc-ada-2')"


def _rows(*rows):
    return pa.Table.from_pylist([dict(zip(("account_id", "customer_name", "balance"), r)) for r in rows],
                                schema=pa.schema([("account_id", pa.string()), ("customer_name", pa.string()),
                                                  ("balance", pa.int64())]))


def _table(tmp_path):
    path = tmp_path / "account_summary"
    write_deltalake(str(path), _rows(("acc-ada-1", "Ada Lovelace", 10), ("acc-grace", "Grace Hopper", 20)))
    write_deltalake(str(path), _rows(("acc-ada-2", "Ada Lovelace", 5)), mode="append")
    # A MERGE-like rewrite: version 2 replaces version 0's file (the old one stays for time travel).
    DeltaTable(str(path)).update(updates={"balance": "balance + 1"}, predicate="account_id = 'acc-grace'")
    old = time.time() - 3600
    for f in path.rglob("*"):  # data files and commits: older than the grace period
        if f.is_file():
            os.utime(f, (old, old))
    return path


def _current(path, version=None):
    return sorted(tuple(r.values()) for r in DeltaTable(str(path), version=version).to_pyarrow_table().to_pylist())


@pytest.mark.parametrize("under", ["folder", "uri"])
def test_the_rows_are_nulled_and_every_old_file_holding_them_is_deleted(tmp_path, under):
    """In a local folder, and under a storage URI (a file: one, through delta-rs' object store as any other store:
    before it was handled, such a table's old files were silently left)."""
    path = _table(tmp_path)
    files = len(list(path.rglob("*.parquet")))
    where = path if under == "folder" else location(f"file://{path}")
    done = erase(where, ADA, ["customer_name"], "GDPR art. 17 request #12")
    assert (done.rows_holding, done.rows_nulled, done.version, done.complete) == (2, 2, 3, True)
    assert _current(path) == [("acc-ada-1", None, 10), ("acc-ada-2", None, 5), ("acc-grace", "Grace Hopper", 21)]
    history = DeltaTable(str(path)).history(1)[0]
    assert history["operation"] == "UPDATE" and history[REASON_KEY] == "GDPR art. 17 request #12"
    assert done.files_purged == done.files_holding >= 2 and len(list(path.rglob("*.parquet"))) < files + 2
    # No byte of Ada's name is left in any data file; Grace's still is.
    data = b"".join(f.read_bytes() for f in path.rglob("*.parquet"))
    assert b"Ada Lovelace" not in data and b"Grace Hopper" in data
    # Nor in the log: the commits whose statistics quoted it are gone behind a checkpoint of the erasure's version.
    logged = b"".join(f.read_bytes() for f in (path / "_delta_log").iterdir() if f.is_file())
    assert done.log_purged == done.log_holding >= 1 and b"Ada Lovelace" not in logged
    assert _current(path) == [("acc-ada-1", None, 10), ("acc-ada-2", None, 5), ("acc-grace", "Grace Hopper", 21)]
    # Time travel before the erasure fails: its commits are gone (or, kept, the files they name).
    with pytest.raises(Exception, match="(?i)not found|no such file|no files in log segment"):
        DeltaTable(str(path), version=1).to_pyarrow_table()
    again = erase(where, ADA, ["customer_name"], "GDPR art. 17 request #12")
    assert (again.rows_holding, again.rows_nulled, again.version, again.files_holding) == (0, 0, None, 0)


def test_a_dry_run_changes_nothing_and_recent_files_wait_for_the_next_run(tmp_path):
    path = _table(tmp_path)
    before = _current(path)
    dry = erase(path, ADA, ["customer_name"], "request #13", dry_run=True)
    assert (dry.rows_holding, dry.rows_nulled, dry.version, dry.complete) == (2, 0, None, False)
    assert dry.files_holding >= 1 and dry.files_purged == 0 and _current(path) == before
    assert "would null 2" in dry.line()
    # A file written within the grace period may be a concurrent writer's: it is left, and said.
    recent = max(path.rglob("*.parquet"), key=lambda f: f.stat().st_mtime)
    os.utime(recent, None)
    done = erase(path, ADA, ["customer_name"], "request #13")
    assert done.rows_nulled == 2
    assert done.files_deferred >= 1 and not done.complete and "left for the next run" in done.line()
    later = erase(path, ADA, ["customer_name"], "request #13", now=time.time() + 3600)
    assert later.complete and later.files_purged == done.files_deferred


def test_what_cannot_run_is_refused_naming_the_table(tmp_path):
    path = _table(tmp_path)
    with pytest.raises(ErasureError, match="needs a reason"):
        erase(path, ADA, ["customer_name"], " ")
    with pytest.raises(ErasureError, match="has none of the columns"):
        erase(path, ADA, ["email"], "r")
    with pytest.raises(TableNotFound, match="no Delta table there"):
        erase(tmp_path / "nothing", ADA, ["customer_name"], "r")


def test_a_writer_committing_first_makes_the_update_count_again_and_retry(tmp_path, monkeypatch):
    # The projection MERGEs into the table while forget runs: its commit lands between forget's read and its
    # UPDATE's commit (here: once, from another DeltaTable of the same table); forget counts again and commits.
    path = _table(tmp_path)
    real_update = DeltaTable.update
    raced = []

    def update(self, *args, **kwargs):
        if not raced:
            raced.append(True)
            write_deltalake(str(path), _rows(("acc-ada-2", "Ada Lovelace", 6)), mode="append")  # a new row of hers
        return real_update(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "update", update)
    done = erase(path, ADA, ["customer_name"], "request #14", now=time.time() + 3600)
    assert raced and (done.rows_holding, done.rows_nulled) == (3, 3)
    assert [r for r in _current(path) if r[0].startswith("acc-ada")] == [
        ("acc-ada-1", None, 10), ("acc-ada-2", None, 5), ("acc-ada-2", None, 6)]
