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
    df = spark.createDataFrame([(r.encode(), "events", 0, i) for i, r in enumerate(records)],
                               "value binary, topic string, partition int, offset long")
    valid, dead = parse_events(df)
    rows = {r["event_id"]: r for r in valid.collect()}
    assert rows["e-1-p1"]["schema_version"] == 2 and rows["e-1-p1"]["merchant_country"] == "GB"
    assert rows["e-2-p2"]["schema_version"] == 2 and rows["e-2-p2"]["merchant_country"] == "FR"
    assert rows["e-1-x"]["schema_version"] == 1 and rows["e-1-x"]["merchant_country"] is None
    [bad] = dead.collect()
    assert "schema_version 9 is newer than this code reads (up to 2)" in bad["reason"]
    assert bad["kafka_offset"] == 2
