"""Benchmark: accepted commands per second end to end (submit -> events committed), with 1 and 2 handlers.

Prints figures; it is not a test. Each run uses fresh topics on the configured broker (the local one by
default, started if needed). For each handler count it starts ``eventlake handler`` processes, waits until
they own every partition, then sends N generated commands through the client's bulk path and stops the clock
when the last command result is committed (results are written in the same transaction as the events). The
raw produce rates of the same records, measured first, are the ceilings: kafka-python (what ``submit`` uses)
and confluent-kafka (what the handler's producer and the client's bulk path use); the handler writes at least
two records (an event and a result) per command. "drain" preloads the commands and times one handler alone,
from its first committed result to its last, without the client competing for the CPU. The results are
counted with librdkafka, so the counting costs the handler little CPU.

    .venv/bin/python bench/commands.py [--commands 100000] [--accounts 2000] [--instances 1 2] [--repeat 1]
                                       [--no-raw] [--no-drain] [--domain accounts|iot|site|mixed|all ...]
                                       [--devices 200] [--sites 30] [--sealing off on]

With ``--repeat N`` each end-to-end run is made N times (fresh topics each time) and the median and range are
printed too: on a shared 2-core host single runs vary by ±20%.

``--domain`` picks the commands (``bench/workloads.py``): the card accounts (the default), the IoT devices
(``--devices`` of them, over as many minutes of event time as make about N commands), the sites' page views
(``--sites``: one aggregate per site, so each site's views go through one partition) or the three interleaved
(``mixed``). With several domains (``all`` is the four) every run is made for each domain in turn, on fresh
topics and with the same handler count, and the figures are printed side by side with each domain's ratio to
the accounts' commands/s.

``--sealing off on`` adds drain runs of the accounts' commands with ``personal_data_seal`` off and on, alternated
``--repeat`` times (issue 45's cost: the command path with personal data sealed within 0.9x of without).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from event_store import kafka_log
from event_store.client import EventStore
from event_store.envelope import CommandEnvelope
from lakehouse.kafka_security import confluent_config, security_env
from lakehouse.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.workloads import DOMAINS, Workload, scratch_topics, workload  # noqa: E402

EVENTLAKE = str(Path(sys.executable).parent / "eventlake")


def fresh(settings: Settings, tag: str):
    """A run on topics of its own, deleted when it ends (``with fresh(settings, tag) as s``)."""
    run = uuid.uuid4().hex[:8]
    return scratch_topics(settings.replace(topic_prefix=f"bench-{tag}-{run}.", handler_group_id=f"bench-handler-{run}"))


def raw_produce_rate(settings: Settings, records: list[tuple[str, bytes]]) -> float:
    """kafka-python alone: the same records to a scratch topic, idempotent, acks=all, no transaction."""
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = kafka_log.make_producer(settings)
    started = time.perf_counter()
    for key, value in records:
        producer.send(settings.commands_topic, key=key.encode(), value=value)
    producer.flush()
    seconds = time.perf_counter() - started
    producer.close()
    return len(records) / seconds


def raw_produce_rate_confluent(settings: Settings, records: list[tuple[str, bytes]]) -> float:
    """librdkafka alone (the handler's producer): same records, idempotent, acks=all, no transaction."""
    import confluent_kafka

    kafka_log.ensure_topics(settings, log=lambda *_: None)
    producer = confluent_kafka.Producer({**confluent_config(settings), "enable.idempotence": True,
                                         "acks": "all", "linger.ms": 20, "batch.size": 1024 * 1024,
                                         "queue.buffering.max.messages": 1_000_000})
    started = time.perf_counter()
    for key, value in records:
        producer.produce(settings.commands_topic, value, key.encode())
        producer.poll(0)
    producer.flush(120)
    return len(records) / (time.perf_counter() - started)


def results_reader(settings: Settings, at_end: bool):
    """A read_committed librdkafka consumer of the results topic, positioned now at its end (or beginning).
    The bench's own reading must not compete with the handler for the CPU: kafka-python's costs several times
    more per record."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer({**confluent_config(settings),
                                         "group.id": f"bench-count-{uuid.uuid4().hex[:8]}",
                                         "isolation.level": "read_committed", "enable.auto.commit": False})
    topic = settings.results_topic
    partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
    positions = []
    for p in partitions:
        low, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout=30)
        positions.append(confluent_kafka.TopicPartition(topic, p, high if at_end else low))
    consumer.assign(positions)
    return consumer


def count_committed(consumer, wanted: int, timeout_s: float) -> tuple[int, float | None, int]:
    """Consume committed records (without parsing them) until ``wanted`` have arrived: the count, when the
    first arrived and how many came with it."""
    seen, first_at, first_n = 0, None, 0
    deadline = time.monotonic() + timeout_s
    while seen < wanted and time.monotonic() < deadline:
        messages = consumer.consume(num_messages=50_000, timeout=0.2)
        seen += sum(1 for m in messages if m.error() is None)
        if first_at is None and seen:
            first_at, first_n = time.perf_counter(), seen
    return seen, first_at, first_n


def drain(settings: Settings, records: list[tuple[str, bytes]], log_dir: Path, sealing: str | None = None,
          home: Path | None = None) -> dict:
    """Commands already on the topic, then one handler: its rate from the first committed result to the last.
    ``sealing`` "on"/"off": the handler's ``personal_data_seal``, with its home (its subject keys) at ``home``."""
    env = {**os.environ, **security_env(settings), "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "EVENTLAKE_TOPIC_PREFIX": settings.topic_prefix, "EVENTLAKE_HANDLER_GROUP_ID": settings.handler_group_id,
           "EVENTLAKE_HANDLER_MAX_BATCH": os.environ.get("EVENTLAKE_HANDLER_MAX_BATCH", "5000")}
    if sealing is not None:
        env["EVENTLAKE_PERSONAL_DATA_SEAL"] = sealing
    if home is not None:
        env["EVENTLAKE_HOME"] = str(home)
    with EventStore(settings) as store:
        store.send_raw(records)
    consumer = results_reader(settings, at_end=False)
    with open(log_dir / f"handler-drain{'-seal-' + sealing if sealing else ''}.log", "w") as log:
        handler = subprocess.Popen([EVENTLAKE, "handler"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            seen, first_at, first_n = count_committed(consumer, len(records), timeout_s=600)
            seconds = time.perf_counter() - first_at
        finally:
            handler.terminate()
            handler.wait(60)
            consumer.close()
    # The rate counts what came after the first poll's results; when they all came with it there is no rate.
    return {"commands": seen, "rate": (seen - first_n) / seconds if seen > first_n else None}


def end_to_end(settings: Settings, records: list[tuple[str, bytes]], instances: int, log_dir: Path) -> dict:
    env = {**os.environ, **security_env(settings), "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "EVENTLAKE_TOPIC_PREFIX": settings.topic_prefix, "EVENTLAKE_HANDLER_GROUP_ID": settings.handler_group_id,
           "EVENTLAKE_HANDLER_MAX_BATCH": os.environ.get("EVENTLAKE_HANDLER_MAX_BATCH", "5000")}
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    logs = [open(log_dir / f"handler-{instances}-{i}.log", "w") for i in range(instances)]
    handlers = [subprocess.Popen([EVENTLAKE, "handler", "--instance-id", str(i)], env=env, stdout=log,
                                 stderr=subprocess.STDOUT) for i, log in enumerate(logs)]
    try:
        with EventStore(settings) as store:
            # Warm-up: one command per partition, answered once the handlers own every partition.
            warm = [CommandEnvelope.create("OpenAccount", f"warm-{i}", {"customer_id": "c", "credit_limit_minor": 1,
                                                                        "currency": "USD"}) for i in range(30)]
            store.submit_many(warm, wait=True, timeout_s=120)
            consumer = results_reader(settings, at_end=True)
            started = time.perf_counter()
            store.send_raw(records)
            sent = time.perf_counter() - started
            seen = count_committed(consumer, len(records), timeout_s=600)[0]
            seconds = time.perf_counter() - started
            consumer.close()
    finally:
        for h in handlers:
            h.terminate()
        for h in handlers:
            h.wait(60)
        for log in logs:
            log.close()
    return {"commands": seen, "seconds": seconds, "send_seconds": sent, "rate": seen / seconds}


def domains_of(names: list[str]) -> list[str]:
    """The domains asked for, in ``DOMAINS`` order, ``all`` being every one."""
    wanted = set(DOMAINS) if "all" in names else set(names)
    return [d for d in DOMAINS if d in wanted]


def side_by_side(label: str, rates: dict[str, list[float]]) -> str:
    """One line: each domain's median commands/s and its ratio to the accounts' (when measured)."""
    medians = {d: statistics.median(r) for d, r in rates.items() if r}
    base = medians.get("accounts")
    parts = [f"{d} {m:,.0f}" + (f" ({m / base:.2f}x accounts)" if base and d != "accounts" else "")
             for d, m in medians.items()]
    return f"side by side, {label}: " + " | ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=100_000)
    parser.add_argument("--accounts", type=int, default=2000)
    parser.add_argument("--domain", nargs="+", choices=[*DOMAINS, "all"], default=["accounts"],
                        help="whose commands (all: the four, side by side)")
    parser.add_argument("--devices", type=int, default=200, help="devices of the iot commands")
    parser.add_argument("--sites", type=int, default=30, help="sites of the site commands (one aggregate each)")
    parser.add_argument("--instances", type=int, nargs="*", default=[1, 2],
                        help="handler counts for the end-to-end runs (none: skip them)")
    parser.add_argument("--repeat", type=int, default=1, help="end-to-end runs per handler count (median, range)")
    parser.add_argument("--no-raw", action="store_true", help="skip the raw produce ceilings")
    parser.add_argument("--no-drain", action="store_true", help="skip the drain run")
    parser.add_argument("--sealing", nargs="+", choices=["off", "on"], default=[],
                        help="drain runs of the accounts' commands with personal_data_seal off and/or on, side by "
                             "side (--repeat times each; the first run with it on makes the customers' keys)")
    args = parser.parse_args(argv)
    domains = domains_of(args.domain)
    several = len(domains) > 1
    settings = Settings.load(role="admin")
    if settings.uses_local_kafka:
        from infra import kafka
        kafka.up(settings, log=lambda *_: None)
    run_id = uuid.uuid4().hex[:6]
    loads: dict[str, Workload] = {d: workload(d, args.commands, accounts=args.accounts, devices=args.devices,
                                              sites=args.sites, run_id=run_id) for d in domains}

    def say(domain: str, text: str, **kwargs) -> None:
        print(f"{domain}: {text}" if several else text, **kwargs)

    machine = (f"{settings.topic_partitions} partitions, broker {settings.bootstrap_servers}, "
               f"{os.cpu_count()} CPUs")
    if several:
        print(f"bench: {', '.join(domains)} on fresh topics each, {machine}")
    for d, load in loads.items():
        what = f"{len(load.records)} commands for {load.description} (mean {load.mean_bytes:.0f} bytes)"
        say(d, what if several else f"bench: {what}, {machine}")
    if not args.no_raw:
        for d, load in loads.items():
            with fresh(settings, "raw") as scratch:
                raw = raw_produce_rate(scratch, load.records)
            say(d, f"raw kafka-python produce: {raw:,.0f} records/s -> at most {raw / 2:,.0f} commands/s "
                   f"for a handler writing an event and a result per command with kafka-python")
            with fresh(settings, "rawck") as scratch:
                raw_ck = raw_produce_rate_confluent(scratch, load.records)
            say(d, f"raw confluent-kafka produce (the handler's producer): {raw_ck:,.0f} records/s -> at most "
                   f"{raw_ck / 2:,.0f} commands/s")
    log_dir = settings.home / "bench"
    log_dir.mkdir(parents=True, exist_ok=True)
    summary: list[str] = []
    for n in args.instances:
        rates: dict[str, list[float]] = {d: [] for d in domains}
        # Each repeat runs every domain in turn, so that the domains' runs share the host's load alike, and
        # starts one domain further on, so that no domain always runs first.
        for i in range(max(args.repeat, 1)):
            for d in domains[i % len(domains):] + domains[:i % len(domains)]:
                with fresh(settings, f"x{n}") as scratch:
                    r = end_to_end(scratch, loads[d].records, n, log_dir)
                rates[d].append(r["rate"])
                say(d, f"{n} handler instance(s): {r['commands']:,} commands accepted and committed in "
                       f"{r['seconds']:.1f}s = {r['rate']:,.0f} commands/s end to end (sending took "
                       f"{r['send_seconds']:.1f}s)", flush=True)
        if args.repeat > 1:
            for d in domains:
                say(d, f"{n} handler instance(s), {len(rates[d])} runs: median {statistics.median(rates[d]):,.0f} "
                       f"commands/s (range {min(rates[d]):,.0f}-{max(rates[d]):,.0f})", flush=True)
        summary.append(side_by_side(f"{n} handler instance(s), commands/s end to end"
                                    + (f" (median of {args.repeat} runs)" if args.repeat > 1 else ""), rates))
    if not args.no_drain:
        drained: dict[str, list[float]] = {}
        for d, load in loads.items():
            with fresh(settings, "drain") as scratch:
                r = drain(scratch, load.records, log_dir)
            if r["rate"] is None:
                drained[d] = []
                say(d, f"drain, 1 handler alone: {r['commands']:,} commands, all committed with the first ones "
                       f"read: no rate (use more commands than EVENTLAKE_HANDLER_MAX_BATCH)")
                continue
            drained[d] = [r["rate"]]
            say(d, f"drain, 1 handler alone: {r['commands']:,} commands at {r['rate']:,.0f} commands/s "
                   f"(first to last committed result)")
        summary.append(side_by_side("drain, 1 handler alone, commands/s", drained))
    if args.sealing:
        # The same commands, one handler alone, personal data sealed or not; each run's home keeps its subject
        # keys for the next (a customer's first sealed event makes its key: two fsyncs, the first run's cost).
        sealed: dict[str, list[float]] = {seal: [] for seal in args.sealing}
        homes = {seal: log_dir / f"home-{run_id}-seal-{seal}" for seal in args.sealing}
        for i in range(max(args.repeat, 1)):
            order = args.sealing[i % len(args.sealing):] + args.sealing[:i % len(args.sealing)]
            for seal in order:
                with fresh(settings, f"seal{seal}") as scratch:
                    r = drain(scratch, loads.get("accounts", next(iter(loads.values()))).records, log_dir,
                              sealing=seal, home=homes[seal])
                if r["rate"] is not None:
                    sealed[seal].append(r["rate"])
                print(f"drain, personal_data_seal={seal}, run {i + 1}: {r['commands']:,} commands at "
                      + (f"{r['rate']:,.0f} commands/s" if r["rate"] is not None else "no rate"), flush=True)
        medians = {seal: statistics.median(r) for seal, r in sealed.items() if r}
        line = " | ".join(f"{seal} {m:,.0f}" for seal, m in medians.items())
        if "on" in medians and "off" in medians:
            line += f" (on/off {medians['on'] / medians['off']:.2f}x; aim >= 0.9x)"
        summary.append(f"side by side, drain, 1 handler alone, personal_data_seal, median commands/s: {line}")
        print(summary[-1])
    if several:
        for line in summary:
            print(line)
    print(f"handler logs: {log_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
