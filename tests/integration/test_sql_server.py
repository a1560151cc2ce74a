"""`eventlake sql-server`: Spark's Thrift server, reached with a real HiveServer2 client (PyHive over Thrift with
SASL PLAIN, as BI tools and beeline connect), gives the rows the embedded path gives; refuses every write and every
table named by path, leaving the warehouse as it was; follows a generation switch without a restart; and
`start`/`status`/`stop` behave as a service's should."""
import socket
import time

import pytest
from deltalake import DeltaTable, write_deltalake

from eventlake import cli, sql_server
from eventlake.generator import GeneratorConfig
from eventlake.query import query_duckdb
from lakehouse.settings import Settings
import read_models
from read_models.catalog import Catalog
from tests.domain_helpers import events_for
from tests.integration.test_checks import write_folded
from tests.integration.test_query_read_only import payments_path, state

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings = Settings.load({}).replace(home=tmp_path_factory.mktemp("sql-server-home"), sql_server_port=free_port(),
                                         spark_shuffle_partitions=2)
    write_folded(settings, events_for(GeneratorConfig(accounts=6, commands=80, seed=9, run_id="sqls")))
    sql_server.start(settings, log=lambda *_: None)
    try:
        yield settings
    finally:
        sql_server.stop(settings, log=lambda *_: None)


def connect(settings: Settings):
    from pyhive import hive

    return hive.connect(host="127.0.0.1", port=settings.sql_server_port, username="analyst")


def thrift_rows(settings: Settings, sql: str) -> list[tuple]:
    with connect(settings) as conn:
        cursor = conn.cursor()
        cursor.execute(sql)
        return [tuple(r) for r in cursor.fetchall()]


SAME_ROWS = [
    "SELECT account_id, status, available_minor, payments_authorized, version FROM account_summary ORDER BY account_id",
    "SELECT status, count(*) AS payments, sum(amount_minor) AS total FROM payments GROUP BY status ORDER BY status",
    "SELECT p.account_id, count(*) AS n FROM payments p JOIN account_summary a ON p.account_id = a.account_id "
    "WHERE a.status = 'open' GROUP BY p.account_id ORDER BY n DESC, p.account_id",
    "WITH big AS (SELECT * FROM payments WHERE amount_minor > 1000) SELECT count(*) FROM big",
    "SELECT rule, count(*) FROM fraud_alerts GROUP BY rule ORDER BY rule",
]


def test_the_thrift_server_gives_the_rows_the_embedded_path_gives(server):
    for sql in SAME_ROWS:
        expected = query_duckdb(server, sql)[1]
        assert thrift_rows(server, sql) == expected, sql
    assert sorted(r[1] for r in thrift_rows(server, "SHOW TABLES")) == sorted(read_models.REGISTRY)


def test_the_thrift_server_refuses_every_write_and_every_path_and_changes_nothing(server):
    from pyhive.exc import OperationalError

    before = state(server)
    path = payments_path(server)
    refused = {
        "INSERT INTO payments SELECT * FROM payments": "INSERT is refused",
        "DELETE FROM payments WHERE amount_minor > 0": "is refused",
        "UPDATE account_summary SET available_minor = 0": "is refused",
        "MERGE INTO payments t USING payments s ON t.payment_id = s.payment_id WHEN MATCHED THEN DELETE": "is refused",
        "DROP VIEW payments": "is refused",
        "CREATE TABLE copy USING delta AS SELECT * FROM payments": "CREATE TABLE is refused",
        "CREATE OR REPLACE TEMPORARY VIEW payments AS SELECT 1 AS x": "CREATE VIEW is refused",
        # Spark refuses this one itself, before the guard sees it.
        "ALTER TABLE payments ADD COLUMNS (x INT)": "expects a table but `payments` is a view",
        f"DELETE FROM delta.`{path}`": "never by path",
        f"INSERT INTO delta.`{path}` SELECT * FROM payments": "INSERT is refused",
        f"OPTIMIZE delta.`{path}`": "OPTIMIZE is refused",
        f"VACUUM delta.`{path}` RETAIN 0 HOURS": "VACUUM is refused",
        f"SELECT * FROM delta.`{path}`": "never by path",
        f"SELECT * FROM parquet.`{path}`": "never by path",
        f"WITH p AS (SELECT * FROM json.`{path}/_delta_log`) SELECT count(*) FROM p": "never by path",
        f"SELECT count(*) FROM payments WHERE payment_id IN (SELECT payment_id FROM parquet.`{path}`)": "never by path",
        "SET spark.sql.runSQLOnFiles = true": "SET is refused",
        "CACHE TABLE payments": "CACHE TABLE is refused",
    }
    for sql, reason in refused.items():
        with pytest.raises(OperationalError) as error:
            thrift_rows(server, sql)
        assert reason in str(error.value), (sql, str(error.value)[:500])
        assert "eventlake: read-only" in str(error.value) or sql.startswith("ALTER"), sql
    assert state(server) == before
    # Still serving reads afterwards.
    count = "SELECT count(*) FROM payments"
    assert thrift_rows(server, count) == query_duckdb(server, count)[1]


def test_a_switch_to_another_generation_is_followed_without_a_restart(server):
    catalog = Catalog(server)
    rows = DeltaTable(payments_path(server)).to_pandas().sort_values("payment_id").head(4)
    g2 = catalog.create_next("payments", by="test", reason="a generation of 4 rows")
    write_deltalake(str(g2.table), rows, mode="overwrite")
    catalog.switch("payments", g2.number, expected_current=1, by="test", reason="checks passed")
    sql = "SELECT payment_id FROM payments ORDER BY payment_id"
    deadline = time.monotonic() + 60
    while thrift_rows(server, sql) != query_duckdb(server, sql)[1] and time.monotonic() < deadline:
        time.sleep(0.5)  # the server reads the catalog once a second
    assert thrift_rows(server, sql) == [(p,) for p in rows["payment_id"]] == query_duckdb(server, sql)[1]
    catalog.rollback("payments", by="test", reason="back")


def test_status_start_and_stop_behave_as_a_service(server, monkeypatch, capsys):
    for name, value in (("HOME", server.home), ("SQL_SERVER_PORT", server.sql_server_port)):
        monkeypatch.setenv(f"EVENTLAKE_{name}", str(value))
    monkeypatch.delenv("EVENTLAKE_CONFIG", raising=False)
    assert cli.main(["sql-server", "status"]) == 0
    out = capsys.readouterr().out
    assert f"running" in out and f"jdbc:hive2://127.0.0.1:{server.sql_server_port}/default" in out
    assert "payments" in out
    assert cli.main(["sql-server", "start"]) == 0  # already running: says so, starts nothing
    assert "running" in capsys.readouterr().out
    # A second server on the same port from another home: refused with the reason.
    other = server.replace(home=server.home / "other")
    with pytest.raises(sql_server.SqlServerError, match="is taken by another process"):
        sql_server.start(other, log=lambda *_: None)
