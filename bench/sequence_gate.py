"""The Spark sequence gate's batch cost against the number of events already admitted (issue 42).

``bench/sequence_gate.py [--sizes 100000 1000000] [--accounts 100000] [--batch 10000] [--repeats 3]
[--gates old heads]``:
for each size, a sequence ledger of that many admitted events over ``--accounts`` accounts is written straight
with Delta (no Kafka), copied, and a batch of ``--batch`` events (each continuing its account's head: the
common path) is put through each of ``--gates`` on a copy of its own: ``old``, the gate as it was before issue 42
(``admit`` of commit ``OLD_COMMIT``, which joins the batch's ids with the whole ledger); ``ledger`` and ``heads``,
today's two (``spark_apps.sequence``: the join with the ledger, the per-aggregate heads). Each gate runs an unmeasured warm-up batch (today's builds its heads table
from the ledger there), then ``--repeats`` batches; the median of their seconds is printed, and the ratio of
the largest size to the smallest for each gate (the aim: within 1.3x).
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lakehouse.settings import Settings  # noqa: E402
from read_models.catalog import held_table, ledger_table  # noqa: E402

OLD_COMMIT = "af339a2"  # the gate that reads every admitted event id
PROJECTION = "projection-bench-gate"


def _old_gate():
    """The module ``spark_apps/sequence.py`` as it was at ``OLD_COMMIT``, loaded under a name of its own."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:spark_apps/sequence.py"],
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="old-gate-")) / "old_sequence.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_sequence", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _seed(spark, settings: Settings, events: int, accounts: int) -> None:
    """A ledger of ``events`` admitted events, versions 1.. of each account in turn, and an empty held table."""
    from pyspark.sql import functions as F

    from spark_apps.merge import ensure_table
    from spark_apps.sequence import ledger_schema
    from spark_apps.spark_projection import spark_event_row_schema

    ledger = str(settings.table_path(ledger_table(PROJECTION)))
    ensure_table(spark, settings.table_path(ledger_table(PROJECTION)), ledger_schema(), ("aggregate_id",))
    ensure_table(spark, settings.table_path(held_table(PROJECTION)), spark_event_row_schema(spark))
    rows = spark.range(events).select(
        F.format_string("acc-%07d", F.col("id") % accounts).alias("aggregate_id"),
        (F.floor(F.col("id") / accounts) + 1).cast("long").alias("aggregate_version"),
        F.expr("uuid()").alias("event_id"), (F.col("id") % 3).cast("int").alias("kafka_partition"),
        F.col("id").alias("kafka_offset"), F.lit("seed/0").alias("admitted_by"))
    # Files of ~250k rows, as a ledger compacted beside the batches holds.
    rows.repartition(max(1, events // 250_000)).write.format("delta").mode("append").save(ledger)


def _batch(spark, events: int, accounts: int, size: int, round_: int):
    """``size`` event rows, each the next version of its own account (``round_`` rounds after the seed)."""
    from pyspark.sql import functions as F

    from spark_apps.sequence import derived_id

    full_rounds, extra = divmod(events, accounts)
    rows = spark.range(size).select(
        F.lit("account").alias("aggregate_type"),
        F.format_string("acc-%07d", F.col("id")).alias("aggregate_id"),
        (F.when(F.col("id") < extra, full_rounds + 1).otherwise(full_rounds) + round_ + 1)
        .cast("long").alias("aggregate_version"),
        F.lit("PaymentAuthorized").alias("event_type"),
        F.concat(F.lit(f"cmd-{round_}-"), F.col("id").cast("string")).alias("command_id"),
        (F.col("id") % 3).cast("int").alias("kafka_partition"),
        (F.lit(10 ** 9 + round_ * size) + F.col("id")).alias("kafka_offset"))
    return rows.withColumn("event_id", derived_id(F)).localCheckpoint(eager=True)


def _run(spark, settings, gate, events: int, accounts: int, size: int, repeats: int) -> list[float]:
    from spark_apps.merge import BatchContext

    seconds = []
    for round_ in range(repeats + 1):
        batch = _batch(spark, events, accounts, size, round_)
        ctx = BatchContext(spark, settings, "bench", PROJECTION, round_, input_rows=size, log=lambda *_: None)
        started = time.monotonic()
        admission = gate.admit(ctx, batch, PROJECTION)
        admitted = admission.events.count()
        took = time.monotonic() - started
        if admitted != size:
            raise SystemExit(f"the gate admitted {admitted} of {size} events: the bench's batch is wrong")
        if round_:  # round 0 is the warm-up
            seconds.append(took)
    return seconds


GATES = {"old": "the whole ledger's ids joined (af339a2)", "ledger": "sequence_gate=ledger (today)",
         "heads": "sequence_gate=heads"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--accounts", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gates", nargs="+", choices=list(GATES), default=["old", "heads"],
                        help="old: the gate before issue 42 (OLD_COMMIT); ledger, heads: today's two gates")
    args = parser.parse_args(argv)
    if args.batch > args.accounts:
        parser.error("--batch must not exceed --accounts (one event per account)")
    from spark_apps import sequence
    from spark_apps.session import build_session

    work = Path(tempfile.mkdtemp(prefix="bench-gate-"))
    spark = build_session(Settings.load({}).replace(home=work / "spark", spark_shuffle_partitions=2),
                          app_name="bench-sequence-gate", log=lambda *_: None)
    modules = {"old": _old_gate() if "old" in args.gates else None, "ledger": sequence, "heads": sequence}
    results, sizes_mb = {}, {}
    try:
        for events in args.sizes:
            homes = {g: Settings.load({}).replace(home=work / f"{events}-{g}",
                                                  sequence_gate="heads" if g == "heads" else "ledger")
                     for g in args.gates}
            first, *rest = args.gates
            t0 = time.monotonic()
            _seed(spark, homes[first], events, args.accounts)
            for g in rest:
                shutil.copytree(homes[first].home, homes[g].home, dirs_exist_ok=True)
            ledger = homes[first].table_path(ledger_table(PROJECTION))
            sizes_mb[events] = sum(f.stat().st_size for f in Path(str(ledger)).rglob("*.parquet")) / 2 ** 20
            print(f"{events:,} events admitted over {args.accounts:,} accounts: seeded in "
                  f"{time.monotonic() - t0:.1f}s; the ledger's files {sizes_mb[events]:,.0f} MB", flush=True)
            for g in args.gates:
                seconds = _run(spark, homes[g], modules[g], events, args.accounts, args.batch, args.repeats)
                results[(g, events)] = statistics.median(seconds)
                print(f"  {g:6} batch of {args.batch:,}: median {results[(g, events)]:.2f}s "
                      f"({', '.join(f'{s:.2f}' for s in seconds)})", flush=True)
                shutil.rmtree(homes[g].home, ignore_errors=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    small, large = min(args.sizes), max(args.sizes)
    print(f"\nbatch of {args.batch:,} events, {args.accounts:,} accounts, median of {args.repeats}:")
    print("| admitted before | ledger's files | " + " | ".join(f"{g}: {GATES[g]}" for g in args.gates) + " |")
    print("|---|---|" + "---|" * len(args.gates))
    for events in args.sizes:
        print(f"| {events:,} | {sizes_mb[events]:,.0f} MB | "
              + " | ".join(f"{results[(g, events)]:.2f} s" for g in args.gates) + " |")
    for g in args.gates:
        print(f"{g}: {large:,} / {small:,} admitted: {results[(g, large)] / results[(g, small)]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
