"""The projection runner: one Structured Streaming query from the events topic into Delta read models.

``foreachBatch`` parses the batch once, appends records that are not valid events to the dead-letter
table, and MERGEs the events into every selected read model (see ``merge``). The Kafka offsets live
in the query's checkpoint, so a restart resumes where the last committed batch ended.

Run it with ``eventlake project`` or as a spark-submit target:
``spark-submit --packages <see SPARK_PACKAGES> spark_apps/projection.py [--until-caught-up] [NAMES]``.
"""
from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import read_models
from eventlake.settings import Settings
from read_models.spec import ReadModel
from spark_apps.events import check_records, parse_events, read_event_records, split_checked
from spark_apps.merge import BatchContext, apply, bookkeeping_tables, ensure_table

__all__ = ["Projection", "ProjectionRun", "DEAD_LETTER_TABLE", "ARCHIVE_TABLE", "main"]

DEAD_LETTER_TABLE = "_dead_letters/events"
# Every valid event with its topic/partition/offset: read models can be rebuilt from it after Kafka
# retention has removed old segments.
ARCHIVE_TABLE = "event_archive"


@dataclass
class ProjectionRun:
    batches: int = 0
    input_rows: int = 0
    seconds: float = 0.0

    @property
    def rows_per_second(self) -> float:
        return self.input_rows / self.seconds if self.seconds else 0.0


class Projection:
    def __init__(self, spark, settings: Settings, models: list[ReadModel] | None = None,
                 log: Callable[[str], None] = print):
        self.spark = spark
        self.settings = settings
        self.models = models or read_models.select(None)
        self.log = log
        names = "+".join(m.name for m in self.models)
        self.name = f"projection-{names}"
        self.checkpoint = settings.checkpoints / self.name

    def ensure_tables(self) -> None:
        """Create every table this projection writes, empty, if missing (readers never see a missing table)."""
        event_rows = _event_row_schema(self.spark)
        tables = {DEAD_LETTER_TABLE: _dead_letter_schema(), ARCHIVE_TABLE: event_rows}
        for model in self.models:
            tables[model.name] = model.schema()
            tables.update(bookkeeping_tables(model, event_rows))
        for name, schema in tables.items():
            ensure_table(self.spark, self.settings.table_path(name), schema)

    def _app_id(self) -> str:
        """An id for Delta's idempotent writes, new whenever the checkpoint is new (so a replay into a
        fresh checkpoint is never mistaken for batches already written)."""
        self.checkpoint.mkdir(parents=True, exist_ok=True)
        marker = self.checkpoint / "eventlake-app-id"
        if not marker.exists():
            marker.write_text(f"{self.name}-{uuid.uuid4()}")
        return hashlib.sha1(marker.read_text().encode()).hexdigest()[:16]

    # -- the query ---------------------------------------------------------------------------------
    def _process_batch(self, app_id: str):
        def process(batch, batch_id: int) -> None:
            spark = batch.sparkSession  # the query's own session: its conf changes stay in this query
            checked = check_records(batch).persist()  # JSON parsed once for both halves
            try:
                events, dead = split_checked(checked)
                ctx = BatchContext(spark, self.settings, app_id, self.name, batch_id, input_rows=-1)
                if not dead.isEmpty():
                    ctx.append(dead, DEAD_LETTER_TABLE)
                    self.log(f"projection: batch {batch_id}: record(s) that are not valid events -> "
                             f"dead-letter table {self.settings.table_path(DEAD_LETTER_TABLE)}")
                events = events.persist()
                try:
                    ctx.append(events, ARCHIVE_TABLE)
                    for model in self.models:
                        apply(ctx, model, events)
                finally:
                    events.unpersist()
            finally:
                checked.unpersist()
        return process

    def start(self, until_caught_up: bool = False, max_offsets_per_trigger: int | None = None):
        """Start the streaming query; with ``until_caught_up`` it stops by itself at the log's current end."""
        s = self.settings
        self.ensure_tables()
        app_id = self._app_id()
        records = read_event_records(self.spark, s, max_offsets_per_trigger)
        writer = (records.writeStream.queryName(self.name.replace("+", "_").replace("-", "_"))
                  .foreachBatch(self._process_batch(app_id))
                  .option("checkpointLocation", str(self.checkpoint)))
        writer = writer.trigger(availableNow=True) if until_caught_up else writer.trigger(
            processingTime=s.trigger_interval)
        query = writer.start()
        self.log(f"projection: {self.name} started from {s.events_topic} at {s.bootstrap_servers} "
                 f"(checkpoint {self.checkpoint})")
        return query

    def run_until_caught_up(self, progress_every_s: float = 5.0,
                            max_offsets_per_trigger: int | None = None) -> ProjectionRun:
        """Project everything committed to the log so far, printing progress, then stop."""
        started = time.monotonic()
        query = self.start(until_caught_up=True, max_offsets_per_trigger=max_offsets_per_trigger)
        run = ProjectionRun()
        seen: set[int] = set()
        try:
            while query.isActive:
                query.awaitTermination(progress_every_s)
                for p in query.recentProgress:
                    if p["batchId"] not in seen:
                        seen.add(p["batchId"])
                        run.batches += 1
                        run.input_rows += p["numInputRows"]
                if query.isActive:
                    self.log(f"projection: {run.batches} batch(es) done, {run.input_rows} events so far; now: "
                             f"{query.status['message']} ({time.monotonic() - started:.0f}s)")
            query.awaitTermination()  # re-raises the query's failure, if any
            for p in query.recentProgress:
                if p["batchId"] not in seen:
                    seen.add(p["batchId"])
                    run.batches += 1
                    run.input_rows += p["numInputRows"]
        finally:
            if query.isActive:
                query.stop()
        run.seconds = time.monotonic() - started
        return run


def _event_row_schema(spark):
    """Schema of the parsed event rows (what waits in a ``_pending`` table)."""
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType, \
        TimestampType

    empty = spark.createDataFrame([], StructType([StructField("value", BinaryType()), StructField("topic", StringType()),
                                                  StructField("partition", IntegerType()),
                                                  StructField("offset", LongType()),
                                                  StructField("timestamp", TimestampType())]))
    return parse_events(empty)[0].schema


def _dead_letter_schema():
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

    return StructType([StructField("reason", StringType()), StructField("raw_value", StringType()),
                       StructField("raw_value_base64", StringType()), StructField("kafka_topic", StringType()),
                       StructField("kafka_partition", IntegerType()), StructField("kafka_offset", LongType()),
                       StructField("dead_lettered_at", TimestampType())])


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point (also used by ``eventlake project``)."""
    import argparse

    from spark_apps.session import build_session

    parser = argparse.ArgumentParser(prog="projection", description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help=f"read models (default: all of {', '.join(read_models.REGISTRY)})")
    parser.add_argument("--until-caught-up", action="store_true",
                        help="process what the log holds now, then stop (availableNow trigger)")
    args = parser.parse_args(argv)
    settings = Settings.load()
    models = read_models.select(args.models)
    spark = build_session(settings, app_name="eventlake-projection")
    projection = Projection(spark, settings, models)
    if args.until_caught_up:
        run = projection.run_until_caught_up()
        print(f"projection: caught up: {run.input_rows} events in {run.batches} batches, {run.seconds:.1f}s; "
              f"tables under {settings.warehouse}")
        return 0
    query = projection.start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
