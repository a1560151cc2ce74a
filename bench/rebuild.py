"""Benchmark: the rebuild's batch fold of ``event_archive`` into account_summary + payments, by step.

Prints figures; it is not a test. For each ``--events`` size it builds an archive directly in Spark (vectorised
from ``spark.range``, columns as the archive query writes them): many accounts (``--events-per-account``), each
opened then mostly paying (about 88% authorized, 7% declined), with device locations, some fraud flags and
freezes, in three partitions with each account's versions in offset order, and a few re-sent records
(``--duplicates``) that send their accounts through the ranked path of the sequence rule. The Kafka path (and
its JSON parsing) is skipped on purpose: this measures the fold, whose input is the archive's columns. Then it
times ``spark_apps.rebuild_fold.fold_archive`` into fresh folders (after an unmeasured warm-up fold) with each of
``--engines`` (default: duckdb, what a rebuild uses; ``spark`` for the same fold in Spark, side by side):
per step (read: the position; sequence: the rule's checks and the ledger written; each model: its fold and
its one write), events/s, and the time ratio of the largest size to the smallest. ``--limits`` also times a scan of the
archive's columns into Spark's ``noop`` sink and a plain copy of them to a new Delta table: the floor under
any fold that reads every event and writes one table row per payment.

``--domain iot|site|mixed`` folds generated events instead (``bench/workloads.py``: the pure command handler
core's events for generated commands, cached under ``.cache/bench/`` as ``bench/projection.py`` caches them):
the events are laid out as the events topic holds them (keyed by aggregate, so each aggregate's events are in
one partition in version order; ``--duplicates`` of them re-sent later in their partition) and turned into
archive rows by the archive query's own code (``spark_apps.events.parse_events``, the Spark JSON parsing,
checks and upcasting), so the fold reads what it reads in production. They are folded into the domain's read
models (``bench.workloads.READ_MODELS``: iot the three device models, site ``page_minute_clicks``, mixed those
four and the accounts' two), and each table is checked once against its model's Python oracle
(``python_fold`` of the events ``read_models.sequence`` admits; not timed; ``--no-check`` skips it), so a
wrong fold is never reported as a fast one.

    .venv/bin/python bench/rebuild.py [--events 1000000 10000000] [--engines duckdb spark] [--limits]
                                      [--domain accounts|iot|site|mixed] [--accounts 20000] [--devices 2000]
"""
from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import time
import uuid
import zlib
from pathlib import Path

from lakehouse.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.workloads import DOMAINS, read_models_of  # noqa: E402


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
    # The other registered domains' payload columns (site_id, value_milli, ...) are null in an account event's row,
    # as the archive query writes them.
    rows = rows.select(*[(F.col(f.name) if f.name in rows.columns else F.lit(None)).cast(f.dataType).alias(f.name)
                         for f in schema.fields])
    if duplicates:
        # A re-sent record: the same event again, later in its partition.
        again = (rows.filter(F.abs(F.xxhash64("event_id")) % 1_000_000 < int(duplicates * 1_000_000))
                 .withColumn("kafka_offset", F.col("kafka_offset") + F.lit(events)))
        rows = rows.unionByName(again)
    path = settings.table_path(ARCHIVE_TABLE)
    ensure_table(spark, path, schema, ARCHIVE_STATS_COLUMNS)
    rows.write.format("delta").mode("append").save(str(path))
    return time.perf_counter() - started


def log_records(events: list[tuple[bytes, bytes]], partitions: int, duplicates: float = 0.0
                ) -> list[tuple[int, int, bytes, bytes]]:
    """``events`` (key, value) as the events topic holds them: (partition, offset, key, value), each in the
    partition of its key (a stable hash of it, as a keyed producer places records: an aggregate's events in one
    partition, in the order given), then a ``duplicates`` share of them re-sent once after their partition's
    last record (picked by a hash of the record's bytes, so the same ones each run)."""
    out: list[tuple[int, int, bytes, bytes]] = []
    ends = [0] * partitions

    def append(key: bytes, value: bytes) -> None:
        p = zlib.crc32(key) % partitions
        out.append((p, ends[p], key, value))
        ends[p] += 1

    for key, value in events:
        append(key, value)
    threshold = int(duplicates * 1_000_000)
    if threshold:
        for key, value in events:
            if zlib.crc32(value) % 1_000_000 < threshold:
                append(key, value)
    return out


def build_domain_archive(spark, settings: Settings, records: list[tuple[int, int, bytes, bytes]]) -> float:
    """Writes ``records`` (``log_records``) to ``event_archive`` as the archive query does: Kafka-shaped rows
    through ``spark_apps.events.parse_events`` (the same JSON parsing, checks and upcasting), appended; -> seconds.
    The records go to Spark through a Parquet file, not a Kafka topic: the fold's input is the archive."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_apps.events import parse_events
    from spark_apps.merge import ensure_table
    from spark_apps.projection import ARCHIVE_STATS_COLUMNS, ARCHIVE_TABLE, _event_row_schema

    started = time.perf_counter()
    source = settings.home / "records.parquet"
    source.parent.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    pq.write_table(pa.table({
        "key": pa.array([r[2] for r in records], pa.binary()), "value": pa.array([r[3] for r in records], pa.binary()),
        "topic": pa.array([settings.events_topic] * len(records), pa.string()),
        "partition": pa.array([r[0] for r in records], pa.int32()),
        "offset": pa.array([r[1] for r in records], pa.int64()),
        "timestamp": pa.array([now] * len(records), pa.timestamp("us", tz="UTC"))}), source)
    events, _ = parse_events(spark.read.parquet(str(source)))
    schema = _event_row_schema(spark)
    path = settings.table_path(ARCHIVE_TABLE)
    ensure_table(spark, path, schema, ARCHIVE_STATS_COLUMNS)
    events.select(*schema.fieldNames()).write.format("delta").mode("append").save(str(path))
    archived = spark.read.format("delta").load(str(path)).count()
    if archived != len(records):
        raise SystemExit(f"bench: {len(records) - archived:,} of {len(records):,} generated records are not valid "
                         f"events (the archive query would dead-letter them); nothing to measure")
    return time.perf_counter() - started


def admitted_events(records: list[tuple[int, int, bytes, bytes]]) -> list:
    """The envelopes ``read_models.sequence`` admits from ``records``, in log order (partition, offset)."""
    from event_store.envelope import EventEnvelope
    from read_models.sequence import sequence

    return sequence(EventEnvelope.from_json(r[3]) for r in sorted(records, key=lambda r: (r[0], r[1]))).admitted


def table_rows(path: str, key: tuple[str, ...]) -> dict[tuple, dict]:
    """A Delta table's rows by key (delta-rs), timestamps as naive UTC as the Python oracles give them."""
    from lakehouse.tables import read_rows

    return {tuple(row[k] for k in key): row for row in read_rows(path)}


def fold_differences(expected: dict[tuple, dict], actual: dict[tuple, dict]) -> str:
    """'' when ``actual`` (a table's rows by key) holds exactly the oracle's keys, each row equal in every
    column the oracle gives; else what differs, with an example."""
    missing, extra = expected.keys() - actual.keys(), actual.keys() - expected.keys()
    if missing or extra:
        example = next(iter(missing or extra))
        return (f"{len(actual):,} rows, the oracle {len(expected):,} ({len(missing):,} missing, {len(extra):,} "
                f"extra, e.g. {example})")
    diff = [k for k, row in expected.items() if {c: actual[k].get(c) for c in row} != row]
    if diff:
        k = diff[0]
        columns = [c for c in expected[k] if actual[k].get(c) != expected[k][c]]
        return (f"{len(diff):,} of {len(expected):,} rows differ, e.g. {k}: "
                + ", ".join(f"{c} {actual[k].get(c)!r} != {expected[k][c]!r}" for c in columns))
    return ""


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
    parser.add_argument("--domain", choices=DOMAINS, default="accounts",
                        help="accounts: the synthetic archive; iot, site, mixed: generated events (bench/workloads.py)")
    parser.add_argument("--events-per-account", type=int, default=50, help="accounts only")
    parser.add_argument("--accounts", type=int, default=20_000, help="accounts of the mixed domain's events (a third)")
    parser.add_argument("--devices", type=int, default=2000, help="devices of the iot (a third: mixed) events")
    parser.add_argument("--duplicates", type=float, default=0.0001, help="share of events re-sent once")
    parser.add_argument("--warmup", type=int, default=200_000, help="events of an unmeasured warm-up fold")
    parser.add_argument("--engines", nargs="+", default=["duckdb"], choices=["duckdb", "spark"],
                        help="fold with each (spark: the same fold as Spark jobs)")
    parser.add_argument("--no-check", action="store_true",
                        help="generated domains: skip the check of the first size's tables against the oracles")
    parser.add_argument("--limits", action="store_true", help="also time a scan and a copy of the archive")
    parser.add_argument("--keep", action="store_true", help="keep the archives and tables (under .eventlake/bench)")
    args = parser.parse_args()

    from spark_apps.rebuild_fold import fold_archive, warehouse_targets
    from spark_apps.session import build_session

    base = Settings.load(role="admin")
    run = uuid.uuid4().hex[:8]
    home = base.home / "bench" / f"rebuild-{run}"
    spark = build_session(base.replace(home=home), app_name="eventlake-bench-rebuild")
    models = read_models_of(args.domain)
    into = " + ".join(m.name for m in models)
    generated = args.domain != "accounts"
    print(f"spark {spark.version}, master {spark.sparkContext.master}, shuffle partitions "
          f"{spark.conf.get('spark.sql.shuffle.partitions')}, driver memory {base.spark_driver_memory}", flush=True)
    records_of: dict[int, list] = {}

    def archive(n: int, quiet: bool) -> Settings:
        settings = base.replace(home=home / f"archive-{n}")
        if not generated:
            built = build_archive(spark, settings, n, args.events_per_account, args.duplicates)
            what = f"for {n // args.events_per_account:,} accounts"
        else:
            from bench.projection import domain_events

            events = domain_events(args.domain, n, args.accounts, args.devices, base.cache_dir / "bench")
            records = records_of[n] = log_records(events, settings.topic_partitions, args.duplicates)
            built = build_domain_archive(spark, settings, records)
            n = len(events)
            what = (f"of {len({k for k, _ in events}):,} {args.domain} aggregates ({len(records) - len(events):,} "
                    f"records re-sent; parsed by the archive query's code)")
        if not quiet:
            print(f"archive of {n:,} events (+{args.duplicates:.2%} re-sent) {what} built in {built:.1f}s "
                  f"(not measured)", flush=True)
        return settings

    def fold(settings: Settings, n: int, engine: str, quiet: bool):
        target = settings.replace(home=home / f"generation-{n}-{engine}")
        targets = warehouse_targets(target, models)
        return fold_archive(spark, settings, models, targets, engine=engine,
                            log=(lambda *_: None) if quiet else (lambda line: print("  " + line, flush=True))), targets

    def check(n: int, targets: dict, engine: str, admitted: list) -> None:
        """Each folded table against its model's Python oracle; a wrong fold ends the run (its time is void)."""
        started = time.perf_counter()
        rows = {}
        for model in models:
            expected = model.python_fold(admitted)
            why = fold_differences(expected, table_rows(targets[model.name].table, model.key))
            if why:
                raise SystemExit(f"bench: the {engine} fold of {n:,} events is WRONG: {model.name}: {why}")
            rows[model.name] = len(expected)
        print(f"  {engine}: every table equals its Python oracle (rows: "
              + ", ".join(f"{name} {count:,}" for name, count in rows.items())
              + f"; checked in {time.perf_counter() - started:.1f}s, not measured)", flush=True)

    try:
        if args.warmup:
            warm = archive(args.warmup, quiet=True)
            for engine in args.engines:
                fold(warm, args.warmup, engine, quiet=True)  # the JVM's first jobs are slower (class loading, JIT)
            print(f"warmed up on {args.warmup:,} events", flush=True)
        results: dict[str, dict[int, object]] = {engine: {} for engine in args.engines}
        for i, n in enumerate(args.events):
            settings = archive(n, quiet=False)
            admitted = admitted_events(records_of[n]) if generated and i == 0 and not args.no_check else None
            for engine in args.engines:
                print(f"{engine}:", flush=True)
                r, targets = fold(settings, n, engine, quiet=False)
                results[engine][n] = r
                if admitted is not None:
                    check(n, targets, engine, admitted)
                print(f"{engine} fold of {r.events:,} events into {into}: {r.seconds:.1f}s = "
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
    finally:
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
