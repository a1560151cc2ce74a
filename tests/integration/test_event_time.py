"""Event time over the whole range the schemas allow (1900-01-01 up to 9999-01-01), on the real broker and real
Spark + Delta: every read path reads such rows, and one far-future payment cannot stop the windowed model."""
from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

import read_models
from event_store.envelope import EventEnvelope, format_time
from eventlake.query import query_duckdb, query_spark
from expectations.checks import check_table
from expectations.reconciliation import reconcile
from read_models.account.merchant_minute_volume import MODEL as MERCHANT_MINUTE_VOLUME
from spark_apps import status
from spark_apps.projection import Projection
from tests.oracle import assert_matches_oracle
from tests.projecting import publish_events as publish

pytestmark = pytest.mark.slow

EARLIEST = "1900-01-01T00:00:00.000Z"
LATEST = "9998-12-31T23:59:59.999Z"


class Account:
    """Events of one account, numbered 1, 2, 3 ... as the handler would write them."""

    def __init__(self, account_id: str):
        self.account_id, self.version, self.events = account_id, 0, []
        self._event("AccountOpened", "2026-01-01T00:00:00.000Z", None, {
            "customer_id": f"cus-{account_id}", "credit_limit_minor": 100_000_000, "currency": "USD"})

    def _event(self, event_type: str, occurred_at: str, recorded_at: str | None, payload: dict) -> EventEnvelope:
        self.version += 1
        event = EventEnvelope(
            event_id=str(uuid.uuid4()), event_type=event_type, schema_version=2 if event_type == "PaymentAuthorized"
            else 1, aggregate_type="account", aggregate_id=self.account_id, aggregate_version=self.version,
            occurred_at=occurred_at, recorded_at=recorded_at or "2026-02-01T00:00:00.000Z", command_id=str(uuid.uuid4()),
            correlation_id=str(uuid.uuid4()), causation_id=str(uuid.uuid4()), payload=payload)
        self.events.append(event)
        return event

    def pay(self, occurred_at: str, amount_minor: int = 1_000, merchant_id: str = "mer-0001",
            recorded_at: str | None = None) -> EventEnvelope:
        return self._event("PaymentAuthorized", occurred_at, recorded_at, {
            "payment_id": f"pay-{uuid.uuid4().hex[:12]}", "amount_minor": amount_minor, "currency": "USD",
            "merchant_id": merchant_id, "location": "US-NYC", "merchant_country": "US"})

    def flag(self, payment: EventEnvelope) -> EventEnvelope:
        return self._event("FraudSuspected", payment.occurred_at, None, {
            "payment_id": payment.payload["payment_id"], "rule": "amount_above_max", "evidence": "test"})


def project(spark, settings, models=None):
    """Every read model, or only ``models`` where a test is about those alone (fewer MERGEs per batch)."""
    return Projection(spark, settings, models, log=lambda *_: None).run_until_caught_up()


def test_rows_at_both_ends_of_the_event_time_range_are_read_by_every_read_path(spark, settings):
    account = Account("acc-time-00001")
    account.pay(EARLIEST, 1_100)
    account.flag(account.pay(LATEST, 2_200))
    account.pay("2026-01-01T00:05:00.000Z", 3_300)
    publish(settings, account.events)
    project(spark, settings)

    sql = "SELECT window_start, window_end, payments FROM merchant_minute_volume ORDER BY window_start"
    cols, windows = query_duckdb(settings, sql)
    assert [row[0].year for row in windows] == [1900, 2026, 9998] or \
        [row[0].year for row in windows] == [1900, 2026], windows  # 9998 on time or late, never lost
    _, late = query_duckdb(settings, "SELECT event_time, watermark FROM late_events")
    _, spark_windows = query_spark(settings, sql)
    assert len(spark_windows) == len(windows)
    query_spark(settings, "SELECT * FROM late_events")
    _, archived = query_duckdb(settings, "SELECT min(occurred_at), max(occurred_at) FROM event_archive")
    assert archived[0][0].year == 1900 and archived[0][1].year == 9998
    _, payments = query_duckdb(settings, "SELECT occurred_at FROM payments ORDER BY occurred_at")
    assert [p[0].year for p in payments] == [1900, 2026, 9998]
    total = sum(r[2] for r in windows) + len(late)
    assert total == 3  # every payment counted once: in its window or in late_events

    for name in read_models.REGISTRY:
        report = check_table(settings, name)
        assert report.success, report.lines()
        reconciled = reconcile(settings, name)
        assert reconciled.success, reconciled.lines()
    _, alerts = query_duckdb(settings, "SELECT occurred_at FROM fraud_alerts")
    assert alerts[0][0].year == 9998
    text = status.render(settings)
    assert "merchant_minute_volume: watermark" in text
    assert_matches_oracle(spark, settings, account.events)
    # Spark writes INT64 microsecond timestamps, not INT96 (which delta-rs/pyarrow read as nanoseconds).
    for uri in DeltaTable(str(settings.table_path("merchant_minute_volume"))).file_uris():
        schema = pq.ParquetFile(uri.removeprefix("file://")).schema
        assert {schema.column(i).physical_type for i in range(len(schema)) if schema.column(i).name.startswith(
            "window_")} == {"INT64"}


def test_tables_written_with_int96_timestamps_are_read_without_a_jvm(spark, settings):
    """Tables written before the switch to microsecond timestamps hold Spark's INT96: still readable."""
    from pyspark.sql import functions as F

    from spark_apps.merge import late_events_schema

    path = str(settings.table_path("late_events"))
    rows = spark.createDataFrame([], late_events_schema()).unionByName(spark.range(3).select(
        F.lit("merchant_minute_volume").alias("read_model"), F.col("id").cast("string").alias("event_id"),
        F.lit("PaymentAuthorized").alias("event_type"), F.lit("acc-1").alias("aggregate_id"),
        F.element_at(F.array(F.lit(EARLIEST).cast("timestamp"), F.lit(LATEST).cast("timestamp"),
                             F.lit("2026-01-01T00:00:00Z").cast("timestamp")), (F.col("id") + 1).cast("int"))
        .alias("event_time"),
        F.lit("9998-12-31T23:50:00Z").cast("timestamp").alias("watermark"), F.lit("{}").alias("event"),
        F.lit(LATEST).cast("timestamp").alias("recorded_at")))
    spark.conf.set("spark.sql.parquet.outputTimestampType", "INT96")
    try:
        rows.write.format("delta").save(path)
    finally:
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    uri = DeltaTable(path).file_uris()[0]
    assert pq.ParquetFile(uri.removeprefix("file://")).schema.column(4).physical_type == "INT96"
    _, read = query_duckdb(settings, "SELECT event_time, watermark FROM late_events ORDER BY event_time")
    assert [format_time(r[0]) for r in read] == [EARLIEST, "2026-01-01T00:00:00.000Z", LATEST]
    assert format_time(read[0][1]) == "9998-12-31T23:50:00.000Z"


def test_one_payment_dated_far_in_the_future_does_not_make_later_payments_late(spark, settings):
    base = datetime(2026, 1, 1, tzinfo=timezone.utc)
    account = Account("acc-time-00002")

    def pay_at(minutes: float, **kw):
        t = base + timedelta(minutes=minutes)
        return account.pay(format_time(t), recorded_at=format_time(t + timedelta(seconds=1)), **kw)

    def publish_and_project(events):
        publish(settings, events)
        project(spark, settings, [MERCHANT_MINUTE_VOLUME])  # the windowed model is this test's subject

    for m in range(0, 20, 2):
        pay_at(m, merchant_id=f"mer-{m % 3}")
    publish_and_project(account.events)
    # Written straight into the log (the handler would refuse it): dated 9998, recorded at a normal time.
    outlier = account.pay(LATEST, 7_777, recorded_at=format_time(base + timedelta(minutes=21)))
    publish_and_project([outlier])
    later = [pay_at(m, merchant_id=f"mer-{m % 3}") for m in range(22, 40, 2)]
    publish_and_project(later[:4])
    publish_and_project(later[4:])

    _, late = query_duckdb(settings, "SELECT event_id FROM late_events")
    assert late == []
    cols, windows = query_duckdb(settings, "SELECT window_start, payments FROM merchant_minute_volume "
                                           "WHERE year(window_start) = 2026")
    assert len(windows) == len(later) + 10  # every payment in its own minute
    _, outlier_window = query_duckdb(settings, "SELECT payments, amount_minor FROM merchant_minute_volume "
                                               "WHERE year(window_start) = 9998")
    assert outlier_window == [(1, 7_777)]  # the outlier is counted too, in its window
    assert_matches_oracle(spark, settings, account.events, [MERCHANT_MINUTE_VOLUME])
    [w] = [w for w in status.watermark_statuses(settings) if w.name == MERCHANT_MINUTE_VOLUME.name]
    assert format_time(w.newest_on_clock) == format_time(base + timedelta(minutes=38))
    assert format_time(w.watermark) == format_time(base + timedelta(minutes=39 - 10))
    assert w.ahead_of_clock == 1 and w.late == 0 and w.newest_event_time.year == 9998
    print(status.render(settings))

    # Now a payment 30 minutes before the newest one on the clock: beyond the watermark, recorded as late.
    old = pay_at(8.5)
    publish_and_project([old])
    _, late = query_duckdb(settings, "SELECT event_id FROM late_events")
    assert late == [(old.event_id,)]
    assert_matches_oracle(spark, settings, account.events, [MERCHANT_MINUTE_VOLUME])


def test_repeated_generator_runs_land_on_time(spark, settings):
    """Two runs dated as `eventlake generate` and `eventlake demo` date them: the second lands after the first,
    past the watermark (undated, both would start at 2026-01-01 and the second would go to late_events)."""
    from event_store.client import EventStore
    from event_store.handler import CommandHandler
    from eventlake.generator import GeneratorConfig, dated, generate_commands

    payments = 0
    for run_id in ("rep1", "rep2"):
        # 10 s between commands: a run spans ~23 minutes of event time, more than the watermark's delay.
        cfg = dated(GeneratorConfig(accounts=10, commands=150, seed=len(run_id) + payments, run_id=run_id,
                                    mean_interval_s=10.0, late_rate=0.0, burst_rate=0.0), settings)
        records = list(generate_commands(cfg))
        payments += sum(json.loads(v)["command_type"] == "AuthorizePayment" for _, v in records)
        with EventStore(settings) as store:
            store.send_raw(records)
        with CommandHandler(settings, log=lambda *_: None) as handler:
            handled = handler.run(until_caught_up=True, max_seconds=120)
        assert handled.commands == len(records), \
            f"run {run_id}: the handler handled {handled.commands} of {len(records)} commands"
        run = project(spark, settings, [read_models.get("account_summary"), MERCHANT_MINUTE_VOLUME])  # the two read
        assert run.input_rows == handled.events, \
            f"run {run_id}: the projection read {run.input_rows} of the {handled.events} events written"
    _, late = query_duckdb(settings, "SELECT event_id, event_time, watermark FROM late_events")
    assert late == []
    _, [(authorized, declined)] = query_duckdb(
        settings, "SELECT sum(payments_authorized), sum(payments_declined) FROM account_summary")
    _, [(counted,)] = query_duckdb(settings, "SELECT sum(payments) FROM merchant_minute_volume")
    assert authorized + declined == payments and counted == authorized > 0
    [w] = [w for w in status.watermark_statuses(settings) if w.name == MERCHANT_MINUTE_VOLUME.name]
    assert w.late == 0 and w.watermark is not None and w.ahead_of_clock == 0
