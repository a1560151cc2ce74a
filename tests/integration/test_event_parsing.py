"""Kafka records -> event rows in Spark: validation to dead letters, and upcasting old schema versions."""
import json

import pytest

from event_store.upcasting import UPCASTERS
from spark_apps.events import missing_spark_upcasters, parse_events


def test_every_old_schema_version_has_a_spark_upcaster_too():
    assert missing_spark_upcasters() == []
    from spark_apps.events import spark_upcasters
    assert set(spark_upcasters()) == set(UPCASTERS)


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


def _thermo_domain():
    """A test-only domain with payload fields accounts do not have, an old schema version and its upcasters (the
    Python one and its Spark twin): registering it is all the Spark parser needs."""
    from dataclasses import replace

    from event_store.account import DOMAIN as ACCOUNT
    from event_store.fields import ID, Field

    read = {"sensor_id": ID, "reading_milli": Field(int, gt=-10**9, le=10**9),
            "unit": Field(str, choices=frozenset({"C", "F"}), describe="a unit, C or F")}
    return replace(ACCOUNT, aggregate_type="thermo", commands={}, payload_column_order=(),
                   events={"ThermoRead": read, "ThermoMoved": {"sensor_id": ID, "location": ID}},
                   event_schema_versions={"ThermoRead": 2, "ThermoMoved": 1},
                   upcasters={("ThermoRead", 1): lambda p: {**p, "unit": "C"}},  # v1 readings were all Celsius
                   spark_upcasters={("ThermoRead", 1): {"unit": lambda F: F.lit("C")}})


@pytest.mark.slow
def test_a_registered_domain_is_parsed_and_checked_with_no_edit_to_spark_apps(spark):
    from event_store import domains
    from spark_apps.events import ENVELOPE_COLUMNS, KAFKA_COLUMNS, check_records, event_columns, payload_columns

    def thermo(event_id, payload, event_type="ThermoRead", version=2):
        return {**_event(version, payload, event_type=event_type, aggregate_type="thermo", aggregate_id="t-1"),
                "event_id": event_id}

    good = {"sensor_id": "s-1", "reading_milli": -2500, "unit": "F"}
    with domains.registered(_thermo_domain()):
        # location is the account's column and unit the device's: a name several domains use is one column.
        assert payload_columns()[-2:] == ("sensor_id", "reading_milli")
        events = [
            thermo("t-ok", good),
            thermo("t-v1", {"sensor_id": "s-1", "reading_milli": 7}, version=1),
            thermo("t-moved", {"sensor_id": "s-1", "location": "hall"}, event_type="ThermoMoved", version=1),
            thermo("t-no-reading", {"sensor_id": "s-1", "unit": "C"}),
            thermo("t-text-reading", {**good, "reading_milli": "12"}),
            thermo("t-too-cold", {**good, "reading_milli": -10**9}),
            thermo("t-kelvin", {**good, "unit": "K"}),
            thermo("t-numeric-id", {**good, "sensor_id": 5}),
            _event(1, {"payment_id": "p1", "amount_minor": 100, "currency": "USD", "merchant_id": "m",
                       "location": "GB-LON"}),
            _event(2, {"payment_id": "p2", "amount_minor": -1, "currency": "USD", "merchant_id": "m",
                       "location": "GB-LON", "merchant_country": "GB"}),
        ]
        records = [json.dumps(e).encode() for e in events]
        df = spark.createDataFrame([(b"k", r, "events", 0, i) for i, r in enumerate(records)],
                                   "key binary, value binary, topic string, partition int, offset long")
        checked = check_records(df).collect()
        valid, dead = parse_events(df)
        assert tuple(valid.columns) == event_columns()
        assert event_columns() == (*ENVELOPE_COLUMNS, *payload_columns(), *KAFKA_COLUMNS)
        rows = {r["event_id"]: r for r in valid.collect()}
        reasons = {events[r["kafka_offset"]]["event_id"]: r["reason"] for r in dead.collect()}
        python = {e["event_id"]: _python_verdict(json.dumps(e)) for e in events}
    assert "sensor_id" not in payload_columns()

    assert set(rows) == {"t-ok", "t-v1", "t-moved", "e-1-p1"}
    assert (rows["t-ok"]["sensor_id"], rows["t-ok"]["reading_milli"], rows["t-ok"]["unit"]) == ("s-1", -2500, "F")
    assert rows["t-ok"]["amount_minor"] is None and rows["t-ok"]["aggregate_type"] == "thermo"
    assert (rows["t-v1"]["schema_version"], rows["t-v1"]["unit"]) == (2, "C")
    assert rows["t-moved"]["location"] == "hall" and rows["t-moved"]["unit"] is None
    assert rows["e-1-p1"]["merchant_country"] == "GB" and rows["e-1-p1"]["sensor_id"] is None
    assert reasons == {
        "t-no-reading": "payload is missing required field 'reading_milli'",
        "t-text-reading": "payload is missing required field 'reading_milli'",
        "t-too-cold": "payload field 'reading_milli' must be > -1000000000",
        "t-kelvin": "payload field 'unit' is not a unit, C or F",
        "t-numeric-id": "field 'sensor_id' must be a JSON string, got a value starting with 5",
        "e-2-p2": "payload field 'amount_minor' must be > 0",
    }
    # The same verdicts as the Python readers (event_store.envelope), which know the domain from the registry too.
    assert python == {e["event_id"]: e["event_id"] not in reasons for e in events}
    assert len(checked) == len(events)
