"""The fraud detector consumer's pure parts: commands equal to what the rules find, state that survives its
snapshot encoding, event times as the Spark app reads them."""
from datetime import datetime, timedelta, timezone

from event_store.account import AccountState
from event_store.account.fraud_consumer import event_time_ms, findings_for, observation
from event_store.account.fraud_state import decode_state, encode_state
from event_store.account.fraud_rules import FraudState, detect, flag_command_id
from event_store.decider import execute
from event_store.envelope import CommandEnvelope


def _events(commands):
    states, events = {}, []
    for kind, account, payload in commands:
        state = states.get(account) or AccountState(account)
        states[account], new, result = execute(state, CommandEnvelope.create(kind, account, payload))
        assert result.accepted, result
        events += new
    return events


def _pay(account, pid, amount, location, seconds):
    t = (datetime(2026, 3, 1, 10, tzinfo=timezone.utc) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%f")
    return ("AuthorizePayment", account, {"payment_id": pid, "amount_minor": amount, "currency": "USD",
                                          "merchant_id": "m1", "location": location, "occurred_at": t[:-3] + "Z"})


def _opened(account):
    return ("OpenAccount", account, {"customer_id": "c", "credit_limit_minor": 1_000_000, "currency": "USD"})


def _device(account, location, seconds):
    t = datetime(2026, 3, 1, 10, tzinfo=timezone.utc) + timedelta(seconds=seconds)
    return ("ReportDeviceLocation", account, {"location": location, "occurred_at": t.strftime("%Y-%m-%dT%H:%M:%S.000Z")})


def _oracle(events):
    """The rules over each account's events in version order."""
    found, states = set(), {}
    for e in sorted(events, key=lambda e: (e.aggregate_id, e.aggregate_version)):
        if e.event_type not in ("PaymentAuthorized", "PaymentDeclined", "DeviceLocationReported"):
            continue
        states[e.aggregate_id], new = detect(states.get(e.aggregate_id, FraudState()), observation(e))
        found |= {(e.aggregate_id, f.payment_id, f.rule) for f in new}
    return found


def test_commands_are_the_rules_findings_whatever_the_batches_and_order_within_them():
    events = _events([_opened("a"), _device("a", "US-NYC", 0), _pay("a", "a1", 100, "US-NYC", 60),
                      _pay("a", "a2", 50, "US-NYC", 65), _pay("a", "a3", 500, "US-NYC", 200),
                      _pay("a", "a4", 10, "GB-LON", 400), _opened("b"), _pay("b", "b1", 100, "FR-PAR", 10),
                      _pay("b", "b2", 200, "FR-PAR", 15)])
    expected = {("a", "a2", "rapid_attempts"), ("a", "a3", "amount_above_max"), ("a", "a4", "location_mismatch"),
                ("b", "b2", "rapid_attempts"), ("b", "b2", "amount_above_max")}
    assert _oracle(events) == expected
    for cut in range(len(events) + 1):  # two batches, cut anywhere; the second batch reversed
        states: dict = {}
        commands = findings_for(states, events[:cut]) + findings_for(states, list(reversed(events[cut:])))
        assert {(c.aggregate_id, c.payload["payment_id"], c.payload["rule"]) for c in commands} == expected
        assert len(commands) == len(expected)  # nothing twice
        for c in commands:
            assert c.command_type == "FlagFraud" and c.aggregate_type == "account"
            assert c.command_id == flag_command_id(c.payload["payment_id"], c.payload["rule"])
            assert c.correlation_id == c.command_id and c.causation_id == "fraud-detector"
        assert findings_for(states, events) == []  # a replay of everything: the versions were folded
    a2 = next(c for c in findings_for({}, events) if c.payload["payment_id"] == "a2")
    assert a2.payload["occurred_at"] == "2026-03-01T10:01:05.000Z"
    assert CommandEnvelope.from_json(a2.to_json()) == a2  # what the handler reads back


def test_a_state_decoded_from_its_snapshot_encoding_finds_the_same():
    events = _events([_opened("a"), _device("a", "US-NYC", 0), _pay("a", "a1", 100, "US-NYC", 60),
                      _pay("a", "a2", 50, "GB-LON", 65)])
    states: dict = {}
    findings_for(states, events[:3])
    import json

    restored = {k: decode_state(json.loads(json.dumps(encode_state(v)))) for k, v in states.items()}
    assert restored == states
    assert [c.payload["rule"] for c in findings_for(restored, events[3:])] == ["rapid_attempts", "location_mismatch"]


def test_event_times_are_milliseconds_truncated_toward_zero_like_the_spark_app():
    assert event_time_ms("1970-01-01T00:00:01.5Z") == 1500
    assert event_time_ms("1969-12-31T23:59:59.9995Z") == 0  # -0.5 ms -> 0 (Spark's cast of a negative fraction)
    assert event_time_ms("1969-12-31T23:59:59.998Z") == -2
    assert event_time_ms("9998-12-31T00:00:00.000Z") == 253370678400000
