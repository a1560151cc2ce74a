"""`eventlake query` turns whatever an engine refuses (bad SQL, an unknown table, an empty warehouse, values it
cannot read) into one message naming the reason and the tables there are; never a traceback."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eventlake import cli
from eventlake.generator import GeneratorConfig
from eventlake.query import QueryError, query_duckdb
from lakehouse.settings import Settings
from read_models.catalog import DEAD_LETTER_TABLE
from spark_apps.merge import ensure_table
from tests.domain_helpers import events_for
from tests.integration.test_checks import write_folded

pytestmark = pytest.mark.slow

EVENTLAKE = str(Path(sys.executable).parent / "eventlake")
ROOT = str(Path(__file__).resolve().parents[2])
TABLES = ("(tables: account_summary, payments, merchant_minute_volume, fraud_alerts, category_minute_volume, "
          "device_status, device_minute_readings, telemetry_anomalies, page_minute_clicks)")


def run_cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EVENTLAKE_HOME": str(home), "PYTHONPATH": ROOT}  # this checkout's code, not the venv's
    env.pop("EVENTLAKE_CONFIG", None)
    return subprocess.run([EVENTLAKE, "query", *args], env=env, capture_output=True, text=True, timeout=300)


def assert_one_message(result: subprocess.CompletedProcess, *expected: str) -> str:
    """Exit code 2, nothing on stdout, one paragraph on stderr holding ``expected``; no traceback."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    message = result.stderr.strip()
    assert message.startswith("eventlake query: ") and "\n\n" not in message, message
    for text in expected:
        assert text in message, message
    return message


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Settings:
    """The read models as the folds of a small log, written with delta-rs."""
    settings = Settings(home=tmp_path_factory.mktemp("query-home"))
    write_folded(settings, events_for(GeneratorConfig(accounts=5, commands=60, seed=8, run_id="qry")))
    return settings


def test_an_empty_warehouse_says_what_to_run_first_on_both_engines(tmp_path):
    for engine in ("duckdb", "spark"):  # Spark: said before a JVM is started
        result = run_cli(tmp_path, "--engine", engine, "SELECT * FROM payments")
        assert_one_message(result, f"no read model tables under {tmp_path}", "`eventlake demo`",
                           "`eventlake project --until-caught-up` first")


def test_bad_sql_and_an_unknown_table_give_duckdbs_message_and_the_tables(warehouse):
    message = assert_one_message(run_cli(warehouse.home, "SELEC * FROM payments"), "DuckDB could not run the query",
                                 'syntax error at or near "SELEC"', TABLES)
    assert message.endswith(TABLES)
    assert_one_message(run_cli(warehouse.home, "SELECT * FROM no_such_table"), "DuckDB could not run the query",
                       "no_such_table", TABLES)


def test_bad_sql_and_an_unknown_table_give_sparks_message_and_the_tables(spark, warehouse, monkeypatch, capsys):
    monkeypatch.setenv("EVENTLAKE_HOME", str(warehouse.home))
    monkeypatch.delenv("EVENTLAKE_CONFIG", raising=False)
    for sql, reason in (("SELEC * FROM payments", "PARSE_SYNTAX_ERROR"),
                        ("SELECT * FROM no_such_table", "TABLE_OR_VIEW_NOT_FOUND")):
        assert cli.main(["query", "--engine", "spark", sql]) == 2
        out = capsys.readouterr()
        assert out.out == "" and "Traceback" not in out.err, out.err
        message = out.err.strip()
        assert message.startswith("eventlake query: Spark SQL could not run the query: ") and reason in message
        assert message.endswith(TABLES) and "\n\n" not in message, message


def test_text_duckdb_cannot_decode_is_a_message_not_a_traceback(spark, tmp_path):
    """A dead-letter table written before raw_bytes (raw_value = the bytes cast to a string) and not yet
    upgraded by a projection run: DuckDB refuses its invalid UTF-8 while reading the rows."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    settings = Settings(home=tmp_path)
    path = str(settings.table_path(DEAD_LETTER_TABLE))
    ensure_table(spark, path, StructType([StructField("reason", StringType()), StructField("raw_value", StringType())]))
    (spark.createDataFrame([(bytearray(b"\xff\xfe\x00garbage"),)], "raw binary")
     .select(F.lit("not an event envelope").alias("reason"), F.col("raw").cast("string").alias("raw_value"))
     .write.format("delta").mode("append").save(path))

    with pytest.raises(QueryError, match="(?s)DuckDB could not run the query: .*nicode.*tables: event_dead_letters"):
        query_duckdb(settings, "SELECT raw_value FROM event_dead_letters")
    assert_one_message(run_cli(tmp_path, "SELECT raw_value FROM event_dead_letters"), "(tables: event_dead_letters)")
