"""How long a handler's partition snapshot holds up its command loop: written at once, and in steps.

Prints figures; it is not a test. The handler takes no command while it writes a snapshot (its transactions go
one at a time through one producer), so the longest write is a pause every command then waiting sees. A
snapshot holds the partition's whole state, which grows with the log: each account's payment ids and the
partition's event ids (a quarter of them new since the snapshot before). For each age asked for (``--minutes``
of the freshness benchmark's load at its defaults, as its handler logged it over thirty minutes: 6.9M events and
3.5M payments over 2,000 accounts and three partitions in 30.6 minutes, the FlagFraud commands of its detector
included) one partition's state of that size is built in memory and snapshotted to a fresh topic on the
configured broker (the local one, started if needed), alternately two ways: at once (the whole snapshot in one
transaction, then its manifest: how the handler wrote it before, and how it still writes its closing snapshots)
and in steps of
``event_store.snapshots.STEP_BYTES`` (how it writes them while running). Each time is the loop's pause: the
records encoded, produced and committed.

    .venv/bin/python bench/snapshot_steps.py [--minutes 10 30 60] [--repeat 2]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import confluent_kafka  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from immutables import Map  # noqa: E402

from event_store.account.aggregate import AccountState  # noqa: E402
from event_store.envelope import CommandResult  # noqa: E402
from event_store.kafka_clients import confluent_config  # noqa: E402
from event_store.snapshots import STEP_BYTES, PartitionState, SnapshotWriter, snapshot_records  # noqa: E402
from lakehouse.settings import Settings  # noqa: E402

ACCOUNTS = 2000 // 3  # one partition's share
PAYMENTS_PER_MINUTE = 3_528_000 / 2000 / 30.6  # per account
IDS_PER_MINUTE = 6_949_000 / 3 / 30.6  # a partition's events


def partition_after(minutes: float) -> PartitionState:
    """One partition's state after ``minutes`` of the freshness benchmark's load."""
    part = PartitionState(0)
    payments = int(PAYMENTS_PER_MINUTE * minutes)
    for a in range(ACCOUNTS):
        aid = f"acct-{a:06d}"
        part.states[("account", aid)] = AccountState(
            aid, version=payments + 1, opened=True, customer_id=f"cust-{a}", currency="EUR",
            credit_limit_minor=10 ** 9, payment_ids=Map((str(uuid.uuid4()), None) for _ in range(payments)))
        for i in range(100):
            part.remember(CommandResult(str(uuid.uuid4()), aid, "accepted", i + 1, (str(uuid.uuid4()),),
                                        recorded_at="2026-11-27T10:00:00.000000Z"))
    ids = [str(uuid.uuid4()) for _ in range(int(IDS_PER_MINUTE * minutes))]
    saved = len(ids) * 3 // 4
    part.event_ids.load(ids[:saved])
    part.event_ids.update(ids[saved:])
    return part


def write(producer, topic: str, part: PartitionState, budget: int | None) -> list[float]:
    """Write one snapshot of ``part``; the seconds of each step (each a transaction)."""
    unsaved = list(part.event_ids.unsaved)
    writer = SnapshotWriter(part)
    steps = []
    while not writer.done:
        started = time.perf_counter()
        producer.begin_transaction()
        for key, value in writer.step(budget):
            producer.produce(topic, value, key, partition=0, on_delivery=writer.on_delivery)
        producer.commit_transaction(30)
        steps.append(time.perf_counter() - started)
        if not writer.step_written():
            raise RuntimeError("a delivery report is missing")
    part.snapshot_written(writer)
    part.event_ids.unsaved[:] = unsaved  # the next write of this state writes the same ids again
    return steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, nargs="+", default=[10, 30, 60])
    ap.add_argument("--repeat", type=int, default=2, help="snapshots per way and age, alternating")
    args = ap.parse_args()
    settings = Settings.load(role="admin")
    if settings.uses_local_kafka:
        from infra import kafka
        kafka.up(settings, log=lambda *_: None)
    admin = AdminClient(confluent_config(settings))
    topic = f"bench-snapshot-steps-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[topic].result(30)
    producer = confluent_kafka.Producer({
        **confluent_config(settings), "transactional.id": f"{topic}-writer", "enable.idempotence": True,
        "acks": "all", "linger.ms": 20, "batch.size": 1024 * 1024, "message.max.bytes": 1_000_000,
        "queue.buffering.max.messages": 1_000_000})
    producer.init_transactions(60)
    print(f"one partition: {ACCOUNTS} accounts, 100 results each; steps of {STEP_BYTES / 2 ** 20:.0f} MiB; "
          f"broker {settings.bootstrap_servers}; topic {topic}")
    print(f"{'minutes':>7} {'payment ids':>11} {'event ids':>9} {'MB':>5} | {'at once: pause':>14} | "
          f"{'in steps: longest':>17} {'median':>7} {'steps':>5} {'total':>6} | ratio")
    try:
        for minutes in args.minutes:
            part = partition_after(minutes)
            at_once, stepped, counts, totals, every_step = [], [], [], [], []
            for _ in range(args.repeat):
                once = write(producer, topic, part, None)
                at_once.append(max(once))
                steps = write(producer, topic, part, STEP_BYTES)
                stepped.append(max(steps))
                counts.append(len(steps))
                totals.append(sum(steps))
                every_step += steps
            size = sum(len(k) + len(v) for k, v in snapshot_records(part)) / 1e6
            payment_ids = sum(len(s.payment_ids) for s in part.states.values())
            print(f"{minutes:7.0f} {payment_ids:11,} {len(part.event_ids):9,} {size:5.0f} | "
                  f"{statistics.median(at_once):13.2f}s | {statistics.median(stepped):16.3f}s "
                  f"{statistics.median(every_step):6.3f}s "
                  f"{statistics.median(counts):5.0f} {statistics.median(totals):5.2f}s | "
                  f"{statistics.median(at_once) / statistics.median(stepped):5.1f}x")
    finally:
        producer.flush(10)
        admin.delete_topics([topic])
    return 0


if __name__ == "__main__":
    sys.exit(main())
