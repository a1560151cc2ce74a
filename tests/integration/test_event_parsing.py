"""Kafka records -> event rows in Spark: validation to dead letters, and upcasting old schema versions."""
import json

import pytest

from event_store.upcasting import UPCASTERS
from spark_apps.events import missing_spark_upcasters, parse_events


def test_every_old_schema_version_has_a_spark_upcaster_too():
    assert missing_spark_upcasters() == []
    from spark_apps.events import _spark_upcasters
    assert set(_spark_upcasters()) == set(UPCASTERS)


def _event(version, payload, event_type="PaymentAuthorized", **extra):
    return {"event_id": f"e-{version}-{payload.get('payment_id', 'x')}", "event_type": event_type,
            "schema_version": version, "aggregate_type": "account", "aggregate_id": "acc-1",
            "aggregate_version": 2, "occurred_at": "2026-01-01T00:00:00.000Z",
            "recorded_at": "2026-01-01T00:00:01.000Z", "command_id": "c", "correlation_id": "c",
            "causation_id": "c", "payload": payload, **extra}


@pytest.mark.slow
def test_a_log_with_v1_and_v2_events_reads_as_v2_and_unknown_versions_are_dead_lettered(spark):
    payment = {"payment_id": "p1", "amount_minor": 100, "currency": "USD", "merchant_id": "m", "location": "GB-LON"}
    records = [
        json.dumps(_event(1, payment)),
        json.dumps(_event(2, {**payment, "payment_id": "p2", "merchant_country": "FR"})),
        json.dumps(_event(9, {**payment, "payment_id": "p3"})),
        json.dumps(_event(1, {"location": "US-NYC"}, event_type="DeviceLocationReported")),
    ]
    df = spark.createDataFrame([(b"acc", r.encode(), "events", 0, i) for i, r in enumerate(records)],
                               "key binary, value binary, topic string, partition int, offset long")
    valid, dead = parse_events(df)
    rows = {r["event_id"]: r for r in valid.collect()}
    assert rows["e-1-p1"]["schema_version"] == 2 and rows["e-1-p1"]["merchant_country"] == "GB"
    assert rows["e-2-p2"]["schema_version"] == 2 and rows["e-2-p2"]["merchant_country"] == "FR"
    assert rows["e-1-x"]["schema_version"] == 1 and rows["e-1-x"]["merchant_country"] is None
    [bad] = dead.collect()
    assert "schema_version 9 is newer than this code reads (up to 2)" in bad["reason"]
    assert bad["kafka_offset"] == 2


HOSTILE_VALUES = [None, True, False, 0, -1, 1, 5000, -5000, 1.0, 1.5, 10**16, 10**25, "", " ", "\u00a0", "\u2003",
                  "x", "x" * 300, "US-NYC", "US-NYC\n", "us-nyc", "USD", "XXX", "FR", "2026-01-01T00:00:00Z",
                  "2026-01-01T00:00:00", "2026-02-30T00:00:00Z", "yesterday", "9999-01-01T00:00:00Z",
                  "9998-12-31T23:59:59.999Z", "1899-12-31T23:59:59Z", "0000-01-01T00:00:00Z",
                  "2026-01-01T00:00:00+05:30", "2026-01-01T00:00:00.1234567Z", "AccountOpened", "Teleported",
                  [], {}, ["x"], {"customer_id": 5}]


def _python_verdict(raw):
    from event_store.envelope import EventEnvelope
    from event_store.errors import InvalidRecord

    try:
        EventEnvelope.from_json(raw)
        return True
    except InvalidRecord:
        return False


@pytest.mark.slow
def test_python_and_spark_agree_on_which_records_are_valid_events(spark):
    """One definition of a valid event (event_store.schemas): the handler's rebuild and the policy (Python)
    and the projection, the archive and the fraud detector (Spark) accept exactly the same records."""
    import random

    from eventlake.generator import GeneratorConfig
    from spark_apps.events import check_records
    from tests.domain_helpers import events_for

    rng = random.Random(14)
    events = [json.loads(e.to_json()) for e in events_for(GeneratorConfig(accounts=10, commands=120, seed=8,
                                                                          run_id="valid"), flag_every=5)]
    events.append(_event(1, {"payment_id": "p1", "amount_minor": 100, "currency": "USD", "merchant_id": "m",
                             "location": "GB-LON"}))  # v1: upcast on read
    records = [json.dumps(e).encode() for e in events]
    for e in events * 6:
        damaged = json.loads(json.dumps(e))
        target = damaged["payload"] if rng.random() < 0.6 else damaged
        name = rng.choice(sorted(target) + ["surplus"])
        if rng.random() < 0.1:
            target.pop(name, None)
        else:
            target[name] = rng.choice(HOSTILE_VALUES)
        records.append(json.dumps(damaged).encode())
    records += [None, b"", b"null", b"[1, 2]", b'"text"', b"\xff\xfe\x00garbage", b"{not json",
                json.dumps(events[0]).encode("utf-16"), json.dumps(events[0]).encode() + b"\n",
                # a valid event but for bytes in a string that are not UTF-8 (a lone surrogate, a stray byte)
                json.dumps(events[0]).encode().replace(b'"event_id": "', b'"event_id": "\xed\xa0\x80', 1),
                json.dumps(events[0]).encode().replace(b'"event_id": "', b'"event_id": "\xff', 1)]
    df = spark.createDataFrame([(b"acc", r, "events", 0, i) for i, r in enumerate(records)],
                               "key binary, value binary, topic string, partition int, offset long")
    checked = {r["kafka_offset"]: r["_reason"] for r in check_records(df).select("kafka_offset", "_reason").collect()}
    python = {i: _python_verdict(r) for i, r in enumerate(records)}
    disagree = [(records[i], checked[i]) for i in python if python[i] != (checked[i] is None)]
    assert not disagree, f"{len(disagree)} of {len(records)} records judged differently, e.g. {disagree[:3]}"
    assert 0.2 < sum(python.values()) / len(records) < 0.8  # both verdicts are well represented
