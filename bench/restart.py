"""Benchmark: how long a command handler takes to restart over a log of ~100k events, with and without snapshots.

Prints figures; it is not a test. Fills fresh topics with N generated commands (about one event each),
handles them once (snapshots every ``--snapshot-every`` events and on close), then times a cold start of a
new handler until it owns every partition and has caught up: once from the snapshots plus the tail after
them, once from the whole log (``use_snapshots=False``, what ``eventlake handler --no-snapshots`` does).

    .venv/bin/python bench/restart.py [--commands 100000] [--accounts 2000] [--snapshot-every 10000]
"""
from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

from event_store.client import EventStore
from event_store.handler import CommandHandler
from eventlake.generator import GeneratorConfig, generate_commands
from lakehouse.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.workloads import scratch_topics  # noqa: E402


# The same instance id throughout: a restart of one instance (a static group member takes its partitions back at
# once; a new id would first wait for the old member's session to time out).
def timed_start(settings: Settings, use_snapshots: bool) -> tuple[float, CommandHandler]:
    handler = CommandHandler(settings, instance_id="0", log=lambda *_: None, use_snapshots=use_snapshots)
    started = time.perf_counter()
    handler.start()
    handler.run(until_caught_up=True)  # returns once every assigned partition is rebuilt and caught up
    seconds = time.perf_counter() - started
    handler.settings = settings.replace(snapshot_every_events=0)  # leave the snapshots as they are
    handler.close()
    return seconds, handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=100_000)
    parser.add_argument("--accounts", type=int, default=2000)
    parser.add_argument("--snapshot-every", type=int, default=10_000)
    args = parser.parse_args(argv)
    run = uuid.uuid4().hex[:8]
    settings = Settings.load(role="admin").replace(topic_prefix=f"bench-restart-{run}.",
                                                   handler_group_id=f"bench-restart-{run}",
                                                   snapshot_every_events=args.snapshot_every)
    if settings.uses_local_kafka:
        from infra import kafka
        kafka.up(settings, log=lambda *_: None)
    with scratch_topics(settings):
        with EventStore(settings) as store:
            sent = store.send_raw(generate_commands(GeneratorConfig(accounts=args.accounts, commands=args.commands,
                                                                    run_id=run)))
        print(f"restart bench: {sent} commands for {args.accounts} accounts on {settings.topic_prefix}*")
        started = time.perf_counter()
        with CommandHandler(settings, instance_id="0", log=lambda *_: None) as handler:
            stats = handler.run(until_caught_up=True)
        print(f"filled the log: {stats.line()} in {time.perf_counter() - started:.0f}s, "
              f"{stats.snapshots} partition snapshots written")
        for use_snapshots in (True, False):
            seconds, handler = timed_start(settings, use_snapshots)
            events = sum(r.events_read for r in handler.rebuilds)
            results = sum(r.results_read for r in handler.rebuilds)
            rebuild = sum(r.seconds for r in handler.rebuilds)
            label = "with snapshots   " if use_snapshots else "without snapshots"
            print(f"restart {label}: {seconds:5.2f}s to ready ({rebuild:5.2f}s rebuilding "
                  f"{len(handler.rebuilds)} partitions: {events:,} events + {results:,} results read after the "
                  f"{'snapshot' if use_snapshots else 'start of the log'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
