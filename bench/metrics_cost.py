"""Benchmark: what serving metrics costs (issue 44's aim: within 0.95x), the same work with ``EVENTLAKE_METRICS=on``
and scraped every second (Prometheus' default interval is 15 s) against ``off``, alternated in one run.

- the command handler: ``bench/commands.py``'s drain (commands already on the topic, one ``eventlake handler``, its
  rate from the first committed result to the last), fresh topics each run;
- the projection: ``bench/projection.py``'s Python engine run (``eventlake project --engine python
  --until-caught-up`` over one preloaded log of account events), a fresh home each run; its events/s.

    .venv/bin/python bench/metrics_cost.py [--commands 60000] [--events 1000000] [--repeat 2]
                                           [--parts handler projection]

Prints each run, then the medians and the on/off ratio of each. Absolute figures move ±30% between runs on a
shared host; the ratio is what to read.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.commands import drain, fresh  # noqa: E402
from bench.projection import domain_models, generated_events, publish, python_engine  # noqa: E402
from bench.workloads import scratch_topics, workload  # noqa: E402
from lakehouse import metrics  # noqa: E402
from lakehouse.settings import Settings  # noqa: E402


@contextmanager
def scraped(home: Path, every_s: float = 1.0):
    """Scrape every service registered under ``home`` each ``every_s`` while the block runs; yields a dict whose
    ``scrapes`` counts the scrapes that answered."""
    settings = Settings.load({}).replace(home=home)
    done, counts = threading.Event(), {"scrapes": 0}

    def loop():
        while not done.wait(every_s):
            for target in metrics.local_targets(settings):
                try:
                    metrics.scrape(target.url)
                    counts["scrapes"] += 1
                except metrics.MetricsError:
                    pass

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield counts
    finally:
        done.set()
        thread.join()


def handler_rate(settings: Settings, records, log_dir: Path, state: str) -> tuple[float, int]:
    os.environ["EVENTLAKE_METRICS"] = state
    with fresh(settings, f"metrics-{state}") as scratch, scraped(scratch.home) as counts:
        result = drain(scratch, records, log_dir)
    if result["rate"] is None:
        raise SystemExit("bench: every command was answered with the first ones read: use more --commands")
    return result["rate"], counts["scrapes"]


def projection_rate(settings: Settings, models, state: str) -> tuple[float, int]:
    run = settings.replace(home=settings.home / f"metrics-{state}-{uuid.uuid4().hex[:6]}")
    with scraped(run.home / "python-engine") as counts:
        result = python_engine(run, models, 100_000, env_extra={"EVENTLAKE_METRICS": state})
    return result["events"] / result["seconds"], counts["scrapes"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=60_000, help="commands of each handler run")
    parser.add_argument("--events", type=int, default=1_000_000, help="events of the projection's log")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each state (on, off alternated)")
    parser.add_argument("--parts", nargs="+", choices=["handler", "projection"], default=["handler", "projection"])
    args = parser.parse_args(argv)
    settings = Settings.load(role="admin")
    if settings.uses_local_kafka:
        from infra import kafka
        kafka.up(settings, log=lambda *_: None)
    log_dir = settings.home / "bench"
    log_dir.mkdir(parents=True, exist_ok=True)
    rates: dict[str, dict[str, list[float]]] = {"handler": {"on": [], "off": []}, "projection": {"on": [], "off": []}}

    if "handler" in args.parts:
        commands = workload("accounts", args.commands, accounts=2000, run_id=uuid.uuid4().hex[:6]).records
        print(f"bench: the handler draining {len(commands):,} commands, metrics on (scraped every second) and off, "
              f"{args.repeat} runs each", flush=True)
    for i in range(args.repeat if "handler" in args.parts else 0):
        for state in (("on", "off") if i % 2 == 0 else ("off", "on")):
            rate, scrapes = handler_rate(settings, commands, log_dir, state)
            rates["handler"][state].append(rate)
            print(f"  handler, metrics {state}: {rate:,.0f} commands/s ({scrapes} scrapes)", flush=True)

    if "projection" in args.parts:
        projections(settings, args, rates["projection"])
    for what, unit in (("handler", "commands/s"), ("projection", "events/s")):
        if what in args.parts:
            on, off = statistics.median(rates[what]["on"]), statistics.median(rates[what]["off"])
            print(f"{what}: median {on:,.0f} {unit} with metrics on, {off:,.0f} off: on/off {on / off:.2f}x")
    return 0


def projections(settings: Settings, args, rates: dict[str, list[float]]) -> None:
    events = generated_events(args.events, 20_000, settings.cache_dir / "bench")
    models = domain_models("accounts")
    run = uuid.uuid4().hex[:8]
    base = settings.replace(topic_prefix=f"bench-metrics-{run}.", home=settings.home / "bench" / f"metrics-{run}")
    with scratch_topics(base) as topics:
        publish(topics, events)
        print(f"bench: the Python engine projecting {len(events):,} events, metrics on (scraped every second) "
              f"and off, {args.repeat} runs each", flush=True)
        for i in range(args.repeat):
            for state in (("on", "off") if i % 2 == 0 else ("off", "on")):
                rate, scrapes = projection_rate(topics, models, state)
                rates[state].append(rate)
                print(f"  projection, metrics {state}: {rate:,.0f} events/s ({scrapes} scrapes)", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
