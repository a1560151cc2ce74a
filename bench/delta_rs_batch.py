"""What a small live batch would cost projected with delta-rs instead of Spark: the floor of another design.

Prints figures; it is not a test. ``bench/batch_cost.py`` shows a 2,000-event batch of the Spark projection costs
~24 s on 2 cores, and the plain consumer of ``bench/projection.py`` shows delta-rs MERGEs are cheap. This measures,
without a JVM, one batch of ``--batch`` events into ``account_summary`` and ``payments`` (tables of ``--history``
events first) with the bookkeeping an exactly-once delta-rs path would need:

- each table's commit carries the batch's number as a Delta transaction identifier (``app_id`` = the projection,
  ``version`` = the batch): a batch re-run after a crash is skipped by a table that already committed it, the
  way Spark's ``txnAppId``/``txnVersion`` work; the offsets of the batch would be recorded before it runs, as
  Spark's offset log does;
- ``account_summary`` applies an account's changes only when they continue the row's version (first version of the
  batch = the row's version + 1), so a re-delivered event cannot count twice; ``payments`` inserts a key once.

Each batch is timed by step (JSON parse, fold, each MERGE), then the last batch is run again (the skip), and the
tables are compared with the read models' Python oracles over the same events. Events come from the cache of ``bench/projection.py`` (the pure
core's output, no Kafka: reading 2,000 events from Kafka costs ~10 ms, see the plain consumer's figures).
Not covered: the sequence gate's gaps inside a batch, ``merchant_minute_volume``, ``fraud_alerts``, quarantine.

    .venv/bin/python bench/delta_rs_batch.py [--history 200000] [--batch 2000] [--batches 10] [--accounts 20000]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.plain_consumer import _fold, _schemas
from bench.projection import generated_events
from lakehouse.settings import Settings

APP_ID = "bench-delta-rs-projection"


def apply_batch(summary_path: Path, payments_path: Path, number: int, raw: list[bytes]) -> dict[str, float] | None:
    """One batch into both tables, each commit carrying (APP_ID, number); None when both had it already."""
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, Transaction

    from read_models.account.account_summary import MERGE_INSERT, MERGE_UPDATE

    summary_schema, payments_schema = _schemas()
    source_schema = pa.schema([f for f in summary_schema if f.name != "available_minor"]
                              + [pa.field("first_version", pa.int64())])
    steps: dict[str, float] = {}
    t = time.perf_counter()
    summary_table, payments_table = DeltaTable(str(summary_path)), DeltaTable(str(payments_path))
    done = [table.transaction_version(APP_ID) or -1 for table in (summary_table, payments_table)]
    steps["open tables, read their transaction ids"] = time.perf_counter() - t
    if min(done) >= number:
        return None
    t = time.perf_counter()
    events = [json.loads(value) for value in raw]
    steps["JSON parse"] = time.perf_counter() - t
    t = time.perf_counter()
    summary_rows, payment_rows = _fold(events)
    summary = pa.Table.from_pylist(summary_rows, schema=source_schema)
    payments = pa.Table.from_pylist(payment_rows, schema=payments_schema)
    steps["fold"] = time.perf_counter() - t
    commit = CommitProperties(app_transactions=[Transaction(APP_ID, number)])
    if done[0] < number:
        t = time.perf_counter()
        (summary_table.merge(summary, predicate="t.account_id = s.account_id", source_alias="s", target_alias="t",
                             commit_properties=commit)
         .when_matched_update(updates=MERGE_UPDATE, predicate="s.first_version = t.version + 1")
         .when_not_matched_insert(updates=MERGE_INSERT, predicate="s.first_version = 1").execute())
        steps["MERGE account_summary"] = time.perf_counter() - t
    if done[1] < number:
        t = time.perf_counter()
        (payments_table.merge(payments, predicate="t.account_id = s.account_id AND t.payment_id = s.payment_id",
                              source_alias="s", target_alias="t", commit_properties=commit)
         .when_not_matched_insert_all().execute())
        steps["MERGE payments"] = time.perf_counter() - t
    return steps


def oracle_agrees(summary_path: Path, payments_path: Path, values: list[bytes]) -> dict[str, bool]:
    """Each table against its read model's Python oracle over the same events (every public column)."""
    from deltalake import DeltaTable

    from event_store.envelope import EventEnvelope
    from read_models.account import ACCOUNT_SUMMARY, PAYMENTS

    events = [EventEnvelope.from_json(value) for value in values]
    out = {}
    for model, path in ((ACCOUNT_SUMMARY, summary_path), (PAYMENTS, payments_path)):
        expected = model.python_fold(events)
        rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
        got = {tuple(row[k] for k in model.key): {k: v.replace(tzinfo=None) if hasattr(v, "tzinfo") else v
                                                  for k, v in row.items()} for row in rows}
        out[model.name] = got == expected
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--history", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--accounts", type=int, default=20_000)
    args = ap.parse_args()
    from deltalake import DeltaTable, write_deltalake

    base = Settings.load(role="admin")
    home = base.home / "bench" / f"delta-rs-{uuid.uuid4().hex[:8]}"
    records = generated_events(args.history + args.batch * args.batches, args.accounts, base.cache_dir / "bench")
    values = [value for _, value in records]
    summary_schema, payments_schema = _schemas()
    summary_path, payments_path = home / "account_summary", home / "payments"
    write_deltalake(str(summary_path), summary_schema.empty_table())
    write_deltalake(str(payments_path), payments_schema.empty_table())
    try:
        started = time.perf_counter()
        for number, at in enumerate(range(0, args.history, 100_000)):
            apply_batch(summary_path, payments_path, number, values[at:min(at + 100_000, args.history)])
        history_batches = number + 1
        print(f"history: {args.history:,} events in {history_batches} batches, "
              f"{time.perf_counter() - started:.1f}s", flush=True)
        walls, by_step = [], {}
        for i in range(args.batches):
            at = args.history + i * args.batch
            t = time.perf_counter()
            steps = apply_batch(summary_path, payments_path, history_batches + i, values[at:at + args.batch])
            walls.append(time.perf_counter() - t)
            for step, seconds in steps.items():
                by_step.setdefault(step, []).append(seconds)
            print(f"batch {history_batches + i}: {args.batch:,} events in {walls[-1]:.3f}s ("
                  + "; ".join(f"{k} {v:.3f}s" for k, v in steps.items()) + ")", flush=True)
        last = history_batches + args.batches - 1
        t = time.perf_counter()
        skipped = apply_batch(summary_path, payments_path, last, values[-args.batch:]) is None
        rerun = time.perf_counter() - t
        rows = {name: DeltaTable(str(path)).to_pyarrow_dataset().count_rows()
                for name, path in (("account_summary", summary_path), ("payments", payments_path))}
        print(f"\na batch of {args.batch:,} events on {rows['account_summary']:,} accounts and "
              f"{rows['payments']:,} payments, median of {args.batches}: {statistics.median(walls):.3f}s "
              f"(max {max(walls):.3f}s)")
        for step, seconds in by_step.items():
            print(f"  {step}: {statistics.median(seconds):.3f}s")
        print(f"the last batch again (as after a crash): {'skipped' if skipped else 'APPLIED AGAIN'} "
              f"in {rerun:.3f}s")
        print(f"the tables agree with the Python oracles: {oracle_agrees(summary_path, payments_path, values)}")
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
