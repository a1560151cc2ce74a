"""Benchmark: events/s projected into account_summary + payments, side by side with what else could do the work.

Prints figures; it is not a test. It writes N generated events (the pure core's output for generated
commands, cached under .cache/bench/) to a fresh events topic, then, on that one topic in one run:
1. the archive append: the ``event_archive`` query alone: the same Kafka source and JSON parsing, appended to a
   Delta table (no dedup, no MERGE);
2. the projection: ``Projection([account_summary, payments])`` with the same trigger size (the archive is
   its own query, so it is not part of this figure), with the Spark driver's peak RSS while it runs;
3. a plain Python consumer of the kind a user might write instead (``bench/plain_consumer.py``: confluent-kafka,
   json, delta-rs MERGE into the same two tables, no exactly-once bookkeeping), in a process of its own;
4. the Kafka records appended to Delta unparsed (key, value, topic, partition, offset, timestamp): the least any
   Spark projection of the topic writes;
5. the projection's Python engine (``eventlake project --engine python --until-caught-up`` of the same read models,
   DuckDB + delta-rs, the same exactly-once bookkeeping: python_engine/) in a process of its own,
   into tables and checkpoints of its own, with its peak RSS (its second parser process's included: large batches
   are parsed by two processes); its tables are compared with the Spark projection's.
The Spark runs use ``availableNow`` from the first offset to the last; each clock runs from start to caught up.
Each engine's events/s is printed as ratios to the plain consumer, the unparsed copy and the archive append.
``--limits`` also times the Kafka source alone (into Spark's ``noop`` sink) and the envelope parsing and checks
(``spark_apps.events.check_records``) into ``noop``.

``--domain iot`` makes the events of generated IoT commands instead (``--devices`` devices, about N events;
``bench/workloads.py``) and projects the device domain's three read models; ``--domain mixed`` the events of
accounts, devices and sites interleaved, projected into ``account_summary`` + ``payments`` and the device and
site models. The archive append and the unparsed copy are measured on each domain's own topic as for accounts;
the plain consumer folds accounts only, so it runs for ``accounts`` alone. With several domains (``all``: the
three) each is measured in turn in one run (one Spark session, a warm-up of each) and the projection's events/s
are printed side by side, with each domain's ratio to the accounts' and to its own unparsed copy.

    .venv/bin/python bench/projection.py [--events 1000000] [--accounts 20000] [--max-offsets 1000000]
                                         [--warmup 100000] [--plain-batch N] [--limits] [--json FILE]
                                         [--domain accounts|iot|mixed|all ...] [--devices 2000]
                                         [--engines spark python]
    .venv/bin/python bench/projection.py --engine-memory 1000000 5000000 [--accounts 20000] [--more-accounts]
    .venv/bin/python bench/projection.py --sealing off on [--events 200000] [--accounts 20000] [--repeat 2]
    .venv/bin/python bench/projection.py --merchants off on [--events 200000] [--accounts 20000] [--repeat 2]

``--sealing off on`` runs the Python engine alone on the same account events twice per ``--repeat``, alternated, each
on a topic of its own: once as they are, once with their personal fields sealed (as the handler writes them with
``personal_data_seal`` on: a key per customer in the engine's key store), and prints events/s side by side: what
unsealing costs the projection (issue 45). ``--merchants off on`` likewise, without and with ``dim_merchant`` loaded
into the engine's home first (the generator's 50 merchants): what joining payments with their merchant as of their
time costs (issue 46).

``--engine-memory`` runs the Python engine alone (no Spark), once per size on a topic of its own, and prints its
events/s and peak RSS side by side: whether its memory stays flat as the log grows. A larger size is copies of the
smallest's events, the same accounts going on (``--more-accounts``: each copy of accounts of its own, so the read
models grow as many times).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

from event_store import kafka_log
from event_store.account import AccountState
from event_store.decider import execute
from event_store.envelope import CommandEnvelope
from eventlake.generator import GeneratorConfig, generate_commands
from lakehouse.kafka_security import confluent_config, security_env
from lakehouse.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.workloads import decided, read_models_of, scratch_topics, workload  # noqa: E402

DOMAINS = ("accounts", "iot", "mixed")
# The event time the generated device and site streams end at: fixed, so the cached events are the same each run.
_DOMAIN_EVENTS_END = datetime(2026, 2, 1, tzinfo=timezone.utc)


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


def domain_events(domain: str, n: int, accounts: int, devices: int, cache: Path) -> list[tuple[bytes, bytes]]:
    """(key, value) of about ``n`` events of ``domain`` (``generated_events`` for accounts), made once by the
    pure command handler core from generated commands and cached; rejected commands make none."""
    if domain == "accounts":
        return generated_events(n, accounts, cache)
    path = cache / f"events-{domain}-{n}-{accounts}-{devices}.tsv"
    if path.exists():
        return [tuple(line.split(b"\t", 1)) for line in path.read_bytes().splitlines()]
    print(f"generating {n:,} {domain} events (once; cached in {path}) ...", flush=True)
    commands = workload(domain, int(n * 1.02), accounts=accounts, devices=devices, run_id="bench", seed=1,
                        late_rate=0.0, now=_DOMAIN_EVENTS_END)
    out = decided(commands.records)[0][:n]
    cache.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(k + b"\t" + v for k, v in out))
    return out


def domain_models(domain: str) -> list:
    """The read models the projection folds for ``domain``'s events (``bench.workloads.read_models_of``)."""
    return read_models_of(domain)


def publish(settings: Settings, records) -> float:
    """The events, keyed by account as the handler writes them (librdkafka: publishing is not what is measured)."""
    import confluent_kafka

    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = confluent_kafka.Producer({**confluent_config(settings), "enable.idempotence": True,
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


def timed_stream(settings: Settings, name: str, frame, sink: str) -> tuple[int, float]:
    """(rows, seconds) of one ``availableNow`` stream of ``frame`` into ``sink`` (``noop`` or ``delta``)."""
    path = settings.home / "limits" / name
    writer = (frame.writeStream.format(sink).trigger(availableNow=True)
              .option("checkpointLocation", str(path / "_checkpoint")))
    started = time.perf_counter()
    query = writer.start(str(path / "table")) if sink == "delta" else writer.start()
    query.awaitTermination()
    seconds = time.perf_counter() - started
    return sum(p.get("numInputRows", 0) for p in query.recentProgress), seconds


def unparsed_copy(spark, settings: Settings, max_offsets: int) -> tuple[int, float]:
    """The Kafka records appended to Delta as they are (no parsing): the least a Spark projection writes."""
    from spark_apps.events import read_event_records

    records = read_event_records(spark, settings, max_offsets)
    return timed_stream(settings, "copy", records.select("key", "value", "topic", "partition", "offset",
                                                         "timestamp"), "delta")


def source_limits(spark, settings: Settings, max_offsets: int) -> dict[str, float]:
    """Events/s of the Kafka source alone and of the source with the envelope parsing and checks."""
    from spark_apps.events import check_records, read_event_records

    out = {}
    for name, label, frame in (
            ("read", "Kafka source alone (noop sink)", read_event_records(spark, settings, max_offsets)),
            ("parse", "Kafka source + envelope parsing and checks (noop sink)",
             check_records(read_event_records(spark, settings, max_offsets)))):
        rows, seconds = timed_stream(settings, name, frame, "noop")
        out[label] = rows / seconds
    return out


class PeakRss:
    """The peak resident memory of this process and of its children (the Spark driver's JVM), sampled."""

    def __init__(self, every: float = 0.2):
        import psutil

        self._me, self._every, self._stop = psutil.Process(), every, threading.Event()
        self.python_mib = self.jvm_mib = 0.0
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import psutil

        while not self._stop.wait(self._every):
            try:
                self.python_mib = max(self.python_mib, self._me.memory_info().rss / 2**20)
                jvm = sum(c.memory_info().rss for c in self._me.children(recursive=True) if "java" in c.name())
                self.jvm_mib = max(self.jvm_mib, jvm / 2**20)
            except psutil.Error:
                pass

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()


def plain_consumer(settings: Settings, batch: int) -> dict:
    """bench/plain_consumer.py on the events topic, in a process of its own (its own GIL and memory)."""
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-m", "bench.plain_consumer", "--bootstrap", settings.bootstrap_servers,
                          "--topic", settings.events_topic, "--home", str(settings.home / "plain"),
                          "--batch", str(batch)], cwd=root, capture_output=True, text=True,
                         env={**os.environ, **security_env(settings)})
    if out.returncode:
        raise SystemExit(f"bench/plain_consumer.py failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def plain_agrees(settings: Settings) -> dict[str, bool]:
    """Whether the plain consumer's two tables hold the projection's rows (so the two did the same work)."""
    return tables_agree(settings, settings.home / "plain")


def python_engine(settings: Settings, models: list, max_offsets: int,
                  env_extra: dict[str, str] | None = None) -> dict:
    """``eventlake project --engine python --until-caught-up`` of ``models`` on the topic, in a process of its own
    (its own GIL and memory, ``env_extra`` added to its environment) with tables and checkpoints of its own: events, seconds (its run, as it reports it:
    from its start, tables created, to caught up; the interpreter's start and imports are in ``wall_seconds``),
    batches, batches handed to Spark, peak RSS and the time by step."""
    import re

    import psutil

    from python_engine.run import MAX_BATCH_RECORDS

    root = Path(__file__).resolve().parent.parent
    home = settings.home / "python-engine"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTLAKE_")}
    env.update({**security_env(settings), "EVENTLAKE_HOME": str(home), "PYTHONPATH": str(root),
                "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "EVENTLAKE_TOPIC_PREFIX": settings.topic_prefix,
                "EVENTLAKE_MAX_OFFSETS_PER_TRIGGER": str(min(max_offsets, MAX_BATCH_RECORDS)), **(env_extra or {})})
    log = home / "project.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "eventlake.cli", "project", "--engine", "python",
                                 "--until-caught-up", *[m.name for m in models]], cwd=root, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    peak, peak_engine, peak_parser, watched = 0, 0, 0, psutil.Process(proc.pid)
    peak_anon = 0  # the engine process's RssAnon: its own memory, without the key index's mapped LMDB pages
    while proc.poll() is None:
        try:  # with its second parser process (large batches), if it started one
            engine_rss = watched.memory_info().rss
            parser_rss = sum(p.memory_info().rss for p in watched.children(recursive=True))
            peak_anon = max(peak_anon, rss_anon(proc.pid))
        except (psutil.Error, OSError):
            time.sleep(0.1)
            continue
        peak, peak_engine = max(peak, engine_rss + parser_rss), max(peak_engine, engine_rss)
        peak_parser = max(peak_parser, parser_rss)
        time.sleep(0.1)
    wall = time.monotonic() - started
    text = log.read_text(errors="replace")
    caught_up = re.search(r"^projection: caught up: (\d+) events in (\d+) batches, ([\d.]+)s", text, re.MULTILINE)
    if proc.returncode or not caught_up:
        raise SystemExit(f"bench: eventlake project --engine python failed (exit {proc.returncode}):\n{text[-3000:]}")
    done = re.findall(r"^projection-[^:]*: batch \d+ done in [\d.]+s \((\d+) records(?:; (.*))?\)$", text, re.MULTILINE)
    steps: dict[str, float] = {}
    for _, parts in done:
        for part in (parts or "").split("; "):
            name, _, value = part.rpartition(" ")
            if name and value.endswith("s"):
                steps[name] = steps.get(name, 0.0) + float(value[:-1])
    two = re.search(r"(\d+) parsed by two processes", text)
    return {"events": int(caught_up[1]), "seconds": float(caught_up[3]), "wall_seconds": wall, "batches": len(done),
            "handed_to_spark": text.count("goes to the Spark engine"), "parsed_by_two": int(two[1]) if two else 0,
            "peak_rss_mib": peak / 2**20, "engine_peak_rss_mib": peak_engine / 2**20,
            "parser_peak_rss_mib": peak_parser / 2**20, "engine_peak_anon_mib": peak_anon / 2**20, "steps": steps,
            "home": str(home)}


def rss_anon(pid: int) -> int:
    """A process's RssAnon in bytes (/proc/PID/status): its heap and stacks, not the files it maps."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


def rss_parts(engine: dict) -> str:
    """The peaks of the engine's process (its RssAnon: without the mapped pages of its key index) and of its second
    parser, each on its own (the total's parts may peak at different times)."""
    anon = f" (RssAnon {engine['engine_peak_anon_mib']:,.0f})" if "engine_peak_anon_mib" in engine else ""
    return (f"the engine's process {engine['engine_peak_rss_mib']:,.0f}{anon}, its second parser "
            f"{engine['parser_peak_rss_mib']:,.0f} at their peaks")


def tables_agree(settings: Settings, other_home: Path) -> dict[str, bool]:
    """Whether the tables under ``other_home`` hold the Spark projection's rows."""
    from deltalake import DeltaTable

    out = {}
    for table, key in (("account_summary", ["account_id"]), ("payments", ["account_id", "payment_id"])):
        frames = [DeltaTable(str(path)).to_pandas() for path in (settings.table_path(table), other_home / table)]
        columns = sorted(set(frames[0].columns) & set(frames[1].columns))
        a, b = (f[columns].sort_values(key).reset_index(drop=True) for f in frames)
        out[table] = len(a) == len(b) and a.astype(str).equals(b.astype(str))
    return out


def measure(spark, base: Settings, domain: str, records, models: list, args, say) -> dict:
    """One domain's figures on a topic of its own: the archive append, the projection, the plain consumer (accounts
    only) and the unparsed copy, after a warm-up on another topic. The topics and tables are deleted after."""
    run = uuid.uuid4().hex[:8]
    home = base.home / "bench" / run
    try:
        with scratch_topics(base.replace(topic_prefix=f"bench-projection-{run}.", home=home)) as settings:
            return measure_on(spark, settings, domain, records, models, args, say)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def measure_on(spark, settings: Settings, domain: str, records, models: list, args, say) -> dict:
    from spark_apps.projection import Projection

    home = settings.home
    produce_rate = publish(settings, records)
    say(f"published {len(records):,} events to {settings.events_topic}: {produce_rate:,.0f} events/s", flush=True)
    if args.warmup:
        # The JVM's first batches run slower (class loading, JIT): warm up on a topic of its own, so that
        # neither measured run pays for it.
        warm = settings.replace(topic_prefix=settings.topic_prefix + "warmup.", home=home / "warmup")
        publish(warm, records[:args.warmup])
        raw_append(spark, warm, args.max_offsets)
        Projection(spark, warm, models, log=lambda *_: None).run_until_caught_up(
            max_offsets_per_trigger=args.max_offsets)
        say(f"warmed up on {args.warmup:,} events", flush=True)
    raw = raw_append(spark, settings, args.max_offsets)
    ceiling = raw.input_rows / raw.seconds
    say(f"archive append (no dedup; the event_archive query): {raw.input_rows:,} events in "
        f"{raw.seconds:.1f}s = {ceiling:,.0f} events/s ({raw.batches} batches)", flush=True)
    projection = Projection(spark, settings, models, log=lambda *_: None)
    with PeakRss() as rss:
        result = projection.run_until_caught_up(max_offsets_per_trigger=args.max_offsets)
    rate = result.input_rows / result.seconds
    say(f"projection {' + '.join(m.name for m in models)}: {result.input_rows:,} events in {result.seconds:.1f}s = "
        f"{rate:,.0f} events/s ({result.batches} batches); driver peak RSS: JVM {rss.jvm_mib:,.0f} MiB, "
        f"Python {rss.python_mib:,.0f} MiB", flush=True)
    plain = None
    if domain == "accounts":
        plain = plain_consumer(settings, args.plain_batch or args.max_offsets)
        plain_rate = plain["events"] / plain["seconds"]
        say(f"plain Python consumer (confluent-kafka, json, delta-rs MERGE, no exactly-once bookkeeping): "
            f"{plain['events']:,} events in {plain['seconds']:.1f}s = {plain_rate:,.0f} events/s "
            f"({plain['batches']} batches); peak RSS {plain['peak_rss_mib']:,.0f} MiB; rows {plain['rows']}",
            flush=True)
        plain["agrees"] = plain_agrees(settings)
        say(f"plain consumer's tables hold the projection's rows: {plain['agrees']}")
        say("plain consumer time by step (s): " + ", ".join(f"{k} {v:.1f}" for k, v in plain["steps"].items()))
    else:
        say("plain Python consumer: not run (bench/plain_consumer.py folds account events only)")
    engine = None
    if "python" in args.engines:
        engine = python_engine(settings, models, args.max_offsets)
        engine_rate = engine["events"] / engine["seconds"]
        say(f"projection, Python engine (eventlake project --engine python, own process): {engine['events']:,} "
            f"events in {engine['seconds']:.1f}s = {engine_rate:,.0f} events/s ({engine['wall_seconds']:.1f}s with the "
            f"interpreter's start; {engine['batches']} batches, "
            f"{engine['handed_to_spark']} handed to Spark, {engine['parsed_by_two']} parsed by two processes); "
            f"peak RSS {engine['peak_rss_mib']:,.0f} MiB ({rss_parts(engine)})", flush=True)
        if domain == "accounts":
            engine["agrees"] = tables_agree(settings, Path(engine["home"]) / "warehouse")
            say(f"Python engine's tables hold the Spark projection's rows: {engine['agrees']}")
        say("Python engine time by step (s): " + ", ".join(
            f"{k} {v:.1f}" for k, v in sorted(engine["steps"].items(), key=lambda i: -i[1])[:12]))
    copied, copy_seconds = unparsed_copy(spark, settings, args.max_offsets)
    copy_rate = copied / copy_seconds
    say(f"Kafka records appended to Delta unparsed: {copied:,} events in {copy_seconds:.1f}s = "
        f"{copy_rate:,.0f} events/s", flush=True)
    to_plain = f"to the plain consumer {rate / plain_rate:.2f} (aim >= 1.5), " if plain else ""
    say(f"projection's events/s as a ratio: {to_plain}to the unparsed copy {rate / copy_rate:.2f} (aim >= 0.5), "
        f"to the archive append {rate / ceiling:.2f}")
    if engine:
        to_plain = f"to the plain consumer {engine_rate / plain_rate:.2f} (aim >= 1.5), " if plain else ""
        say(f"Python engine's events/s as a ratio: {to_plain}to the unparsed copy {engine_rate / copy_rate:.2f} "
            f"(aim >= 0.5), to the archive append {engine_rate / ceiling:.2f}, to the Spark projection "
            f"{engine_rate / rate:.2f}")
    say("per batch (ms) archive append: " + ", ".join(str(ms) for ms in raw.batch_ms))
    say("per batch (ms) projection:     " + ", ".join(str(ms) for ms in result.batch_ms))
    say("projection time by step (s): " + ", ".join(f"{k} {v:.1f}" for k, v in result.step_seconds.items()))
    limits = source_limits(spark, settings, args.max_offsets) if args.limits else {}
    for name, limit in limits.items():
        say(f"limit: {name}: {limit:,.0f} events/s")
    figures = {
        "domain": domain, "events": len(records), "max_offsets": args.max_offsets,
        "models": [m.name for m in models],
        "archive": {"events": raw.input_rows, "seconds": raw.seconds, "batches": raw.batches},
        "projection": {"events": result.input_rows, "seconds": result.seconds, "batches": result.batches,
                       "steps": result.step_seconds, "jvm_peak_rss_mib": rss.jvm_mib,
                       "python_peak_rss_mib": rss.python_mib},
        "plain": plain, "python_engine": engine, "copy": {"events": copied, "seconds": copy_seconds},
        "limits": limits}
    from delta.tables import DeltaTable

    from read_models.catalog import Catalog

    catalog = Catalog(settings)
    for model in models:
        last = DeltaTable.forPath(spark, str(catalog.current(model.name).table)).history(1).collect()[0]
        metrics = {k: v for k, v in (last["operationMetrics"] or {}).items() if k.endswith("TimeMs")}
        say(f"last {last['operation']} into {model.name} (ms): {metrics}")
    return figures


def relabeled_copies(records: list[tuple[bytes, bytes]], copies: int) -> list[tuple[bytes, bytes]]:
    """``copies`` copies of generated account events one after the other, each of accounts, payment ids and event
    ids of its own (copy k > 0: ``acc-bench-`` -> ``acc-bench<k>-``, ``pay-bench-`` -> ``pay-bench<k>-``, ``c<k>-``
    before the event id): a log ``copies`` times as long, with as many times the accounts, made in seconds (the
    pure core took over 15 GB and many minutes towards 5M events of 20,000 accounts)."""
    out = list(records)
    for k in range(1, copies):
        tag, pay, prefix = f"acc-bench{k}-".encode(), f"pay-bench{k}-".encode(), f"c{k}-".encode()
        for key, value in records:
            value = value.replace(b"acc-bench-", tag).replace(b"pay-bench-", pay)
            at = value.index(b'"event_id":"') + 12
            out.append((key.replace(b"acc-bench-", tag), value[:at] + prefix + value[at:]))
    return out


_VERSION = b'"aggregate_version":'


def continued_copies(records: list[tuple[bytes, bytes]], copies: int) -> list[tuple[bytes, bytes]]:
    """``copies`` copies of generated account events one after the other, the same accounts going on: copy k > 0
    leaves out each account's ``AccountOpened`` and continues its versions after the copy before (version v of an
    account whose last version in the original is m becomes v + k * (m - 1)), with payment ids and event ids of its
    own (``pay-bench<k>-``, ``c<k>-`` before the event id). A log ``copies`` times as long with the same accounts
    (each read model as large as after the original), made in seconds."""
    def version_at(value: bytes) -> tuple[int, int]:
        at = value.index(_VERSION) + len(_VERSION)
        end = at
        while value[end:end + 1].isdigit():
            end += 1
        return at, end

    last: dict[bytes, int] = {}
    for key, value in records:
        at, end = version_at(value)
        last[key] = max(last.get(key, 0), int(value[at:end]))
    out = list(records)
    for k in range(1, copies):
        pay, prefix = f"pay-bench{k}-".encode(), f"c{k}-".encode()
        for key, value in records:
            if b'"event_type":"AccountOpened"' in value:
                continue
            at, end = version_at(value)
            value = (value[:at] + str(int(value[at:end]) + k * (last[key] - 1)).encode() + value[end:]
                     ).replace(b"pay-bench-", pay)
            at = value.index(b'"event_id":"') + 12
            out.append((key, value[:at] + prefix + value[at:]))
    return out


def engine_memory(base: Settings, sizes: list[int], accounts: int, max_offsets: int,
                  more_accounts: bool = False) -> list[dict]:
    """The Python engine alone (no Spark session) catching up on generated account events, once per size, each on
    a topic of its own: events/s and peak RSS, to see whether its memory stays flat as the log grows. A size that
    is a multiple of the smallest is made of copies of the smallest's events: the same accounts going on
    (``continued_copies``), or with ``more_accounts`` each copy of accounts of its own (``relabeled_copies``: the
    read models grow with the log)."""
    models = domain_models("accounts")
    runs = []
    smallest = min(sizes)
    for size in sizes:
        if size > smallest and size % smallest == 0:
            copies = size // smallest
            made = relabeled_copies if more_accounts else continued_copies
            records = made(generated_events(smallest, accounts, base.cache_dir / "bench"), copies)
            print(f"{size:,} events: {copies} copies of the {smallest:,} events of {accounts:,} accounts ("
                  + (f"each of accounts of its own: {copies * accounts:,} accounts)" if more_accounts else
                     "the same accounts going on)"), flush=True)
        else:
            records = generated_events(size, accounts, base.cache_dir / "bench")
        run = uuid.uuid4().hex[:8]
        settings = base.replace(topic_prefix=f"bench-memory-{run}.", home=base.home / "bench" / run)
        with scratch_topics(settings):
            produce_rate = publish(settings, records)
            del records
            engine = python_engine(settings, models, max_offsets)
        rate = engine["events"] / engine["seconds"]
        print(f"{engine['events']:,} events (published at {produce_rate:,.0f}/s): Python engine {rate:,.0f} "
              f"events/s, {engine['batches']} batches, peak RSS {engine['peak_rss_mib']:,.0f} MiB "
              f"({rss_parts(engine)})", flush=True)
        runs.append({"events": engine["events"], "events_per_s": rate, "peak_rss_mib": engine["peak_rss_mib"],
                     "engine_peak_rss_mib": engine["engine_peak_rss_mib"],
                     "engine_peak_anon_mib": engine["engine_peak_anon_mib"],
                     "parser_peak_rss_mib": engine["parser_peak_rss_mib"], "batches": engine["batches"]})
        shutil.rmtree(settings.home, ignore_errors=True)
    first, last = runs[0], runs[-1]
    print(f"peak RSS from {first['events']:,} to {last['events']:,} events: {first['peak_rss_mib']:,.0f} -> "
          f"{last['peak_rss_mib']:,.0f} MiB ({last['peak_rss_mib'] / first['peak_rss_mib']:.2f}x for "
          f"{last['events'] / first['events']:.0f}x the events); the engine's process alone "
          f"{first['engine_peak_rss_mib']:,.0f} -> {last['engine_peak_rss_mib']:,.0f} MiB (RssAnon "
          f"{first['engine_peak_anon_mib']:,.0f} -> {last['engine_peak_anon_mib']:,.0f} MiB: "
          f"{last['engine_peak_anon_mib'] / first['engine_peak_anon_mib']:.2f}x), its second parser "
          f"{first['parser_peak_rss_mib']:,.0f} -> {last['parser_peak_rss_mib']:,.0f} MiB")
    return runs


def sealed_events(records: list[tuple[bytes, bytes]], keys_home: Path) -> list[tuple[bytes, bytes]]:
    """``records`` with their personal fields sealed as the handler seals them (``event_store.sealing.Sealer``),
    under a key per customer made in the key store of ``keys_home`` (the engine's home)."""
    from event_store.envelope import dumps
    from event_store.personal_data import SubjectKeys, keys_dir, seal_payload
    from event_store.sealing import personal_event_fields

    keys = SubjectKeys(keys_dir(keys_home))
    personal = personal_event_fields()
    customers: dict[str, str] = {}
    out = []
    for key, value in records:
        event = json.loads(value)
        payload = event["payload"]
        if event["event_type"] == "AccountOpened":
            customers[event["aggregate_id"]] = payload["customer_id"]
        fields = personal.get(event["event_type"])
        if fields and any(payload.get(f) is not None for f in fields):
            event["payload"] = seal_payload(keys, customers[event["aggregate_id"]], payload, fields)
            value = dumps(event)
        out.append((key, value))
    return out


def alternated(base: Settings, events: int, accounts: int, max_offsets: int, repeat: int, setting: str,
               values: list[str], prepare, models: list | None = None) -> list[dict]:
    """The Python engine alone on the same account events once per value of ``setting`` (e.g. sealing "off",
    "on"), alternated ``repeat`` times, each run on a topic and home of its own: events/s side by side.
    ``prepare(value, settings, records)`` -> (the records to publish, the engine's extra environment), run before
    the engine (it may write into the engine's home, ``settings.home / "python-engine"``)."""
    models = models or domain_models("accounts")
    plain = generated_events(events, accounts, base.cache_dir / "bench")
    runs = []
    for round_ in range(repeat):
        for value in values:
            run = uuid.uuid4().hex[:8]
            settings = base.replace(topic_prefix=f"bench-{setting}-{run}.", home=base.home / "bench" / run)
            records, env_extra = prepare(value, settings, plain)
            with scratch_topics(settings):
                publish(settings, records)
                engine = python_engine(settings, models, max_offsets, env_extra=env_extra)
            rate = engine["events"] / engine["seconds"]
            runs.append({setting: value, "round": round_ + 1, "events": engine["events"], "events_per_s": rate,
                         "batches": engine["batches"], "steps": engine["steps"]})
            steps = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in
                              sorted(engine["steps"].items(), key=lambda kv: -kv[1])[:6])
            print(f"round {round_ + 1}, {setting} {value}: {engine['events']:,} events, Python engine {rate:,.0f} "
                  f"events/s, {engine['batches']} batches, peak RSS {engine['peak_rss_mib']:,.0f} MiB; its "
                  f"steps: {steps}", flush=True)
            shutil.rmtree(settings.home, ignore_errors=True)
    best = {v: max(r["events_per_s"] for r in runs if r[setting] == v) for v in values}
    if "off" in best and "on" in best:
        print(f"side by side (best of {repeat}): off {best['off']:,.0f} events/s, on {best['on']:,.0f} events/s: "
              f"{best['on'] / best['off']:.2f}x")
    return runs


def sealing_cost(base: Settings, events: int, accounts: int, max_offsets: int, repeat: int,
                 settings_of: list[str]) -> list[dict]:
    """The Python engine on the account events plain and sealed (``settings_of``: "off", "on"): what unsealing
    costs the projection (issue 45)."""
    def prepare(sealing, settings, plain):
        records = sealed_events(plain, settings.home / "python-engine") if sealing == "on" else plain
        return records, {"EVENTLAKE_PERSONAL_DATA_SEAL": sealing}

    return alternated(base, events, accounts, max_offsets, repeat, "sealing", settings_of, prepare)


def merchants_cost(base: Settings, events: int, accounts: int, max_offsets: int, repeat: int,
                   settings_of: list[str]) -> list[dict]:
    """The Python engine on the account events without and with ``dim_merchant`` (the generator's merchants,
    loaded by ``reference_data.loads.load_merchants`` into the engine's home first: every payment joined with its
    merchant as of its time): what the as-of join costs the projection (issue 46 part 2)."""
    from reference_data.loads import load_merchants
    from reference_data.samples import write_sample_merchants

    def prepare(merchants, settings, plain):
        if merchants == "on":
            home = settings.replace(home=settings.home / "python-engine")
            landed = write_sample_merchants(settings.home / "merchants.csv", GeneratorConfig().merchants)
            load_merchants(home, str(landed), full=True)
        return plain, {}

    return alternated(base, events, accounts, max_offsets, repeat, "merchants", settings_of, prepare)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--accounts", type=int, default=20_000)
    parser.add_argument("--domain", nargs="+", choices=[*DOMAINS, "all"], default=["accounts"],
                        help="whose events (all: the three, side by side)")
    parser.add_argument("--devices", type=int, default=2000, help="devices of the iot (a third: mixed) events")
    parser.add_argument("--max-offsets", type=int, default=1_000_000, help="maxOffsetsPerTrigger of both runs")
    parser.add_argument("--warmup", type=int, default=100_000, help="events of an unmeasured warm-up run of both")
    parser.add_argument("--plain-batch", type=int, default=None,
                        help="events per batch of the plain consumer (default: --max-offsets)")
    parser.add_argument("--limits", action="store_true",
                        help="also time the Kafka source alone and the parsing alone")
    parser.add_argument("--json", type=Path, help="also write the figures to this file (bench/report.py reads it)")
    parser.add_argument("--engines", nargs="+", choices=["spark", "python"], default=["spark", "python"],
                        help="the projection's engines to run (spark always runs: the others are compared with it)")
    parser.add_argument("--engine-memory", type=int, nargs="+", metavar="EVENTS",
                        help="instead: the Python engine alone on this many account events, once per size (its "
                             "events/s and peak RSS side by side)")
    parser.add_argument("--more-accounts", action="store_true",
                        help="with --engine-memory: a larger size's copies each of accounts of their own (the read "
                             "models grow with the log), not the same accounts going on")
    parser.add_argument("--sealing", nargs="+", choices=["off", "on"],
                        help="instead: the Python engine alone on the account events plain and sealed, side by side")
    parser.add_argument("--merchants", nargs="+", choices=["off", "on"],
                        help="instead: the Python engine alone on the account events without and with dim_merchant "
                             "(the as-of join), side by side")
    parser.add_argument("--repeat", type=int, default=2,
                        help="with --sealing or --merchants: runs of each setting, alternated")
    args = parser.parse_args()
    domains = [d for d in DOMAINS if d in args.domain or "all" in args.domain]
    for setting, cost in (("sealing", sealing_cost), ("merchants", merchants_cost)):
        if getattr(args, setting):
            base = Settings.load(role="admin")
            if base.uses_local_kafka:
                from infra import kafka
                kafka.up(base)
            runs = cost(base, args.events, args.accounts, args.max_offsets, args.repeat, getattr(args, setting))
            if args.json:
                args.json.write_text(json.dumps({setting: runs}))
            return 0
    if args.engine_memory:
        base = Settings.load(role="admin")
        if base.uses_local_kafka:
            from infra import kafka
            kafka.up(base)
        runs = engine_memory(base, args.engine_memory, args.accounts, args.max_offsets, args.more_accounts)
        if args.json:
            args.json.write_text(json.dumps({"engine_memory": runs}))
        return 0
    several = len(domains) > 1

    base = Settings.load(role="admin")
    if base.uses_local_kafka:
        from infra import kafka
        kafka.up(base)
    events = {d: domain_events(d, args.events, args.accounts, args.devices, base.cache_dir / "bench")
              for d in domains}

    from spark_apps.session import build_session

    # The session's own folders (spark-warehouse, derby, logs) go under a folder of this run, removed after.
    session_home = base.home / "bench" / f"session-{uuid.uuid4().hex[:8]}"
    spark = build_session(base.replace(home=session_home), app_name="eventlake-bench-projection")
    figures = {}
    for d in domains:
        def say(text: str, domain: str = d, **kwargs) -> None:
            print(f"{domain}: {text}" if several else text, **kwargs)

        figures[d] = measure(spark, base, d, events[d], domain_models(d), args, say)
    if several:
        rate = {d: f["projection"]["events"] / f["projection"]["seconds"] for d, f in figures.items()}
        copy = {d: f["copy"]["events"] / f["copy"]["seconds"] for d, f in figures.items()}
        base_rate = rate.get("accounts")
        print("side by side, projection events/s: " + " | ".join(
            f"{d} {r:,.0f}" + (f" ({r / base_rate:.2f}x accounts)" if base_rate and d != "accounts" else "")
            + f", {r / copy[d]:.2f} of its unparsed copy" for d, r in rate.items()))
    if args.json:
        args.json.write_text(json.dumps(figures[domains[0]] if not several else {"domains": figures}))
    spark.stop()
    shutil.rmtree(session_home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
