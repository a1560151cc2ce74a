"""Benchmark: events/s projected into account_summary + payments, against the raw Kafka -> Delta append rate.

Prints figures; it is not a test. It writes N generated events (the pure core's output for generated
commands, cached under .cache/bench/) to a fresh events topic, then in one Spark session:
1. the ceiling: the ``event_archive`` query alone: the same Kafka source and JSON parsing, appended to a Delta
   table (no dedup, no MERGE);
2. the projection: ``Projection([account_summary, payments])`` with the same trigger size (the archive is
   its own query, so it is not part of this figure).
Both run with ``availableNow`` from the first offset to the last; the clock runs from query start to stop.
``--limits`` also times what any projection of this topic has to do at least, on the same events: the Kafka
source alone (into Spark's ``noop`` sink), the Kafka records' bytes appended to Delta unparsed, and the
envelope parsing and checks (``spark_apps.events.check_records``) into ``noop``.

    .venv/bin/python bench/projection.py [--events 1000000] [--accounts 20000] [--max-offsets 1000000] [--limits]
"""
from __future__ import annotations

import argparse
import shutil
import time
import uuid
from pathlib import Path

from event_store import kafka_log
from event_store.account import AccountState
from event_store.envelope import CommandEnvelope, InvalidRecord
from event_store.handler import execute
from eventlake.generator import GeneratorConfig, generate_commands
from eventlake.settings import Settings


def generated_events(n: int, accounts: int, cache: Path) -> list[tuple[bytes, bytes]]:
    """(key, value) of about ``n`` events, made once by the pure command handler core and cached."""
    path = cache / f"events-{n}-{accounts}.tsv"
    if path.exists():
        return [tuple(line.split(b"\t", 1)) for line in path.read_bytes().splitlines()]
    print(f"generating {n:,} events for {accounts:,} accounts (once; cached in {path}) ...", flush=True)
    cfg = GeneratorConfig(accounts=accounts, commands=int(n * 1.02), run_id="bench", seed=1, late_rate=0.0)
    states: dict[str, AccountState] = {}
    out: list[tuple[bytes, bytes]] = []
    for _, raw in generate_commands(cfg):
        command = CommandEnvelope.from_json(raw)
        state = states.get(command.aggregate_id) or AccountState(command.aggregate_id)
        states[command.aggregate_id], events, _ = execute(state, command)
        out += [(e.aggregate_id.encode(), e.to_json()) for e in events]
        if len(out) >= n:
            break
    cache.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(k + b"\t" + v for k, v in out))
    return out


def publish(settings: Settings, records) -> float:
    """The events, keyed by account as the handler writes them (librdkafka: publishing is not what is measured)."""
    import confluent_kafka

    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = confluent_kafka.Producer({"bootstrap.servers": settings.bootstrap_servers, "enable.idempotence": True,
                                         "acks": "all", "linger.ms": 20, "batch.size": 1024 * 1024,
                                         "queue.buffering.max.messages": 1_000_000})
    started = time.perf_counter()
    for key, value in records:
        while True:
            try:
                producer.produce(settings.events_topic, value, key)
                break
            except BufferError:
                producer.poll(0.5)
        producer.poll(0)
    producer.flush(300)
    return len(records) / (time.perf_counter() - started)


def raw_append(spark, settings: Settings, max_offsets: int):
    """The ceiling: the archive query alone (Kafka source, the same JSON parsing, appended to Delta, no dedup)."""
    from spark_apps.projection import Projection

    return Projection(spark, settings, models=[], archive=True, log=lambda *_: None).run_until_caught_up(
        max_offsets_per_trigger=max_offsets)


def source_limits(spark, settings: Settings, max_offsets: int) -> dict[str, float]:
    """Events/s of the least any projection of the events topic does: read it, copy it, parse it."""
    from spark_apps.events import check_records, read_event_records

    def timed(name: str, frame, sink: str) -> float:
        path = settings.home / "limits" / name
        writer = (frame.writeStream.format(sink).trigger(availableNow=True)
                  .option("checkpointLocation", str(path / "_checkpoint")))
        started = time.perf_counter()
        query = writer.start(str(path / "table")) if sink == "delta" else writer.start()
        query.awaitTermination()
        seconds = time.perf_counter() - started
        rows = sum(p.get("numInputRows", 0) for p in query.recentProgress)
        return rows / seconds

    records = lambda: read_event_records(spark, settings, max_offsets)  # noqa: E731 (a fresh stream each time)
    return {
        "Kafka source alone (noop sink)": timed("read", records(), "noop"),
        "Kafka records appended to Delta unparsed (key, value, topic, partition, offset, timestamp)":
            timed("copy", records().select("key", "value", "topic", "partition", "offset", "timestamp"), "delta"),
        "Kafka source + envelope parsing and checks (noop sink)": timed("parse", check_records(records()), "noop"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--accounts", type=int, default=20_000)
    parser.add_argument("--max-offsets", type=int, default=1_000_000, help="maxOffsetsPerTrigger of both runs")
    parser.add_argument("--warmup", type=int, default=100_000, help="events of an unmeasured warm-up run of both")
    parser.add_argument("--limits", action="store_true",
                        help="also time the Kafka source alone, an unparsed copy to Delta and the parsing alone")
    args = parser.parse_args()

    base = Settings.load()
    if base.uses_local_kafka:
        from infra import kafka
        kafka.up(base)
    run = uuid.uuid4().hex[:8]
    home = base.home / "bench" / run
    settings = base.replace(topic_prefix=f"bench-projection-{run}.", home=home)
    records = generated_events(args.events, args.accounts, base.cache_dir / "bench")
    produce_rate = publish(settings, records)
    print(f"published {len(records):,} events to {settings.events_topic}: {produce_rate:,.0f} events/s",
          flush=True)

    from read_models import ACCOUNT_SUMMARY, PAYMENTS
    from spark_apps.projection import Projection
    from spark_apps.session import build_session

    spark = build_session(settings, app_name="eventlake-bench-projection")
    if args.warmup:
        # The JVM's first batches run slower (class loading, JIT): warm up on a topic of its own, so that
        # neither measured run pays for it.
        warm = settings.replace(topic_prefix=settings.topic_prefix + "warmup.", home=home / "warmup")
        publish(warm, records[:args.warmup])
        raw_append(spark, warm, args.max_offsets)
        Projection(spark, warm, [ACCOUNT_SUMMARY, PAYMENTS], log=lambda *_: None).run_until_caught_up(
            max_offsets_per_trigger=args.max_offsets)
        print(f"warmed up on {args.warmup:,} events", flush=True)
    raw = raw_append(spark, settings, args.max_offsets)
    ceiling = raw.input_rows / raw.seconds
    print(f"raw Kafka -> Delta append (no dedup; the event_archive query): {raw.input_rows:,} events in "
          f"{raw.seconds:.1f}s = {ceiling:,.0f} events/s ({raw.batches} batches)", flush=True)
    projection = Projection(spark, settings, [ACCOUNT_SUMMARY, PAYMENTS], log=lambda *_: None)
    result = projection.run_until_caught_up(max_offsets_per_trigger=args.max_offsets)
    rate = result.input_rows / result.seconds
    print(f"projection account_summary + payments: {result.input_rows:,} events in {result.seconds:.1f}s = "
          f"{rate:,.0f} events/s ({result.batches} batches)")
    print(f"ratio to the ceiling: {rate / ceiling:.2f}")
    print("per batch (ms) raw append:  " + ", ".join(str(ms) for ms in raw.batch_ms))
    print("per batch (ms) projection:  " + ", ".join(str(ms) for ms in result.batch_ms))
    print("projection time by step (s): " + ", ".join(f"{k} {v:.1f}" for k, v in result.step_seconds.items()))
    if args.limits:
        for name, limit in source_limits(spark, settings, args.max_offsets).items():
            print(f"limit: {name}: {limit:,.0f} events/s")
    from delta.tables import DeltaTable
    for table in ("account_summary", "payments"):
        last = DeltaTable.forPath(spark, str(settings.table_path(table))).history(1).collect()[0]
        metrics = {k: v for k, v in (last["operationMetrics"] or {}).items() if k.endswith("TimeMs")}
        print(f"last {last['operation']} into {table} (ms): {metrics}")
    shutil.rmtree(home, ignore_errors=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
