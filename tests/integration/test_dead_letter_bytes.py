"""Dead letters keep a record's exact bytes (``raw_bytes``, ``raw_value_base64``) and a ``raw_value`` every SQL
path can read, also when the record is not UTF-8; a table made before ``raw_bytes`` existed is upgraded."""
import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eventlake import cli
from eventlake.generator import GeneratorConfig
from eventlake.query import query_duckdb, query_spark
from lakehouse.tables import read_table
from read_models.account.account_summary import MODEL as ACCOUNT_SUMMARY
from read_models.catalog import DEAD_LETTER_TABLE
from spark_apps.merge import ensure_table
from spark_apps.projection import Projection
from tests.domain_helpers import events_for
from tests.integration.test_projection import publish

pytestmark = pytest.mark.slow

EVENTLAKE = str(Path(sys.executable).parent / "eventlake")
ROOT = str(Path(__file__).resolve().parents[2])
NOT_UTF8 = b"\xff\xfe\x00garbage"
# UTF-16 surrogates encoded as UTF-8 (what Java's modified UTF-8 or Python's "surrogatepass" write): not UTF-8.
SURROGATES = '{"event_id": "\ud800", "note": "\udfff"}'.encode("utf-8", "surrogatepass")
NOT_AN_EVENT = "{\"kaffee\": \"H\u00e4ndler \u2615\"}".encode()  # valid UTF-8, but no event envelope
SQL = "SELECT raw_value, raw_bytes, raw_value_base64, reason FROM event_dead_letters ORDER BY kafka_offset"


def project(spark, settings):
    return Projection(spark, settings, [ACCOUNT_SUMMARY], log=lambda *_: None).run_until_caught_up()


def assert_bytes_kept(rows, expected: list[bytes]) -> None:
    """rows: (raw_value, raw_bytes, raw_value_base64, reason) per dead letter, in offset order."""
    assert [bytes(r[1]) for r in rows] == expected
    assert [base64.b64decode(r[2]) for r in rows] == expected
    for raw_value, raw_bytes, _, reason in rows:
        assert raw_value == bytes(raw_bytes).decode("utf-8", errors="replace")  # invalid sequences -> U+FFFD
    assert all(reason for *_, reason in rows)  # each says why (what exactly: test_event_parsing.py)


def test_records_that_are_not_utf8_are_read_back_byte_for_byte_through_every_sql_path(spark, settings,
                                                                                       monkeypatch, capsys):
    events = events_for(GeneratorConfig(accounts=3, commands=20, seed=2, run_id="dlb"))
    records = [(e.aggregate_id, e.to_json()) for e in events]
    hostile = [NOT_UTF8, SURROGATES, NOT_AN_EVENT]
    records[5:5] = [("acc-dlb-00001", value) for value in hostile]  # one partition: in this order
    publish(settings, records)
    project(spark, settings)

    assert_bytes_kept(query_duckdb(settings, SQL)[1], hostile)
    columns, rows = query_spark(settings, SQL)
    assert columns == ["raw_value", "raw_bytes", "raw_value_base64", "reason"]
    assert_bytes_kept(rows, hostile)
    assert rows[0][0] == "\ufffd\ufffd\x00garbage" and rows[2][0] == NOT_AN_EVENT.decode()
    assert "\ufffd" in rows[1][0] and rows[1][0].startswith('{"event_id": "')

    # The check path: delta-rs + pyarrow into pandas, as expectations.checks reads a table.
    frame = read_table(settings.table_path(DEAD_LETTER_TABLE),
                       columns=["raw_value", "raw_bytes", "raw_value_base64", "reason", "kafka_offset"]).to_pandas()
    frame = frame.sort_values("kafka_offset")
    assert_bytes_kept(list(frame[["raw_value", "raw_bytes", "raw_value_base64", "reason"]].itertuples(
        index=False, name=None)), hostile)

    # The console command, as a user runs it (DuckDB, its own process) and on Spark (this process's session).
    env = {**os.environ, "EVENTLAKE_HOME": str(settings.home), "PYTHONPATH": ROOT}  # this checkout's code
    env.pop("EVENTLAKE_CONFIG", None)
    shell = subprocess.run([EVENTLAKE, "query", SQL], env=env, capture_output=True, text=True, timeout=120)
    assert shell.returncode == 0 and shell.stderr == "", shell.stderr
    assert repr(NOT_UTF8) in shell.stdout and repr(SURROGATES) in shell.stdout
    assert "Händler ☕" in shell.stdout and "(3 rows)" in shell.stdout
    monkeypatch.setenv("EVENTLAKE_HOME", str(settings.home))
    monkeypatch.delenv("EVENTLAKE_CONFIG", raising=False)
    assert cli.main(["query", "--engine", "spark", SQL]) == 0
    out = capsys.readouterr()
    assert repr(NOT_UTF8) in out.out and repr(SURROGATES) in out.out and "(3 rows)" in out.out
    assert out.err == ""


def test_a_dead_letter_table_made_before_raw_bytes_is_upgraded_in_place(spark, settings):
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

    # The table as the projection made it before: raw_value was the bytes cast to a string (not valid UTF-8).
    old_schema = StructType([StructField("reason", StringType()), StructField("raw_value", StringType()),
                             StructField("raw_value_base64", StringType()), StructField("kafka_topic", StringType()),
                             StructField("kafka_partition", IntegerType()), StructField("kafka_offset", LongType()),
                             StructField("dead_lettered_at", TimestampType())])
    path = str(settings.table_path(DEAD_LETTER_TABLE))
    old = spark.createDataFrame([(bytearray(NOT_UTF8),)], "raw binary").select(
        F.lit("not an event envelope: invalid JSON or no event_id/event_type").alias("reason"),
        F.col("raw").cast("string").alias("raw_value"), F.base64("raw").alias("raw_value_base64"),
        F.lit("old-topic").alias("kafka_topic"), F.lit(0).alias("kafka_partition"), F.lit(0).cast("long").alias(
            "kafka_offset"), F.current_timestamp().alias("dead_lettered_at"))
    ensure_table(spark, path, old_schema)
    old.write.format("delta").mode("append").save(path)

    publish(settings, [("acc-dlb-00001", NOT_AN_EVENT)])
    project(spark, settings)  # upgrades the table, then appends a dead letter with the new schema

    assert spark.read.format("delta").load(path).columns == [*old_schema.names, "raw_bytes", "kafka_key"]
    rows = query_duckdb(settings, SQL.replace("ORDER BY", "ORDER BY kafka_topic = 'old-topic' DESC,"))[1]
    assert_bytes_kept(rows, [NOT_UTF8, NOT_AN_EVENT])
