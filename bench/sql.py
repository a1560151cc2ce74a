"""Benchmark: SQL reads of the read models on the three paths, and where the embedded path's time goes.

Prints figures; it is not a test. It writes a warehouse with delta-rs (vectorised, no Kafka, no Spark):
``payments`` with ``--payments`` rows (default 1M) over ``--accounts`` accounts, and ``account_summary`` with one
row per account. Then, in one run, p50/p99/max of
- an account point lookup: ``SELECT * FROM account_summary WHERE account_id = '<a random account>'``,
- a GROUP BY over every payment: per status and currency, the count and the sum of amounts,
on the embedded path (``eventlake.query.query_duckdb``, in this process, as ``eventlake query`` runs it), the
Thrift server (``eventlake sql-server``, through PyHive) and Spark SQL (``query_spark``, one session, started
before the clock). For the embedded path it also times its steps on their own: resolving the names through the
catalog, opening each table's Delta log (delta-rs), and the query in DuckDB.

``--small-commits N`` also builds a table the way a streaming projection leaves it: N appends of a few rows each
(one commit, one small file each, written by delta-rs), and times the point lookup on it as it is, after a Delta
log checkpoint and after OPTIMIZE (compaction) + checkpoint. ``--spark-commits N``: N such appends written by
Spark as the projection writes them, with Delta's auto compaction off and on (``EVENTLAKE_AUTO_COMPACT_MIN_FILES``),
side by side: files left, compactions, the append's time and the point lookup.

``--domain iot`` writes the device domain's tables instead, the same way (delta-rs, each in its read model's
own schema): ``device_status`` with one row per device (``--devices``) and ``device_minute_readings`` with
one row per device per minute (``--minutes`` each), and times a device point lookup
(``SELECT * FROM device_status WHERE device_id = '<a random device>'``), a GROUP BY over every window row
(per unit: windows, readings, min, max) and one device's last hour of windows, on the same paths.

    .venv/bin/python bench/sql.py [--payments 1000000] [--accounts 20000] [--repeat 50] [--small-commits 2000]
                                  [--spark-commits 200] [--engines embedded thrift spark]
                                  [--domain accounts|iot] [--devices 2000] [--minutes 500]
"""
from __future__ import annotations

import argparse
import random
import shutil
import socket
import statistics
import time
import uuid
from pathlib import Path

from lakehouse.settings import Settings

LOOKUP = "SELECT * FROM account_summary WHERE account_id = '{account}'"
GROUP_BY = ("SELECT status, currency, count(*) AS payments, sum(amount_minor) AS amount FROM payments "
            "GROUP BY status, currency ORDER BY status, currency")


DEVICE_LOOKUP = "SELECT * FROM device_status WHERE device_id = '{device}'"
DEVICE_GROUP_BY = ("SELECT unit, count(*) AS windows, sum(readings) AS readings, min(min_value_milli) AS low, "
                   "max(max_value_milli) AS high FROM device_minute_readings GROUP BY unit ORDER BY unit")
# One device's last hour of windows (a dashboard's chart): its rows in a time range, newest first.
DEVICE_HOUR = ("SELECT window_start, readings, sum_value_milli / readings AS mean_milli, min_value_milli, "
               "max_value_milli FROM device_minute_readings WHERE device_id = '{device}' "
               "AND window_start >= TIMESTAMP '{since}' ORDER BY window_start DESC")
SENSORS = (("temperature", "C", -20_000, 60_000), ("humidity", "%", 0, 100_000), ("pressure", "hPa", 900_000,
                                                                                  1_100_000))


def account(i: int) -> str:
    return f"acc-bench-{i:08d}"


def device(i: int) -> str:
    return f"dev-bench-{i:06d}"


def build_device_tables(settings: Settings, devices: int, minutes: int) -> tuple[float, str]:
    """``device_status`` (one row per device) and ``device_minute_readings`` (one row per device per minute),
    written by delta-rs in their read models' schemas; -> (seconds, the first window of the last hour)."""
    import numpy as np
    import pyarrow as pa
    from deltalake import write_deltalake

    from read_models.iot import DEVICE_MINUTE_READINGS, DEVICE_STATUS
    from spark_apps.arrow_rows import arrow_schema

    started = time.perf_counter()
    rng = np.random.default_rng(7)
    ts = pa.timestamp("us", tz="UTC")
    base = np.datetime64("2026-01-01T00:00:00", "us")
    kind = np.arange(devices) % len(SENSORS)
    sensor = lambda i: np.array([SENSORS[k][i] for k in kind])  # noqa: E731
    low, high = sensor(2).astype(np.int64), sensor(3).astype(np.int64)
    span = (high - low) // 4
    # Windows in time order, every device's minute side by side (as a projection's batches append them).
    d = np.tile(np.arange(devices), minutes)
    m = np.repeat(np.arange(minutes), devices)
    n = len(d)
    readings = rng.integers(1, 7, n)
    mid = (low + high)[d] // 2
    lo = mid - rng.integers(0, span[d] + 1)
    hi = mid + rng.integers(0, span[d] + 1)
    window = base + (m * 60_000_000).astype("timedelta64[us]")
    windows = pa.table({
        "device_id": pa.array([device(int(i)) for i in d]),
        "window_start": pa.array(window, ts), "window_end": pa.array(window + np.timedelta64(60, "s"), ts),
        "unit": pa.array(sensor(1)[d]), "readings": pa.array(readings, pa.int64()),
        "min_value_milli": pa.array(lo, pa.int64()), "max_value_milli": pa.array(hi, pa.int64()),
        "sum_value_milli": pa.array(readings * mid, pa.int64()),
        "updated_at": pa.array(window + np.timedelta64(61, "s"), ts),
    }).cast(arrow_schema(DEVICE_MINUTE_READINGS.schema()))
    write_deltalake(str(settings.table_path(DEVICE_MINUTE_READINGS.name)), windows, mode="overwrite")
    last = base + np.timedelta64(minutes - 1, "m")
    ids = np.arange(devices)
    total = np.full(devices, minutes * 3, np.int64)
    status = pa.table({
        "device_id": pa.array([device(int(i)) for i in ids]),
        "site_id": pa.array([f"site-{int(i) % 40:03d}" for i in ids]),
        "sensor_kind": pa.array(sensor(0)), "unit": pa.array(sensor(1)),
        "range_min_milli": pa.array(low, pa.int64()), "range_max_milli": pa.array(high, pa.int64()),
        "heartbeat_interval_s": pa.array(np.full(devices, 20), pa.int64()),
        "status": pa.array(np.where(ids % 97 == 0, "decommissioned", "active")),
        "last_value_milli": pa.array((low + high) // 2, pa.int64()),
        "last_reading_id": pa.array([f"{device(int(i))}-r{minutes * 3}" for i in ids]),
        "last_reading_at": pa.array(np.full(devices, last), ts), "last_seen_at": pa.array(np.full(devices, last), ts),
        "readings_count": pa.array(total, pa.int64()), "anomalies_count": pa.array(ids % 5, pa.int64()),
        "version": pa.array(total + 1, pa.int64()), "updated_at": pa.array(np.full(devices, last), ts),
    }).cast(arrow_schema(DEVICE_STATUS.schema()))
    write_deltalake(str(settings.table_path(DEVICE_STATUS.name)), status, mode="overwrite")
    since = str(base + np.timedelta64(max(minutes - 60, 0), "m")).replace("T", " ")
    return time.perf_counter() - started, since


def build_warehouse(settings: Settings, payments: int, accounts: int) -> float:
    import numpy as np
    import pyarrow as pa
    from deltalake import write_deltalake

    started = time.perf_counter()
    rng = np.random.default_rng(7)
    owner = rng.integers(0, accounts, payments)
    amount = rng.integers(100, 200_000, payments)
    status = np.where(rng.random(payments) < 0.93, "authorized", "declined")
    base = np.datetime64("2026-01-01T00:00:00", "us")
    occurred = base + (np.arange(payments) * 50_000).astype("timedelta64[us]")
    table = pa.table({
        "payment_id": pa.array([f"pay-{i:010d}" for i in range(payments)]),
        "account_id": pa.array([account(int(a)) for a in owner]),
        "merchant_id": pa.array([f"m-{int(a) % 997:04d}" for a in owner]),
        "amount_minor": pa.array(amount, pa.int64()),
        "currency": pa.array(np.where(owner % 10 == 0, "EUR", "USD")),
        "location": pa.array(np.where(owner % 3 == 0, "US-NYC", "GB-LON")),
        "merchant_country": pa.array(np.where(owner % 5 == 0, "GB", "US")),
        "status": pa.array(status),
        "decline_reason": pa.array(np.where(status == "declined", "over_limit", None)),
        "occurred_at": pa.array(occurred, pa.timestamp("us", tz="UTC")),
        "event_id": pa.array([str(uuid.UUID(int=i)) for i in range(payments)]),
    })
    write_deltalake(str(settings.table_path("payments")), table, mode="overwrite")
    ids = np.arange(accounts)
    summary = pa.table({
        "account_id": pa.array([account(int(i)) for i in ids]),
        "customer_id": pa.array([f"cust-{int(i):08d}" for i in ids]),
        "status": pa.array(["open"] * accounts),
        "credit_limit_minor": pa.array(np.full(accounts, 5_000_000), pa.int64()),
        "available_minor": pa.array(np.full(accounts, 1_000_000), pa.int64()),
        "currency": pa.array(np.where(ids % 10 == 0, "EUR", "USD")),
        "payments_authorized": pa.array(np.full(accounts, 40), pa.int64()),
        "payments_declined": pa.array(np.full(accounts, 3), pa.int64()),
        "authorized_total_minor": pa.array(np.full(accounts, 4_000_000), pa.int64()),
        "last_device_location": pa.array(["US-NYC"] * accounts),
        "version": pa.array(np.full(accounts, 44), pa.int64()),
        "updated_at": pa.array(np.full(accounts, base), pa.timestamp("us", tz="UTC")),
    })
    write_deltalake(str(settings.table_path("account_summary")), summary, mode="overwrite")
    return time.perf_counter() - started


def figures(seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p99 = ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))]
    return f"p50 {statistics.median(ms):8.1f} ms   p99 {p99:8.1f} ms   max {ms[-1]:8.1f} ms   (n={len(ms)})"


def timed(run, sqls: list[str]) -> list[float]:
    out = []
    for sql in sqls:
        t0 = time.perf_counter()
        run(sql)
        out.append(time.perf_counter() - t0)
    return out


def embedded_steps(settings: Settings, table: str, lookups: list[str]) -> None:
    """The embedded path's steps on their own, for the point lookups ``lookups`` on ``table``."""
    from deltalake import DeltaTable

    from eventlake.query import _duckdb_connection, _register_duckdb, logical_tables
    from lakehouse.tables import dataset

    resolve, open_logs, run = [], [], []
    for sql in lookups:
        t0 = time.perf_counter()
        tables = logical_tables(settings)
        t1 = time.perf_counter()
        for parts in tables.values():
            for part in parts:
                DeltaTable(str(part.path))
        t2 = time.perf_counter()
        con = _duckdb_connection()
        _register_duckdb(con, table, tables[table], dataset)
        con.execute(sql).fetchall()
        con.close()
        t3 = time.perf_counter()
        resolve.append(t1 - t0)
        open_logs.append(t2 - t1)
        run.append(t3 - t2)
    print(f"  embedded, by step (point lookup; {len(tables)} names):")
    print(f"    resolve names (catalog)          {figures(resolve)}")
    print(f"    open every table's Delta log     {figures(open_logs)}")
    print(f"    open its table + DuckDB query    {figures(run)}")


def small_commits(settings: Settings, commits: int, repeat: int) -> None:
    """A table of ``commits`` tiny appends, read as it is, after a checkpoint, after OPTIMIZE + checkpoint."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    path = str(settings.home / "small-commits")
    t0 = time.perf_counter()
    for c in range(commits):
        write_deltalake(path, pa.table({"account_id": [account(c * 3 + k) for k in range(3)],
                                        "version": pa.array([c] * 3, pa.int64())}), mode="append")
    print(f"small commits: {commits:,} appends of 3 rows written in {time.perf_counter() - t0:.1f}s")

    print(f"  as written ({len(DeltaTable(path).file_uris()):,} files, no checkpoint)  {figures(point_lookups(path, repeat, commits))}")
    DeltaTable(path).create_checkpoint()
    print(f"  after a log checkpoint                       {figures(point_lookups(path, repeat, commits))}")
    DeltaTable(path).optimize.compact()
    DeltaTable(path).create_checkpoint()
    print(f"  after OPTIMIZE + checkpoint ({len(DeltaTable(path).file_uris())} file(s))          "
          f"{figures(point_lookups(path, repeat, commits))}")


def spark_small_commits(settings: Settings, commits: int, repeat: int) -> None:
    """``commits`` appends of 3 rows written by Spark as the projection writes (Delta's log checkpoint every 10
    commits), with Delta's auto compaction off and on (``auto_compact_min_files``), side by side."""
    from deltalake import DeltaTable

    from spark_apps.session import build_session

    spark = build_session(settings, app_name="eventlake-bench-sql", log=lambda *_: None)
    spark.conf.set("spark.databricks.delta.autoCompact.minNumFiles", str(max(settings.auto_compact_min_files, 1)))
    conf = "spark.databricks.delta.autoCompact.enabled"
    print(f"small commits through Spark: {commits:,} appends of 3 rows each (auto compaction at "
          f"{settings.auto_compact_min_files} small files)")
    for label, enabled in (("auto compaction off", "false"), ("auto compaction on ", "true")):
        path = str(settings.home / f"spark-small-commits-{enabled}")
        spark.conf.set(conf, enabled)
        write_s = []
        for c in range(commits):
            rows = [(account(c * 3 + k), c) for k in range(3)]
            t = time.perf_counter()
            spark.createDataFrame(rows, "account_id string, version long").coalesce(1).write.format(
                "delta").mode("append").save(path)
            write_s.append(time.perf_counter() - t)
        table = DeltaTable(path)
        compactions = sum(c["operation"] == "OPTIMIZE" for c in table.history())
        print(f"  {label}: {len(table.file_uris()):>4} files, {compactions:>3} compactions; "
              f"append {figures(write_s)}")
        print(f"    point lookup                {figures(point_lookups(path, repeat, commits))}")
    spark.conf.set(conf, str(settings.auto_compact_min_files > 0).lower())


def point_lookups(path: str, repeat: int, commits: int) -> list[float]:
    """The embedded path's point lookup (a cursor of the process's DuckDB, the table's current version)."""
    from deltalake import DeltaTable

    from eventlake.query import _duckdb_connection
    from lakehouse.tables import dataset

    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        con = _duckdb_connection()
        con.register("t", dataset(DeltaTable(path)))
        con.execute(f"SELECT * FROM t WHERE account_id = '{account(random.randrange(commits * 3))}'").fetchall()
        con.close()
        out.append(time.perf_counter() - t)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--payments", type=int, default=1_000_000)
    ap.add_argument("--accounts", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=50, help="point lookups per engine (GROUP BYs: a fifth of it)")
    ap.add_argument("--small-commits", type=int, default=0)
    ap.add_argument("--spark-commits", type=int, default=0,
                    help="also N small appends through Spark, auto compaction off and on")
    ap.add_argument("--auto-compact-min-files", type=int, default=Settings.auto_compact_min_files,
                    help="with --spark-commits: the small files that start a compaction (EVENTLAKE_AUTO_COMPACT_MIN_FILES)")
    ap.add_argument("--engines", nargs="+", default=["embedded", "thrift", "spark"],
                    choices=["embedded", "thrift", "spark"])
    ap.add_argument("--domain", choices=["accounts", "iot"], default="accounts",
                    help="iot: device_status and device_minute_readings instead of the account tables")
    ap.add_argument("--devices", type=int, default=2000, help="iot: rows of device_status")
    ap.add_argument("--minutes", type=int, default=500, help="iot: windows per device in device_minute_readings")
    args = ap.parse_args()

    from eventlake import sql_server
    from eventlake.query import query_duckdb, query_spark

    home = Path(".cache/bench/sql") / uuid.uuid4().hex[:8]
    settings = Settings.load({}).replace(home=home.resolve(), sql_server_port=free_port(),
                                         auto_compact_min_files=args.auto_compact_min_files)
    try:
        if args.domain == "iot":
            built, since = build_device_tables(settings, args.devices, args.minutes)
            print(f"warehouse: {args.devices:,} devices, {args.devices * args.minutes:,} device minutes written in "
                  f"{built:.1f}s ({home})")
            table = "device_status"
            lookups = [DEVICE_LOOKUP.format(device=device(random.randrange(args.devices)))
                       for _ in range(args.repeat)]
            scans = {f"GROUP BY       %s  over {args.devices * args.minutes:,} device minutes": DEVICE_GROUP_BY}
            ranges = [DEVICE_HOUR.format(device=device(random.randrange(args.devices)), since=since)
                      for _ in range(args.repeat)]
        else:
            print(f"warehouse: {args.payments:,} payments, {args.accounts:,} accounts written in "
                  f"{build_warehouse(settings, args.payments, args.accounts):.1f}s ({home})")
            table = "account_summary"
            lookups = [LOOKUP.format(account=account(random.randrange(args.accounts))) for _ in range(args.repeat)]
            scans = {f"GROUP BY       %s  over {args.payments:,} payments": GROUP_BY}
            ranges = []
        engines = {}
        if "embedded" in args.engines:
            engines["embedded (DuckDB over delta-rs)"] = lambda sql: query_duckdb(settings, sql)
        if "thrift" in args.engines:
            import secrets

            from pyhive import hive

            from eventlake.sql_users import add_user

            # Logins need a password (as on any machine): a user of the bench's own, made before the server starts.
            password = secrets.token_urlsafe(16)
            add_user(settings, "bench", password)
            sql_server.start(settings, log=lambda *_: None)
            conn = hive.connect(host="127.0.0.1", port=settings.sql_server_port, username="bench", auth="CUSTOM",
                                password=password)

            def thrift(sql: str):
                cursor = conn.cursor()
                cursor.execute(sql)
                return cursor.fetchall()

            engines["Thrift server (PyHive, one connection)"] = thrift
        if "spark" in args.engines:
            query_spark(settings, "SELECT 1")  # the session starts before the clock
            engines["--engine spark (Spark SQL in process)"] = lambda sql: query_spark(settings, sql)
        for name, run in engines.items():
            run(lookups[0])  # warm-up: first reads of each table
            for scan in scans.values():
                run(scan)
            print(name)
            print(f"  point lookup   {figures(timed(run, lookups))}")
            for label, scan in scans.items():
                print("  " + label % figures(timed(run, [scan] * max(5, args.repeat // 5))))
            if ranges:
                print(f"  a device's last hour of windows  {figures(timed(run, ranges))}")
        if "embedded" in args.engines:
            embedded_steps(settings, table, [lookups[i % len(lookups)] for i in range(args.repeat)])
        if args.small_commits:
            small_commits(settings, args.small_commits, args.repeat)
        if args.spark_commits:
            spark_small_commits(settings, args.spark_commits, args.repeat)
    finally:
        if "thrift" in args.engines:
            sql_server.stop(settings, log=lambda *_: None)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
