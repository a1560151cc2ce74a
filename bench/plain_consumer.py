"""A plain Python consumer of the events topic, of the kind a user might write instead of the Spark projection.

Single-threaded: confluent-kafka reads a batch, ``json.loads`` parses each event, a Python loop folds the batch
into one row of changes per account and one row per payment, and delta-rs MERGEs them into ``account_summary``
and ``payments`` (the same schemas and the same MERGE expressions as the read models), then the consumer group's
offsets are committed. What it does not do, and the projection does: no dedup of a re-delivered event (a crash
between the MERGE and the offset commit applies a batch twice), no version order check, no poison-pill
quarantine, no watermark, no record of what it applied. It is the baseline ``bench/projection.py`` compares the
projection's throughput with; run on its own it prints one JSON line:

    .venv/bin/python -m bench.plain_consumer --bootstrap HOST:PORT --topic T --home DIR [--batch 1000000]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import time
from pathlib import Path

__all__ = ["consume"]


def _time(text: str | None) -> dt.datetime | None:
    return None if text is None else dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _schemas():
    """The pyarrow schemas of ``account_summary`` and ``payments``, from the read models' own definitions."""
    from read_models.account import ACCOUNT_SUMMARY, PAYMENTS
    from spark_apps.arrow_rows import arrow_schema

    return arrow_schema(ACCOUNT_SUMMARY.schema()), arrow_schema(PAYMENTS.schema())


def _fold(events: list[dict]) -> tuple[list[dict], list[dict]]:
    """A batch of parsed events -> (one row of changes per account, one row per payment)."""
    accounts: dict[str, dict] = {}
    payments: list[dict] = []
    for e in events:
        kind, p = e["event_type"], e["payload"]
        row = accounts.get(e["aggregate_id"])
        if row is None:
            row = accounts[e["aggregate_id"]] = {
                "account_id": e["aggregate_id"], "customer_id": None, "status": None, "credit_limit_minor": None,
                "currency": None, "payments_authorized": 0, "payments_declined": 0, "authorized_total_minor": 0,
                "last_device_location": None, "version": 0, "first_version": e["aggregate_version"],
                "updated_at": None, "customer_name": None, "customer_email": None}
        row["first_version"] = min(row["first_version"], e["aggregate_version"])
        if e["aggregate_version"] > row["version"]:
            row["version"], row["updated_at"] = e["aggregate_version"], _time(e["recorded_at"])
        if kind == "PaymentAuthorized" or kind == "PaymentDeclined":
            authorized = kind == "PaymentAuthorized"
            if authorized:
                row["payments_authorized"] += 1
                row["authorized_total_minor"] += p["amount_minor"]
            else:
                row["payments_declined"] += 1
            payments.append({
                "payment_id": p["payment_id"], "account_id": e["aggregate_id"], "merchant_id": p["merchant_id"],
                "amount_minor": p["amount_minor"], "currency": p["currency"], "location": p["location"],
                "merchant_country": p.get("merchant_country") if authorized else None,
                "status": "authorized" if authorized else "declined",
                "decline_reason": None if authorized else p.get("reason"),
                "occurred_at": _time(e["occurred_at"]), "event_id": e["event_id"]})
        elif kind == "AccountOpened":
            row.update(customer_id=p["customer_id"], credit_limit_minor=p["credit_limit_minor"],
                       currency=p["currency"], status="open", customer_name=p.get("customer_name"),
                       customer_email=p.get("customer_email"))
        elif kind == "AccountFrozen":
            row["status"] = "frozen"
        elif kind == "AccountUnfrozen":
            row["status"] = "open"
        elif kind == "DeviceLocationReported":
            row["last_device_location"] = p["location"]
    return list(accounts.values()), payments


def consume(bootstrap: str, topic: str, home: Path, batch: int) -> dict:
    """Everything on ``topic`` now, in batches of up to ``batch`` events, into two fresh tables under ``home``
    (connecting as the Kafka user the environment's settings give the admin role, with SASL on)."""
    import confluent_kafka
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from lakehouse.kafka_security import confluent_config
    from lakehouse.settings import Settings
    from read_models.account.account_summary import MERGE_INSERT, MERGE_UPDATE

    summary_schema, payments_schema = _schemas()
    summary_path, payments_path = home / "account_summary", home / "payments"
    write_deltalake(str(summary_path), summary_schema.empty_table(), mode="overwrite")
    write_deltalake(str(payments_path), payments_schema.empty_table(), mode="overwrite")
    # The fold's input columns (everything but available_minor, which the MERGE computes).
    # The account_summary MERGE's source as the read model's fold gives it: with its _forgotten flag (null here:
    # no subject is forgotten in the bench's events).
    source_schema = pa.schema([f for f in summary_schema if f.name != "available_minor"]
                              + [pa.field("_forgotten", pa.bool_())])

    connection = confluent_config(Settings.load(role="admin").replace(kafka_bootstrap_servers=bootstrap))
    consumer = confluent_kafka.Consumer({
        **connection, "group.id": f"plain-consumer-{home.name}", "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 16 * 1024 * 1024})
    metadata = consumer.list_topics(topic, timeout=30)
    partitions = sorted(metadata.topics[topic].partitions)
    end = {p: consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout=30)[1]
           for p in partitions}
    consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in partitions])
    position = {p: 0 for p in partitions}
    steps = {"Kafka read": 0.0, "JSON parse": 0.0, "fold": 0.0, "MERGE account_summary": 0.0,
             "MERGE payments": 0.0, "offset commit": 0.0}
    total = batches = 0
    started = time.perf_counter()
    while any(position[p] < end[p] for p in partitions):
        raw: list[bytes] = []
        t = time.perf_counter()
        while len(raw) < batch and any(position[p] < end[p] for p in partitions):
            for message in consumer.consume(num_messages=min(10_000, batch - len(raw)), timeout=1.0):
                if message.error():
                    raise RuntimeError(f"plain consumer: {topic}: {message.error()}")
                position[message.partition()] = message.offset() + 1
                raw.append(message.value())
        steps["Kafka read"] += time.perf_counter() - t
        t = time.perf_counter()
        events = [json.loads(value) for value in raw]
        steps["JSON parse"] += time.perf_counter() - t
        t = time.perf_counter()
        summary_rows, payment_rows = _fold(events)
        summary = pa.Table.from_pylist(summary_rows, schema=source_schema)
        payments = pa.Table.from_pylist(payment_rows, schema=payments_schema)
        steps["fold"] += time.perf_counter() - t
        t = time.perf_counter()
        (DeltaTable(str(summary_path))
         .merge(summary, predicate="t.account_id = s.account_id", source_alias="s", target_alias="t")
         .when_matched_update(updates=MERGE_UPDATE).when_not_matched_insert(updates=MERGE_INSERT).execute())
        steps["MERGE account_summary"] += time.perf_counter() - t
        t = time.perf_counter()
        if payment_rows:
            (DeltaTable(str(payments_path))
             .merge(payments, predicate="t.account_id = s.account_id AND t.payment_id = s.payment_id",
                    source_alias="s", target_alias="t")
             .when_not_matched_insert_all().execute())
        steps["MERGE payments"] += time.perf_counter() - t
        t = time.perf_counter()
        consumer.commit(asynchronous=False)
        steps["offset commit"] += time.perf_counter() - t
        total += len(raw)
        batches += 1
    seconds = time.perf_counter() - started
    consumer.close()
    rows = {name: DeltaTable(str(path)).to_pyarrow_dataset().count_rows()
            for name, path in (("account_summary", summary_path), ("payments", payments_path))}
    return {"events": total, "seconds": seconds, "batches": batches, "steps": steps, "rows": rows,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--home", type=Path, required=True, help="a fresh directory for the two tables")
    parser.add_argument("--batch", type=int, default=1_000_000, help="events per batch (one MERGE per table)")
    args = parser.parse_args()
    print(json.dumps(consume(args.bootstrap, args.topic, args.home, args.batch)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
