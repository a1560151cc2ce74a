"""Benchmark: the cost of one live projection batch, by step, against its floors.

Prints figures; it is not a test. A live projection runs small batches (a few seconds of commands each), so its
freshness is set by what a small batch costs whatever its size: Spark jobs, Delta commits and table reads. This
writes ``--history`` generated events to a fresh events topic and projects them into every read model (the
projection as ``eventlake project`` runs it, with the archive), then, ``--batches`` times, appends the next
``--batch`` events and projects them in one batch, printing each batch's time by step and Spark's trigger
durations. Then the floors, in the same session: a batch whose ``foreachBatch`` does nothing, one Delta append of
one row, one MERGE of ``--batch`` rows into a small table.

    .venv/bin/python bench/batch_cost.py [--history 200000] [--batch 2000] [--batches 5] [--accounts 20000]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.projection import generated_events, publish  # noqa: E402
from bench.workloads import scratch_topics  # noqa: E402
from lakehouse.settings import Settings  # noqa: E402


def project(spark, settings: Settings):
    """Everything in the topic so far into every read model and the archive; -> (ProjectionRun, step seconds)."""
    from spark_apps.projection import Projection

    projection = Projection(spark, settings, log=lambda *_: None)
    run = projection.run_until_caught_up()
    return run, projection


def timed(fn, repeat: int = 5) -> float:
    """Median seconds of ``fn()`` over ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def floors(spark, settings: Settings, batch: int, records) -> dict[str, float]:
    """Seconds of what any batch costs at least."""
    from pyspark.sql import functions as F
    from spark_apps.events import read_event_records

    out = {}
    # A streaming batch that does nothing: Kafka offsets, the checkpoint's offset and commit logs.
    floor = settings.replace(topic_prefix=settings.topic_prefix + "floor.")
    checkpoint = settings.home / "floor" / "checkpoint"
    durations = []
    for i in range(3):
        publish(floor, records[i * batch:(i + 1) * batch])
        query = (read_event_records(spark, floor).writeStream.foreachBatch(lambda df, batch_id: None)
                 .trigger(availableNow=True).option("checkpointLocation", str(checkpoint)).start())
        query.awaitTermination()
        durations += [p["durationMs"].get("triggerExecution", 0) / 1000 for p in query.recentProgress]
    out["an empty foreachBatch batch (trigger, offsets, checkpoint)"] = statistics.median(durations)
    table = str(settings.home / "floor" / "append")
    one = spark.range(1).withColumn("at", F.current_timestamp())
    one.write.format("delta").save(table)
    out["one Delta append of one row"] = timed(lambda: one.write.format("delta").mode("append").save(table))
    from delta.tables import DeltaTable

    target = str(settings.home / "floor" / "merge")
    spark.range(20_000).withColumn("v", F.lit(0)).write.format("delta").save(target)
    rows = spark.range(batch).withColumn("id", (F.col("id") * 7) % 20_000).withColumn("v", F.lit(1)).cache()
    rows.count()

    def merge():
        (DeltaTable.forPath(spark, target).alias("t").merge(rows.alias("s"), "t.id = s.id")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
    out[f"one MERGE of {batch:,} rows into a 20,000-row table"] = timed(merge)
    rows.unpersist()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=200_000, help="events projected before the measured batches")
    parser.add_argument("--batch", type=int, default=2000, help="events per measured batch")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--accounts", type=int, default=20_000)
    args = parser.parse_args()

    base = Settings.load(role="admin")
    if base.uses_local_kafka:
        from infra import kafka
        kafka.up(base)
    run = uuid.uuid4().hex[:8]
    home = base.home / "bench" / f"batch-cost-{run}"
    settings = base.replace(topic_prefix=f"bench-batch-cost-{run}.", home=home)
    records = generated_events(args.history + args.batch * (args.batches + 3), args.accounts,
                               base.cache_dir / "bench")
    with scratch_topics(settings):
        history, rest = records[:args.history], records[args.history:]
        publish(settings, history)

        from spark_apps.session import build_session

        spark = build_session(settings, app_name="eventlake-bench-batch-cost", log=lambda *_: None)
        started = time.perf_counter()
        caught_up, _ = project(spark, settings)
        print(f"history: {caught_up.input_rows:,} events projected into every read model in {caught_up.batches} "
              f"batch(es), {time.perf_counter() - started:.1f}s", flush=True)

        totals, by_step = [], {}
        for i in range(args.batches):
            publish(settings, rest[i * args.batch:(i + 1) * args.batch])
            result, projection = project(spark, settings)
            seconds = sum(ms or 0 for ms in result.batch_ms) / 1000
            totals.append(seconds)
            for step, s in result.step_seconds.items():
                by_step.setdefault(step, []).append(s)
            steps = "; ".join(f"{k} {v:.2f}" for k, v in result.step_seconds.items() if v >= 0.005)
            print(f"batch {i + 1}: {result.input_rows:,} events, {seconds:.2f}s in foreachBatch ({steps})",
                  flush=True)
        print(f"\nlive batches of {args.batch:,} events after {args.history:,}: median "
              f"{statistics.median(totals):.2f}s in foreachBatch (read models' query)")
        print("median by step (s; the read models run side by side, so steps add up to more than the batch):")
        for step, values in by_step.items():
            print(f"  {step:45s} {statistics.median(values):6.2f}")
        print("floors:")
        for name, seconds in floors(spark, settings, args.batch, rest[args.batches * args.batch:]).items():
            print(f"  {name:60s} {seconds:6.2f}s")
        spark.stop()
    shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
