"""The embedded (DuckDB) read path reaches no file by path: ``eventlake.read_only.lock_duckdb`` switches DuckDB's
file access off and locks its configuration, so a SELECT that reads a file (``read_parquet('/path')``,
``read_csv``, a glob, a bare file name, ``glob()``, ``read_text``) is refused though it is a SELECT, and so are
``COPY ... TO`` and ``ATTACH`` even past the statement check. Checked three ways: on a connection locked by
``lock_duckdb`` alone, through ``query_duckdb`` and through ``eventlake query``; each statement first reads the
file on an unlocked connection, so a refusal here is the lock's doing and not a typo's. No Kafka, no Spark."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

import read_models
from eventlake.query import QueryError, query_duckdb
from eventlake.read_only import lock_duckdb
from lakehouse.settings import Settings
from spark_apps.arrow_rows import arrow_schema

EVENTLAKE = str(Path(sys.executable).parent / "eventlake")
ROOT = str(Path(__file__).resolve().parents[2])
SECRET = "s3cr3t-outside-the-catalog"

# SELECTs that read files by path: only the lock stops them (DuckDB's parser calls each a SELECT).
READS = [
    "SELECT * FROM read_parquet('{dir}/secret.parquet')",
    "SELECT * FROM read_parquet('{dir}/**/*.parquet')",
    "SELECT * FROM read_parquet(['{dir}/secret.parquet', '{dir}/nested/more.parquet'])",
    "SELECT * FROM '{dir}/secret.parquet'",
    "SELECT * FROM read_csv('{dir}/secret.csv')",
    "SELECT * FROM read_csv_auto('{dir}/*.csv')",
    "SELECT * FROM '{dir}/secret.csv'",
    "SELECT * FROM read_json_auto('{dir}/secret.json')",
    "SELECT * FROM read_text('{dir}/secret.csv')",
    "SELECT * FROM glob('{dir}/*')",
    "SELECT * FROM parquet_metadata('{dir}/secret.parquet')",
    "SELECT count(*) FROM payments WHERE payment_id NOT IN (SELECT v FROM read_csv('{dir}/secret.csv'))",
]
# Statements that write or open files: the statement check refuses them first; the lock refuses them too.
WRITES = [
    "COPY (SELECT 1 AS x) TO '{dir}/copied.csv'",
    "COPY (SELECT 1 AS x) TO '{dir}/copied.parquet' (FORMAT parquet)",
    "ATTACH '{dir}/attached.db'",
    "SET enable_external_access = true",
]


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A warehouse with one (empty) table, and files outside it that SQL must not reach."""
    home = tmp_path_factory.mktemp("read-only-files")
    settings = Settings(home=home)
    model = read_models.get("payments")
    write_deltalake(str(settings.table_path(model.name)), pa.Table.from_pylist([], arrow_schema(model.schema())))
    outside = tmp_path_factory.mktemp("outside")
    (outside / "nested").mkdir()
    table = pa.table({"v": [SECRET]})
    pq.write_table(table, outside / "secret.parquet")
    pq.write_table(table, outside / "nested" / "more.parquet")
    (outside / "secret.csv").write_text(f"v\n{SECRET}\n")
    (outside / "secret.json").write_text(f'{{"v": "{SECRET}"}}\n')
    return settings, outside


def _files(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.rglob("*"))


def _bare(sql: str, outside: Path, scratch: Path) -> str:
    """``sql`` for a connection of its own (no tables): reads from ``outside``, writes into ``scratch``."""
    return sql.replace("FROM payments", "FROM (SELECT 'x' AS payment_id)").format(
        dir=outside if sql in READS else scratch)


@pytest.mark.parametrize("sql", READS + WRITES[:-1])
def test_the_statement_reaches_the_file_without_the_lock(place, sql, tmp_path):
    """The control: unlocked, each statement does reach the files (so the refusals below are the lock's)."""
    _, outside = place
    con = duckdb.connect()
    try:
        rows = con.execute(_bare(sql, outside, tmp_path)).fetchall()
    finally:
        con.close()
    if sql in READS:
        assert SECRET in repr(rows) or str(outside) in repr(rows) or rows == [(1,)], (sql, rows)
    elif not sql.startswith("SET"):
        assert os.listdir(tmp_path), sql  # the file was written


@pytest.mark.parametrize("sql", READS + WRITES)
def test_a_locked_connection_refuses_it(place, sql, tmp_path):
    _, outside = place
    con = duckdb.connect()
    try:
        lock_duckdb(con)
        with pytest.raises(duckdb.Error) as refused:
            con.execute(_bare(sql, outside, tmp_path)).fetchall()
    finally:
        con.close()
    message = str(refused.value)
    assert "disabled" in message or "locked" in message or "external access" in message.lower(), message
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("sql", READS + WRITES)
def test_query_duckdb_refuses_it_and_writes_nothing(place, sql):
    settings, outside = place
    before = _files(outside), _files(settings.home)
    with pytest.raises(QueryError) as refused:
        query_duckdb(settings, sql.format(dir=outside))
    message = str(refused.value)
    assert SECRET not in message
    assert message.startswith(("read-only: ", "DuckDB could not run the query: ")), message
    if message.startswith("DuckDB"):  # a SELECT: refused by the lock, which DuckDB says
        assert "disabled" in message or "external access" in message.lower(), message
    assert (_files(outside), _files(settings.home)) == before


def test_eventlake_query_refuses_a_file_read_and_a_copy(place):
    settings, outside = place
    env = {**os.environ, "EVENTLAKE_HOME": str(settings.home), "PYTHONPATH": ROOT}
    env.pop("EVENTLAKE_CONFIG", None)
    sql = (f"SELECT * FROM read_csv('{outside}/*.csv') UNION ALL SELECT * FROM read_parquet('{outside}/secret.parquet')"
           f"; COPY (SELECT 1) TO '{outside}/copied.csv'")
    for statement in sql.split("; "):
        result = subprocess.run([EVENTLAKE, "query", statement], env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stdout == "" and "Traceback" not in result.stderr and SECRET not in result.stderr
        assert result.stderr.startswith("eventlake query: "), result.stderr
    assert not (outside / "copied.csv").exists()
