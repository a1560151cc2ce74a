"""What parsing and checking the events topic's records costs in Spark, piece by piece.

Prints figures; it is not a test. The records are the cached generated events of ``bench/projection.py``
(``--events``; made once if missing), put in a cached DataFrame shaped like the Kafka source's rows, then each
piece of ``spark_apps.events.check_records`` is run alone into Spark's ``noop`` sink (the second of two runs is
printed): the cast to text, the UTF-8 check, the rule that a string field's value must be a JSON string (a regular
expression over each record's text), the envelope's ``from_json``, and the whole of ``check_records``.

    .venv/bin/python bench/parse_cost.py [--events 300000] [--accounts 20000]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.projection import generated_events  # noqa: E402
from eventlake.settings import Settings  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--accounts", type=int, default=20_000)
    args = ap.parse_args()
    from pyspark.sql import functions as F

    from spark_apps.events import _NOT_A_STRING, check_records, envelope_schema
    from spark_apps.session import build_session

    settings = Settings.load()
    records = generated_events(args.events, args.accounts, settings.cache_dir / "bench")
    spark = build_session(settings, app_name="eventlake-bench-parse-cost")
    rows = [(value, "events", 0, offset, key) for offset, (key, value) in enumerate(records)]
    frame = spark.createDataFrame(rows, "value binary, topic string, partition int, offset long, key binary")
    frame = frame.repartition(settings.spark_shuffle_partitions).cache()
    frame.count()
    text = F.col("value").cast("string")
    pieces = {
        "cast to text": frame.select(text),
        "UTF-8 check (is_valid_utf8)": frame.select(F.is_valid_utf8(text)),
        "string fields hold JSON strings (rlike over the text)": frame.select(text.rlike(_NOT_A_STRING)),
        "envelope from_json": frame.select(F.from_json(text, envelope_schema())),
        "check_records, whole": check_records(frame),
    }
    print(f"{len(rows):,} records, {settings.spark_shuffle_partitions} partitions")
    for name, piece in pieces.items():
        for _ in range(2):  # the first run pays for code generation
            started = time.perf_counter()
            piece.write.format("noop").mode("overwrite").save()
            seconds = time.perf_counter() - started
        print(f"  {name}: {seconds:.2f}s = {len(rows) / seconds:,.0f} records/s", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
