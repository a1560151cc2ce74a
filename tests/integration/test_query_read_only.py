"""Both read paths of `eventlake query` only read: every statement that would change a table, or reach a table
folder by path, is refused with a message saying so (exit code 2), and afterwards every table is as it was:
the same Delta version, the same rows, no file added or removed under the warehouse."""
import hashlib

import pytest

from eventlake.generator import GeneratorConfig
from eventlake.query import QueryError, query_duckdb, query_spark
from lakehouse.settings import Settings
from tests.domain_helpers import events_for
from tests.integration.test_checks import write_folded
from tests.integration.test_query_errors import TABLES, assert_one_message, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Settings:
    settings = Settings(home=tmp_path_factory.mktemp("read-only-home"))
    write_folded(settings, events_for(GeneratorConfig(accounts=5, commands=60, seed=8, run_id="ro")))
    return settings


def state(settings: Settings) -> dict:
    """Every file under the warehouse with a digest of its bytes, and the rows of each table as the engine reads."""
    files = {str(p.relative_to(settings.warehouse)): hashlib.sha1(p.read_bytes()).hexdigest()
             for p in sorted(settings.warehouse.rglob("*")) if p.is_file()}
    rows = {name: sorted(map(repr, query_duckdb(settings, f"SELECT * FROM {name}")[1]))
            for name in ("account_summary", "payments", "merchant_minute_volume", "fraud_alerts")}
    return {"files": files, "rows": rows}


def payments_path(settings: Settings) -> str:
    return str(settings.table_path("payments"))


# Statements each engine must refuse, with what its message must name.
DUCKDB_REFUSED = [
    ("INSERT INTO payments SELECT * FROM payments", "INSERT is refused"),
    ("UPDATE account_summary SET balance_minor = 0", "UPDATE is refused"),
    ("DELETE FROM payments", "DELETE is refused"),
    ("DROP VIEW payments", "DROP is refused"),
    ("CREATE TABLE copy AS SELECT * FROM payments", "CREATE is refused"),
    ("ALTER VIEW payments RENAME TO p2", "ALTER is refused"),
    ("SELECT 1; DELETE FROM payments", "DELETE is refused"),
    ("COPY payments TO '{path}/part-00000-extra.parquet' (FORMAT parquet)", "COPY is refused"),
    ("ATTACH '{path}/other.db'", "ATTACH is refused"),
    ("SET enable_external_access = true", "SET is refused"),
]
SPARK_REFUSED = [
    ("INSERT INTO payments SELECT * FROM payments", "INSERT is refused"),
    ("UPDATE account_summary SET balance_minor = 0", "UPDATE is refused"),
    ("DELETE FROM payments", "DELETE is refused"),
    ("MERGE INTO payments t USING payments s ON t.payment_id = s.payment_id WHEN MATCHED THEN DELETE",
     "MERGE is refused"),
    ("DROP TABLE payments", "DROP TABLE is refused"),
    ("CREATE TABLE copy USING delta AS SELECT * FROM payments", "CREATE TABLE is refused"),
    ("ALTER TABLE payments ADD COLUMNS (x INT)", "ALTER TABLE is refused"),
    ("TRUNCATE TABLE payments", "TRUNCATE is refused"),
    ("DELETE FROM delta.`{path}`", "DELETE is refused"),
    ("INSERT INTO delta.`{path}` SELECT * FROM payments", "INSERT is refused"),
    ("OPTIMIZE delta.`{path}`", "OPTIMIZE is refused"),
    ("VACUUM delta.`{path}` RETAIN 0 HOURS", "VACUUM is refused"),
    ("RESTORE TABLE delta.`{path}` TO VERSION AS OF 0", "RESTORE is refused"),
    ("INSERT OVERWRITE DIRECTORY '{path}' USING parquet SELECT 1 AS x", "INSERT OVERWRITE DIRECTORY is refused"),
    ("CREATE TEMPORARY VIEW payments AS SELECT 1 AS x", "CREATE VIEW is refused"),
    ("SET spark.sql.runSQLOnFiles = true", "SET is refused"),
    ("SELECT * FROM delta.`{path}`", "is refused: a table is read by its name"),
    ("SELECT * FROM payments WHERE payment_id IN (SELECT payment_id FROM parquet.`{path}`)",
     "is refused: a table is read by its name"),
]


def test_duckdb_refuses_every_statement_that_is_not_a_read_and_changes_nothing(warehouse):
    before = state(warehouse)
    for sql, expected in DUCKDB_REFUSED:
        sql = sql.format(path=payments_path(warehouse))
        with pytest.raises(QueryError) as refused:
            query_duckdb(warehouse, sql)
        message = str(refused.value)
        assert message.startswith("read-only: ") and expected in message, (sql, message)
        assert "`eventlake rebuild`" in message and message.endswith(TABLES), message
    assert state(warehouse) == before
    # The command line: one message, exit code 2.
    assert_one_message(run_cli(warehouse.home, "DELETE FROM payments"), "eventlake query: read-only: DELETE is refused",
                       TABLES)
    assert state(warehouse) == before


def test_duckdb_still_answers_every_kind_of_read(warehouse):
    reads = ["SELECT count(*) FROM payments", "WITH p AS (SELECT * FROM payments) SELECT count(*) FROM p",
             "FROM payments SELECT count(*)", "DESCRIBE payments", "SHOW TABLES", "SUMMARIZE payments",
             "EXPLAIN SELECT * FROM payments", "SELECT * FROM (VALUES (1)) t(x)"]
    for sql in reads:
        columns, rows = query_duckdb(warehouse, sql)
        assert columns and rows, sql


def test_spark_refuses_every_statement_that_is_not_a_read_and_changes_nothing(spark, warehouse):
    before = state(warehouse)
    for sql, expected in SPARK_REFUSED:
        sql = sql.format(path=payments_path(warehouse))
        with pytest.raises(QueryError) as refused:
            query_spark(warehouse, sql)
        message = str(refused.value)
        assert message.startswith("read-only: ") and expected in message, (sql, message)
        assert message.endswith(TABLES), message
    assert state(warehouse) == before
    # Reads still run, subqueries and CTEs included.
    reads = ["SELECT count(*) FROM payments", "WITH p AS (SELECT * FROM payments) SELECT count(*) FROM p",
             "SELECT count(*) FROM account_summary WHERE account_id IN (SELECT account_id FROM payments)",
             "DESCRIBE payments", "SHOW TABLES", "EXPLAIN SELECT * FROM payments"]
    counts = {}
    for sql in reads:
        columns, rows = query_spark(warehouse, sql)
        assert columns and rows, sql
        counts[sql] = rows
    assert counts[reads[0]] == counts[reads[1]] == [tuple(r) for r in query_duckdb(warehouse, reads[0])[1]]


def test_the_command_line_prints_every_row_as_csv_or_json(warehouse):
    import csv
    import io
    import json

    count = query_duckdb(warehouse, "SELECT count(*) FROM payments")[1][0][0]
    assert count > 20
    sql = "SELECT payment_id, amount_minor, occurred_at FROM payments ORDER BY payment_id"
    as_csv = run_cli(warehouse.home, "--format", "csv", "--max-rows", "10", sql)  # csv and json: every row
    assert as_csv.returncode == 0, as_csv.stderr
    rows = list(csv.reader(io.StringIO(as_csv.stdout)))
    assert rows[0] == ["payment_id", "amount_minor", "occurred_at"] and len(rows) == count + 1
    as_json = run_cli(warehouse.home, "--format", "json", sql)
    assert as_json.returncode == 0, as_json.stderr
    objects = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [o["payment_id"] for o in objects] == [r[0] for r in rows[1:]]
    assert [str(o["amount_minor"]) for o in objects] == [r[1] for r in rows[1:]]
