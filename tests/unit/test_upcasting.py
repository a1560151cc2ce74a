"""Schema evolution: every old event version has an upcaster, and old events are read as current ones."""
import json

import pytest

from event_store import schemas, upcasting
from event_store.envelope import EventEnvelope
from event_store.errors import InvalidRecord


def v1_payment_authorized() -> dict:
    return {"event_id": "e-1", "event_type": "PaymentAuthorized", "schema_version": 1, "aggregate_type": "account",
            "aggregate_id": "acc-1", "aggregate_version": 2, "occurred_at": "2026-01-01T00:00:00.000Z",
            "recorded_at": "2026-01-01T00:00:01.000Z", "command_id": "c-1", "correlation_id": "c-1",
            "causation_id": "c-1",
            "payload": {"payment_id": "p-1", "amount_minor": 500, "currency": "USD", "merchant_id": "m-1",
                        "location": "GB-LON"}}


def test_every_schema_version_below_the_current_one_has_an_upcaster():
    assert upcasting.missing_upcasters() == []
    assert any(v > 1 for v in schemas.EVENT_SCHEMA_VERSIONS.values())  # evolution is exercised for real


def test_the_check_notices_a_missing_upcaster(monkeypatch):
    monkeypatch.setitem(schemas.EVENT_SCHEMA_VERSIONS, "AccountFrozen", 2)
    assert upcasting.missing_upcasters() == [("AccountFrozen", 1)]
    event = {**v1_payment_authorized(), "event_type": "AccountFrozen", "payload": {"reason": "x"}}
    with pytest.raises(InvalidRecord, match="no upcaster for AccountFrozen from schema_version 1"):
        EventEnvelope.from_dict(event)


def test_a_v1_payment_authorized_is_read_as_v2_with_the_country_of_its_location():
    event = EventEnvelope.from_json(json.dumps(v1_payment_authorized()))
    assert event.schema_version == 2
    assert event.payload["merchant_country"] == "GB"
    assert EventEnvelope.from_json(event.to_json()) == event  # v2 reads back unchanged


def test_an_event_from_a_newer_schema_is_refused_with_the_reason():
    with pytest.raises(InvalidRecord, match="schema_version 9 is not readable here"):
        EventEnvelope.from_dict({**v1_payment_authorized(), "schema_version": 9})


def test_new_payments_are_written_at_v2():
    from tests.unit.test_account import open_cmd, pay, run

    _, events, _ = run(open_cmd(), pay(100, location="JP-TYO"))
    assert (events[1].event_type, events[1].schema_version, events[1].payload["merchant_country"]) == \
        ("PaymentAuthorized", 2, "JP")
