"""The envelopes' JSON form and validation on the way in."""
import json

import pytest

from event_store.account import AccountState
from event_store.decider import execute
from event_store.envelope import CommandEnvelope, EventEnvelope
from event_store.errors import InvalidRecord


def an_event() -> EventEnvelope:
    c = CommandEnvelope.create("OpenAccount", "acc-1", {"customer_id": "c", "credit_limit_minor": 100,
                                                         "currency": "USD"})
    return execute(AccountState("acc-1"), c)[1][0]


def test_event_round_trips_through_json_with_every_envelope_field():
    e = an_event()
    obj = json.loads(e.to_json())
    assert set(obj) == {"event_id", "event_type", "schema_version", "aggregate_type", "aggregate_id",
                        "aggregate_version", "occurred_at", "recorded_at", "command_id", "correlation_id",
                        "causation_id", "payload"}
    assert EventEnvelope.from_json(e.to_json()) == e
    assert obj["recorded_at"].endswith("Z")


def test_command_round_trips_through_json():
    c = CommandEnvelope.create("FreezeAccount", "acc-1", {"reason": "x"}, expected_version=3)
    assert CommandEnvelope.from_json(c.to_json()) == c


@pytest.mark.parametrize("raw, message", [
    (b"{nope", "not valid JSON"),
    (b"[1]", "expected a JSON object"),
    (b'{"command_id": "c1", "command_type": "Teleport", "aggregate_id": "a", "payload": {}}',
     "unknown command_type 'Teleport'"),
    (b'{"command_id": "c1", "command_type": "FreezeAccount", "aggregate_id": " ", "payload": {}}',
     "field .aggregate_id. must not be empty"),
    (b'{"command_id": "c1", "command_type": "FreezeAccount", "aggregate_id": "a", "payload": {},'
     b' "expected_version": -1}', "expected_version must be a non-negative integer"),
    (b'{"command_type": "FreezeAccount", "aggregate_id": "a", "payload": {}}', "missing required field 'command_id'"),
])
def test_bad_commands_name_the_reason(raw, message):
    with pytest.raises(InvalidRecord, match=message):
        CommandEnvelope.from_json(raw)


def test_bad_events_name_the_reason():
    obj = json.loads(an_event().to_json())
    obj["aggregate_version"] = 0
    with pytest.raises(InvalidRecord, match="field .aggregate_version. must be > 0"):
        EventEnvelope.from_dict(obj)
    obj = json.loads(an_event().to_json())
    obj["occurred_at"] = "yesterday"
    with pytest.raises(InvalidRecord, match="not an ISO-8601"):
        EventEnvelope.from_dict(obj)
