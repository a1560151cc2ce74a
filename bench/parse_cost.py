"""What parsing and checking the events topic's records costs in Spark, piece by piece.

Prints figures; it is not a test. The records are the cached generated events of ``bench/projection.py``
(``--events``; made once if missing), put in a cached DataFrame shaped like the Kafka source's rows, then each
piece of ``spark_apps.events.check_records`` is run alone into Spark's ``noop`` sink (the second of two runs is
printed): the cast to text, the UTF-8 check, the rule that a string field's value must be a JSON string (a regular
expression over each record's text), the envelope's ``from_json``, and the whole of ``check_records``.

``--compare-jit`` instead times the whole of ``check_records`` in JVMs started with and without
``spark_apps.session.JVM_OPTIONS`` (HotSpot compiling huge methods), alternating, ``--rounds`` times each: the
figures of one run side by side, and their ratio.

    .venv/bin/python bench/parse_cost.py [--events 300000] [--accounts 20000] [--compare-jit [--rounds 2]]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.projection import generated_events  # noqa: E402
from lakehouse.settings import Settings  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--accounts", type=int, default=20_000)
    ap.add_argument("--compare-jit", action="store_true", help="check_records with and without JVM_OPTIONS")
    ap.add_argument("--rounds", type=int, default=2, help="with --compare-jit: JVMs started per option")
    ap.add_argument("--whole-only", choices=["default", "without-jvm-options"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.compare_jit:
        return compare_jit(args)
    from pyspark.sql import functions as F

    from spark_apps.events import _layout, check_records, envelope_schema
    from spark_apps.session import build_session

    settings = Settings.load(role="admin")
    records = generated_events(args.events, args.accounts, settings.cache_dir / "bench")
    # The driver's Java options without JVM_OPTIONS: the JVM as it starts by default.
    extra = ({"spark.driver.extraJavaOptions": f"-Dderby.system.home={settings.home / 'derby'}"}
             if args.whole_only == "without-jvm-options" else None)
    spark = build_session(settings, app_name="eventlake-bench-parse-cost", extra_conf=extra,
                          log=print if args.whole_only is None else (lambda *_: None))
    rows = [(value, "events", 0, offset, key) for offset, (key, value) in enumerate(records)]
    frame = spark.createDataFrame(rows, "value binary, topic string, partition int, offset long, key binary")
    frame = frame.repartition(settings.spark_shuffle_partitions).cache()
    frame.count()
    text = F.col("value").cast("string")
    pieces = {
        "cast to text": frame.select(text),
        "UTF-8 check (is_valid_utf8)": frame.select(F.is_valid_utf8(text)),
        "string fields hold JSON strings (rlike over the text)": frame.select(text.rlike(_layout().not_a_string)),
        "envelope from_json": frame.select(F.from_json(text, envelope_schema())),
        "check_records, whole": check_records(frame),
    }
    if args.whole_only:
        times = []
        for _ in range(3):  # the first run pays for code generation (and for compiling it)
            started = time.perf_counter()
            pieces["check_records, whole"].write.format("noop").mode("overwrite").save()
            times.append(time.perf_counter() - started)
        print(json.dumps({"records": len(rows), "seconds": times}))
        spark.stop()
        return 0
    print(f"{len(rows):,} records, {settings.spark_shuffle_partitions} partitions")
    for name, piece in pieces.items():
        for _ in range(2):  # the first run pays for code generation
            started = time.perf_counter()
            piece.write.format("noop").mode("overwrite").save()
            seconds = time.perf_counter() - started
        print(f"  {name}: {seconds:.2f}s = {len(rows) / seconds:,.0f} records/s", flush=True)
    spark.stop()
    return 0


def compare_jit(args) -> int:
    """check_records, whole, in fresh JVMs with and without JVM_OPTIONS, alternating."""
    from spark_apps.session import JVM_OPTIONS

    best: dict[str, list[float]] = {"default": [], "without-jvm-options": []}
    first: dict[str, list[float]] = {"default": [], "without-jvm-options": []}
    for round_ in range(1, args.rounds + 1):
        for option in ("without-jvm-options", "default"):
            out = subprocess.run([sys.executable, __file__, "--events", str(args.events), "--accounts",
                                  str(args.accounts), "--whole-only", option], check=True, capture_output=True,
                                 text=True).stdout
            figures = json.loads(out.strip().splitlines()[-1])
            seconds = figures["seconds"]
            first[option].append(seconds[0])
            best[option].append(min(seconds[1:]))
            print(f"round {round_}, {option}: runs {', '.join(f'{t:.2f}s' for t in seconds)} "
                  f"({figures['records']:,} records)", flush=True)
    without, with_ = (statistics.median(best[o]) for o in ("without-jvm-options", "default"))
    print(f"check_records, whole, after code generation (median of the best later run per JVM): "
          f"without {JVM_OPTIONS!r} {without:.2f}s, with it {with_:.2f}s: {without / with_:.2f}x as fast with it")
    cold_without, cold_with = (statistics.median(first[o]) for o in ("without-jvm-options", "default"))
    print(f"first run in a fresh JVM: without {cold_without:.2f}s, with {cold_with:.2f}s: "
          f"{cold_without / cold_with:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
