"""Benchmark: the rebuild's batch fold of ``event_archive`` into account_summary + payments, by step.

Prints figures; it is not a test. For each ``--events`` size it builds an archive directly in Spark (vectorised
from ``spark.range``, columns as the archive query writes them): many accounts (``--events-per-account``), each
opened then mostly paying (about 88% authorized, 7% declined), with device locations, some fraud flags and
freezes, in three partitions with each account's versions in offset order, and a few re-sent records
(``--duplicates``) that send their accounts through the ranked path of the sequence rule. The Kafka path (and
its JSON parsing) is skipped on purpose: this measures the fold, whose input is the archive's columns. Then it
times ``spark_apps.rebuild.fold_archive`` into fresh folders (after an unmeasured warm-up fold) with each of
``--engines`` (default: duckdb, what a rebuild uses; ``spark`` for the same fold in Spark, side by side):
per step (read: the position; sequence: the rule's checks and the ledger written; each model: its fold and
its one write), events/s, and the time ratio of the largest size to the smallest. ``--limits`` also times a scan of the
archive's columns into Spark's ``noop`` sink and a plain copy of them to a new Delta table: the floor under
any fold that reads every event and writes one table row per payment.

    .venv/bin/python bench/rebuild.py [--events 1000000 10000000] [--engines duckdb spark] [--limits]
"""
from __future__ import annotations

import argparse
import shutil
import time
import uuid

from lakehouse.settings import Settings


def build_archive(spark, settings: Settings, events: int, per_account: int, duplicates: float) -> float:
    """Writes ``events`` archive rows (plus re-sent copies) for ``events // per_account`` accounts; -> seconds."""
    from pyspark.sql import functions as F

    from spark_apps.merge import ensure_table
    from spark_apps.projection import ARCHIVE_STATS_COLUMNS, ARCHIVE_TABLE, _event_row_schema

    started = time.perf_counter()
    accounts = max(3, events // per_account // 3 * 3)  # a multiple of 3: account % 3 is its partition
    i = F.col("id")
    account = i % accounts
    version = (i / accounts).cast("long") + 1
    # Per version after the first: a kind drawn from a hash of (account, version), so the mix is even.
    draw = F.abs(F.xxhash64(account, version)) % 1000
    kind = (F.when(version == 1, "AccountOpened").when(draw < 880, "PaymentAuthorized")
            .when(draw < 950, "PaymentDeclined").when(draw < 985, "DeviceLocationReported")
            .when(draw < 993, "FraudSuspected").when(draw < 997, "AccountFrozen").otherwise("AccountUnfrozen"))
    locations = F.array(*[F.lit(x) for x in ("US-NYC", "US-SFO", "GB-LON", "DE-BER", "FR-PAR", "JP-TYO")])
    location = F.element_at(locations, (draw % 6 + 1).cast("int"))
    occurred = F.timestamp_seconds(F.lit(1_780_000_000) + (i / 20).cast("long"))  # 20 events/s, increasing
    is_payment = F.col("event_type").isin("PaymentAuthorized", "PaymentDeclined", "FraudSuspected")
    rows = (spark.range(events).select(
        F.format_string("00000000-0000-4000-8000-%012d", i).alias("event_id"), kind.alias("event_type"),
        F.lit(1).cast("long").alias("schema_version"), F.lit("account").alias("aggregate_type"),
        F.format_string("acc-bench-%08d", account).alias("aggregate_id"), version.alias("aggregate_version"),
        occurred.alias("occurred_at"), (occurred + F.expr("INTERVAL 40 MILLISECONDS")).alias("recorded_at"),
        F.format_string("cmd-%012d", i).alias("command_id"), F.format_string("cmd-%012d", i).alias("correlation_id"),
        F.format_string("cmd-%012d", i).alias("causation_id"), location.alias("_location"), draw.alias("_draw"),
        (i % 3).cast("int").alias("kafka_partition"), (i / 3).cast("long").alias("kafka_offset"), account.alias("_a"),
        version.alias("_v"))
        .select("*",
                F.when(F.col("event_type") == "AccountOpened", F.format_string("cust-%08d", "_a")).alias("customer_id"),
                F.when(F.col("event_type") == "AccountOpened", F.lit("USD")).when(is_payment, F.lit("USD"))
                .alias("currency"),
                F.when(is_payment, F.format_string("pay-%08d-%06d", "_a", "_v")).alias("payment_id"),
                F.when(F.col("event_type").startswith("Payment"), F.format_string("m-%05d", F.col("_draw") * 7 % 5000))
                .alias("merchant_id"),
                F.when(F.col("event_type").startswith("Payment") | (F.col("event_type") == "DeviceLocationReported"),
                       F.col("_location")).alias("location"),
                F.when(F.col("event_type") == "PaymentDeclined", F.lit("over_credit_limit"))
                .when(F.col("event_type") == "AccountFrozen", F.lit("fraud suspected")).alias("reason"),
                F.when(F.col("event_type") == "FraudSuspected", F.lit("amount_above_max")).alias("rule"),
                F.when(F.col("event_type") == "FraudSuspected", F.format_string("amount %d", F.col("_draw") * 97))
                .alias("evidence"),
                F.when(F.col("event_type") == "PaymentAuthorized", F.substring_index("_location", "-", 1))
                .alias("merchant_country"),
                F.lit(None).cast("string").alias("record"), F.lit(None).cast("string").alias("resolved_by"),
                F.when(F.col("event_type") == "AccountOpened", F.lit(500_000_000)).cast("long")
                .alias("credit_limit_minor"),
                F.when(F.col("event_type").startswith("Payment"), F.col("_draw") * 97 + 100).cast("long")
                .alias("amount_minor"),
                F.lit(settings.events_topic).alias("kafka_topic")))
    schema = _event_row_schema(spark)
    rows = rows.select(*[F.col(f.name).cast(f.dataType) for f in schema.fields])
    if duplicates:
        # A re-sent record: the same event again, later in its partition.
        again = (rows.filter(F.abs(F.xxhash64("event_id")) % 1_000_000 < int(duplicates * 1_000_000))
                 .withColumn("kafka_offset", F.col("kafka_offset") + F.lit(events)))
        rows = rows.unionByName(again)
    path = settings.table_path(ARCHIVE_TABLE)
    ensure_table(spark, path, schema, ARCHIVE_STATS_COLUMNS)
    rows.write.format("delta").mode("append").save(str(path))
    return time.perf_counter() - started


def limits(spark, settings: Settings) -> dict[str, float]:
    """Events/s of reading the archive's columns (noop sink) and of copying them whole to a new Delta table."""
    from spark_apps.projection import ARCHIVE_TABLE

    archive = spark.read.format("delta").load(str(settings.table_path(ARCHIVE_TABLE)))
    n = archive.count()
    out = {}
    started = time.perf_counter()
    archive.write.format("noop").mode("overwrite").save()
    out["scan of every archive column (noop sink)"] = n / (time.perf_counter() - started)
    started = time.perf_counter()
    archive.write.format("delta").mode("overwrite").save(str(settings.home / "copy"))
    out["copy of the archive to a new Delta table"] = n / (time.perf_counter() - started)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--events-per-account", type=int, default=50)
    parser.add_argument("--duplicates", type=float, default=0.0001, help="share of events re-sent once")
    parser.add_argument("--warmup", type=int, default=200_000, help="events of an unmeasured warm-up fold")
    parser.add_argument("--engines", nargs="+", default=["duckdb"], choices=["duckdb", "spark"],
                        help="fold with each (spark: the same fold as Spark jobs)")
    parser.add_argument("--limits", action="store_true", help="also time a scan and a copy of the archive")
    parser.add_argument("--keep", action="store_true", help="keep the archives and tables (under .eventlake/bench)")
    args = parser.parse_args()

    from read_models.account import ACCOUNT_SUMMARY, PAYMENTS
    from spark_apps.rebuild import fold_archive, warehouse_targets
    from spark_apps.session import build_session

    base = Settings.load(role="admin")
    run = uuid.uuid4().hex[:8]
    home = base.home / "bench" / f"rebuild-{run}"
    spark = build_session(base.replace(home=home), app_name="eventlake-bench-rebuild")
    models = [ACCOUNT_SUMMARY, PAYMENTS]
    print(f"spark {spark.version}, master {spark.sparkContext.master}, shuffle partitions "
          f"{spark.conf.get('spark.sql.shuffle.partitions')}, driver memory {base.spark_driver_memory}", flush=True)

    def archive(n: int, quiet: bool) -> Settings:
        settings = base.replace(home=home / f"archive-{n}")
        built = build_archive(spark, settings, n, args.events_per_account, args.duplicates)
        if not quiet:
            print(f"archive of {n:,} events (+{args.duplicates:.2%} re-sent) for {n // args.events_per_account:,} "
                  f"accounts built in {built:.1f}s (not measured)", flush=True)
        return settings

    def fold(settings: Settings, n: int, engine: str, quiet: bool):
        target = settings.replace(home=home / f"generation-{n}-{engine}")
        return fold_archive(spark, settings, models, warehouse_targets(target, models), engine=engine,
                            log=(lambda *_: None) if quiet else (lambda line: print("  " + line, flush=True)))

    if args.warmup:
        warm = archive(args.warmup, quiet=True)
        for engine in args.engines:
            fold(warm, args.warmup, engine, quiet=True)  # the JVM's first jobs are slower (class loading, JIT)
        print(f"warmed up on {args.warmup:,} events", flush=True)
    results: dict[str, dict[int, object]] = {engine: {} for engine in args.engines}
    for n in args.events:
        settings = archive(n, quiet=False)
        for engine in args.engines:
            print(f"{engine}:", flush=True)
            r = results[engine][n] = fold(settings, n, engine, quiet=False)
            print(f"{engine} fold of {r.events:,} events into account_summary + payments: {r.seconds:.1f}s = "
                  f"{r.events_per_second:,.0f} events/s (aim: 300,000)", flush=True)
            print("  by step (s): " + ", ".join(f"{k} {v:.1f}" for k, v in r.step_seconds().items()), flush=True)
        if len(args.engines) > 1:
            first = results[args.engines[0]][n]
            print(f"{n:,} events: " + ", ".join(
                f"{engine} takes {results[engine][n].seconds / first.seconds:.2f}x {args.engines[0]}'s time"
                for engine in args.engines[1:]), flush=True)
        if args.limits:
            for name, rate in limits(spark, settings).items():
                print(f"  limit: {name}: {rate:,.0f} events/s", flush=True)
    for engine, by_size in results.items():
        if len(by_size) > 1:
            small, large = min(by_size), max(by_size)
            ratio = by_size[large].seconds / by_size[small].seconds
            print(f"{engine}: time ratio {large:,} / {small:,} events: {ratio:.2f} (linear: {large / small:.0f}; "
                  f"aim: within {large / small * 1.1:.0f})")
    if not args.keep:
        shutil.rmtree(home, ignore_errors=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
