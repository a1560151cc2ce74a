"""decide/evolve of the IoT ``device`` aggregate: given these commands, expect these events, states and reasons.

The domain is not in the registry's built-ins yet (the Spark event parser does not know its payload columns),
so every test here registers it for its duration, as tests/unit/test_domains.py does with its counter."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from event_store import domains, iot, schemas
from event_store.decider import EventTimeLimit, execute, execute_encoded, initial_state
from event_store.envelope import CommandEnvelope, EventEnvelope, parse_time
from event_store.errors import InvalidRecord
from event_store.iot import DeviceState, decide, evolve, quarantined
from event_store.iot.schemas import VALUE_MAX_MILLI
from event_store.partition_rebuild import PartitionRebuilder
from event_store.snapshots import PartitionState, load_snapshot, snapshot_records
from lakehouse.settings import Settings

T0 = "2026-01-01T10:00:00.000Z"
DEVICE = "dev-1"


def test_the_device_domain_is_built_in():
    assert domains.DOMAINS["device"] is iot.DOMAIN and schemas.COMMANDS["RecordReading"] is iot.DOMAIN.commands[
        "RecordReading"]


def cmd(kind, payload, device=DEVICE, **kw):
    return CommandEnvelope.create(kind, device, payload, **kw)


def register(unit="C", low=-10_000, high=40_000, heartbeat=30, device=DEVICE, **kw):
    return cmd("RegisterDevice", {"site_id": "site-a", "sensor_kind": "temperature", "unit": unit,
                                  "range_min_milli": low, "range_max_milli": high, "heartbeat_interval_s": heartbeat},
               device, **kw)


def reading(value, reading_id="r1", unit="C", at=T0, device=DEVICE, **kw):
    return cmd("RecordReading", {"reading_id": reading_id, "value_milli": value, "unit": unit, "measured_at": at},
               device, **kw)


def run(*commands, state=None):
    state, all_events, results = state or DeviceState(DEVICE), [], []
    for c in commands:
        state, events, result = execute(state, c)
        all_events += events
        results.append(result)
    return state, all_events, results


def rejection(state, command):
    with pytest.raises(iot.CommandRejected) as e:
        decide(state, command)
    return e.value.error_type, e.value.reason


def test_register_device_records_its_site_kind_unit_range_and_heartbeat():
    state, events, _ = run(register(heartbeat=60))
    assert [(e.event_type, e.aggregate_type, e.aggregate_version, e.occurred_at) for e in events] == [
        ("DeviceRegistered", "device", 1, events[0].occurred_at)]
    assert events[0].payload == {"site_id": "site-a", "sensor_kind": "temperature", "unit": "C",
                                 "range_min_milli": -10_000, "range_max_milli": 40_000, "heartbeat_interval_s": 60}
    assert state == DeviceState(DEVICE, 1, True, "active", "site-a", "temperature", "C", -10_000, 40_000, 60)


def test_re_registering_a_device_is_rejected_even_after_decommissioning():
    state, _, _ = run(register())
    assert rejection(state, register()) == (
        "DeviceAlreadyRegistered", "device dev-1 is already registered (active, temperature at site site-a); a "
                                   "device id is registered once and never reused")
    state, _, _ = run(cmd("DecommissionDevice", {}), state=state)
    assert rejection(state, register())[0] == "DeviceAlreadyRegistered"


@pytest.mark.parametrize("low, high", [(5, 5), (6, 5)])
def test_a_range_whose_minimum_is_not_below_its_maximum_is_rejected(low, high):
    assert rejection(DeviceState(DEVICE), register(low=low, high=high)) == (
        "InvalidDeviceRange", f"device dev-1: range_min_milli {low} must be below range_max_milli {high} (the "
                              f"allowed range, in thousandths of C)")


def test_readings_are_recorded_at_their_measured_time_in_or_out_of_range_and_out_of_order():
    late = "2026-01-01T09:00:00.000Z"
    state, events, results = run(register(), reading(21_500, "r1"), reading(99_000, "r2"),
                                 reading(-15_000, "r3", at=late))
    assert all(r.accepted for r in results)
    assert [(e.event_type, e.aggregate_version, e.occurred_at, e.payload) for e in events[1:]] == [
        ("ReadingRecorded", 2, T0, {"reading_id": "r1", "value_milli": 21_500, "unit": "C"}),
        ("ReadingRecorded", 3, T0, {"reading_id": "r2", "value_milli": 99_000, "unit": "C"}),
        ("ReadingRecorded", 4, late, {"reading_id": "r3", "value_milli": -15_000, "unit": "C"})]
    assert (state.readings_recorded, state.version) == (3, 4)


def test_a_reading_for_a_device_never_registered_is_rejected_with_a_reason():
    _, events, [result] = run(reading(1, "r7"))
    assert events == [] and (result.status, result.error_type, result.version) == ("rejected", "DeviceNotFound", 0)
    assert result.reason == "device dev-1 is not registered; send RegisterDevice first (reading r7 not recorded)"


@pytest.mark.parametrize("kind, payload", [("DecommissionDevice", {}),
                                           ("FlagTelemetryAnomaly", {"rule": "out_of_range", "reading_id": "r1"})])
def test_other_commands_for_a_device_never_registered_are_rejected_too(kind, payload):
    assert rejection(DeviceState(DEVICE), cmd(kind, payload)) == (
        "DeviceNotFound", "device dev-1 is not registered; send RegisterDevice first")


def test_a_reading_in_a_unit_the_device_does_not_use_is_rejected():
    state, _, _ = run(register(unit="C"))
    assert rejection(state, reading(70_000, "r2", unit="F")) == (
        "UnitMismatch", "reading r2 of device dev-1 is in 'F', but the device measures temperature in 'C'; "
                        "convert it, or register a device for that unit")


def test_a_decommissioned_device_records_no_reading_and_decommissioning_twice_changes_nothing():
    state, events, results = run(register(), reading(1, "r1"), cmd("DecommissionDevice", {"reason": "replaced"}),
                                 cmd("DecommissionDevice", {}))
    assert [e.event_type for e in events] == ["DeviceRegistered", "ReadingRecorded", "DeviceDecommissioned"]
    assert events[-1].payload == {"reason": "replaced"}
    assert results[-1].accepted and results[-1].event_ids == () and state.status == "decommissioned"
    assert rejection(state, reading(2, "r2", at="2026-01-01T09:59:00.000Z")) == (
        "DeviceNotActive", "device dev-1 is decommissioned; reading r2 (measured at 2026-01-01T09:59:00.000Z) is "
                           "not recorded")


def test_an_anomaly_is_recorded_through_a_command_at_the_findings_time_also_after_decommissioning():
    flag = {"rule": "out_of_range", "reading_id": "r3", "evidence": "3 readings above 40 C",
            "occurred_at": "2026-01-01T09:30:00.000Z"}
    state, events, _ = run(register(), cmd("FlagTelemetryAnomaly", flag),
                           cmd("FlagTelemetryAnomaly", {"rule": "device_silent"}))
    assert [(e.event_type, e.occurred_at, e.payload) for e in events[1:]] == [
        ("TelemetryAnomalyDetected", "2026-01-01T09:30:00.000Z",
         {"rule": "out_of_range", "reading_id": "r3", "evidence": "3 readings above 40 C"}),
        ("TelemetryAnomalyDetected", events[2].occurred_at, {"rule": "device_silent", "reading_id": None,
                                                             "evidence": None})]
    assert state.anomalies_detected == 2
    state, events, _ = run(cmd("DecommissionDevice", {}), cmd("FlagTelemetryAnomaly", flag), state=state)
    assert events[-1].event_type == "TelemetryAnomalyDetected"


def test_a_flag_re_sent_with_its_command_id_is_not_recorded_twice():
    """Idempotent as FlagFraud is: the detector derives the command_id, and the handler's idempotency window
    answers the repeat (tests/unit/test_domains.py shows the window across domains); the events are the same."""
    flag = cmd("FlagTelemetryAnomaly", {"rule": "out_of_range", "reading_id": "r3"}, command_id="flag-r3-oor")
    state, _, _ = run(register())
    assert execute(state, flag, recorded_at=T0)[1] == execute(state, flag, recorded_at=T0)[1]


def test_a_payload_field_name_the_device_shares_with_another_domain_has_the_same_description():
    """Readers flatten payloads into one column per field name (spark_apps/events.py), so a name means one
    thing in every domain: the device's reason, rule, evidence, record and resolved_by are the account's."""
    from event_store import account

    for ours, theirs in ((iot.DOMAIN.events, account.DOMAIN.events), (iot.DOMAIN.commands, account.DOMAIN.commands)):
        mine = {name: spec for fields in ours.values() for name, spec in fields.items()}
        other = {name: spec for fields in theirs.values() for name, spec in fields.items()}
        shared = mine.keys() & other.keys()
        assert {"reason", "rule", "evidence", "record", "resolved_by"} <= shared
        assert {name: (mine[name].kind, mine[name].pattern) for name in shared} == \
            {name: (other[name].kind, other[name].pattern) for name in shared}


def test_evolve_refuses_unknown_event_types():
    with pytest.raises(ValueError, match="device aggregate cannot apply unknown event type 'Teleported'"):
        evolve(DeviceState("d"), iot.NewEvent("Teleported", {}, T0))


@pytest.mark.parametrize("payload, message", [
    ({"value_milli": 21.5}, "field 'value_milli' must be int, got float 21.5"),
    ({"value_milli": True}, "field 'value_milli' must be int, got bool"),
    ({"value_milli": "21500"}, "field 'value_milli' must be int, got str"),
    ({"value_milli": VALUE_MAX_MILLI + 1}, "field 'value_milli' must be <= 1,000,000,000,000"),
    ({"value_milli": -VALUE_MAX_MILLI - 1}, "field 'value_milli' must be > -1000000000001"),
    ({"unit": "deg C"}, "field 'unit' 'deg C' is not a unit code"),
    ({"unit": ""}, "field 'unit' '' is not a unit code"),
    ({"measured_at": "2026-01-01T10:00:00"}, "field 'measured_at' '2026-01-01T10:00:00' is not an ISO-8601"),
    ({"measured_at": "1899-12-31T23:59:59Z"}, "field 'measured_at' '1899-12-31T23:59:59Z' is out of range"),
    ({"reading_id": " "}, "field 'reading_id' must not be empty"),
])
def test_invalid_readings_are_refused_naming_the_field_and_the_reason(payload, message):
    body = {"reading_id": "r1", "value_milli": 1, "unit": "C", "measured_at": T0, **payload}
    with pytest.raises(InvalidRecord, match=message.replace("(", r"\(").replace("+", r"\+")):
        cmd("RecordReading", body)


@pytest.mark.parametrize("raw_value", ["NaN", "Infinity", "-Infinity", "1e400", "21.5", "1e3"])
def test_a_json_number_that_is_not_an_integer_is_refused_on_both_paths(raw_value):
    raw = ('{"command_id":"c1","command_type":"RecordReading","aggregate_id":"d","payload":{"reading_id":"r",'
           '"value_milli":%s,"unit":"C","measured_at":"%s"}}' % (raw_value, T0)).encode()
    verdicts = []
    for parse in (CommandEnvelope.from_json, lambda r: CommandEnvelope.from_dict(json.loads(r))):
        with pytest.raises(InvalidRecord, match="field 'value_milli' must be int, got float") as e:
            parse(raw)
        verdicts.append(str(e.value))
    assert verdicts[0] == verdicts[1]


@pytest.mark.parametrize("payload, message", [
    ({"heartbeat_interval_s": 0}, "field 'heartbeat_interval_s' must be > 0"),
    ({"heartbeat_interval_s": 8 * 24 * 3600}, "field 'heartbeat_interval_s' must be <= 604,800"),
    ({"sensor_kind": "Temp C"}, "field 'sensor_kind' 'Temp C' is not a lower-case sensor kind"),
    ({"range_min_milli": 1.5}, "field 'range_min_milli' must be int, got float"),
    ({"site_id": None}, "missing required field 'site_id'"),
])
def test_invalid_registrations_are_refused_naming_the_field(payload, message):
    body = {"site_id": "s", "sensor_kind": "temperature", "unit": "C", "range_min_milli": 0, "range_max_milli": 1,
            "heartbeat_interval_s": 30, **payload}
    with pytest.raises(InvalidRecord, match=message):
        cmd("RegisterDevice", body)


def test_device_commands_route_to_the_device_aggregate_through_the_generic_decider():
    raw = json.dumps({"command_id": "c1", "command_type": "RegisterDevice", "aggregate_id": DEVICE,
                      "issued_at": T0, "payload": register().payload}).encode()
    command = CommandEnvelope.from_json(raw)
    assert command.aggregate_type == "device" and initial_state(command) == DeviceState(DEVICE)
    state, events, result = execute(initial_state(command), command, recorded_at=T0)
    assert result.accepted and state.version == 1
    # A logged event reads back through the registry's schemas and folds to the same state.
    assert evolve(DeviceState(DEVICE), EventEnvelope.from_json(events[0].to_json())) == state
    assert execute_encoded(DeviceState(DEVICE), command, T0)[1] == [events[0].to_json()]
    stale = execute(state, reading(1, expected_version=0))[2]
    assert (stale.error_type, stale.reason) == ("ConcurrencyConflict",
                                                "expected version 0 of device dev-1, but it is at version 1")
    with pytest.raises(InvalidRecord, match="command_type 'RecordReading' is not a command of aggregate type "
                                            "'account' \\(it belongs to 'device'\\)"):
        CommandEnvelope.from_dict({**json.loads(reading(1).to_json()), "aggregate_type": "account"})


def test_a_reading_measured_beyond_the_handlers_clock_is_rejected_by_the_decider():
    limit = EventTimeLimit.at(parse_time(T0, "now"), 60)
    state, _, _ = run(register())
    _, events, result = execute(state, reading(1, at="2026-01-01T11:00:00.000Z"), time_limit=limit)
    assert (events, result.error_type) == ([], "EventTimeInFuture")
    assert result.reason.startswith(f"command {result.command_id}: measured_at 2026-01-01T11:00:00.000Z "
                                    f"(ReadingRecorded) lies 3,600s ahead of the handler's clock")


def test_a_device_survives_a_snapshot_and_the_rebuild_folds_its_events():
    state, events, _ = run(register(), reading(1, "r1"), cmd("FlagTelemetryAnomaly", {"rule": "x"}),
                           cmd("DecommissionDevice", {}))
    rebuilder = PartitionRebuilder(Settings.load({}), log=lambda *_: None)
    part = PartitionState(0)
    for offset, event in enumerate(events):
        rebuilder.apply_logged(part, EventEnvelope.from_json(event.to_json()),
                               SimpleNamespace(topic="events", offset=offset))
    assert part.states == {("device", DEVICE): state}
    part.states[("device", "dev-q")] = quarantined(DeviceState("dev-q"), "events/0/7", "not JSON")
    records = [SimpleNamespace(key=k, value=v) for k, v in snapshot_records(part)]
    assert load_snapshot(records, 0, 100).states == part.states


def test_a_quarantined_device_takes_only_the_resolution_that_names_its_record():
    state, _, _ = run(register())
    state = quarantined(state, "events/2/41", "aggregate_version: must be > 0, got -1")
    assert quarantined(state, "events/2/99", "another") == state
    error, reason = rejection(state, reading(1))
    assert error == "DeviceQuarantined" and "events/2/41: aggregate_version: must be > 0" in reason
    resolve = {"record": "events/2/41", "reason": "forged record", "resolved_by": "ops-anna"}
    assert rejection(state, cmd("ResolveDeviceQuarantine", {**resolve, "record": "events/2/40"})) == (
        "QuarantineRecordMismatch", "device dev-1 is quarantined by record events/2/41, not events/2/40")
    state, events, result = execute(state, cmd("ResolveDeviceQuarantine", resolve))
    assert events[0].payload == {**resolve, "evidence": "aggregate_version: must be > 0, got -1"}
    assert result.accepted and state.quarantine is None and state.version == 2
    assert execute(state, reading(1))[2].accepted
    assert rejection(state, cmd("ResolveDeviceQuarantine", resolve))[0] == "NotQuarantined"


_COMMANDS = st.one_of(
    st.builds(lambda: register()),
    st.builds(lambda unit, low, high: register(unit=unit, low=low, high=high),
              st.sampled_from(["C", "F"]), st.integers(-100, 100), st.integers(-100, 100)),
    st.builds(lambda value, unit, minute: reading(value, f"r{minute}", unit, f"2026-01-01T10:{minute:02d}:00Z"),
              st.integers(-VALUE_MAX_MILLI, VALUE_MAX_MILLI), st.sampled_from(["C", "F"]), st.integers(0, 59)),
    st.builds(lambda: cmd("DecommissionDevice", {})),
    st.builds(lambda rule: cmd("FlagTelemetryAnomaly", {"rule": rule}), st.sampled_from(["a", "b"])),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_COMMANDS, max_size=25))
def test_any_command_sequence_folds_from_its_events_to_the_deciders_state_and_through_a_snapshot(commands):
    """Whatever is sent: versions run 1, 2, 3 without a gap, folding the logged events again gives the decider's
    state, readings are recorded only while registered and active, and the state survives a snapshot."""
    state, events, results = run(*commands)
    assert [e.aggregate_version for e in events] == list(range(1, len(events) + 1))
    refolded = DeviceState(DEVICE)
    for e in events:
        refolded = evolve(refolded, EventEnvelope.from_json(e.to_json()))
    assert refolded == state
    recorded = [e for e in events if e.event_type == "ReadingRecorded"]
    assert state.readings_recorded == len(recorded)
    assert all(e.payload["unit"] == state.unit for e in recorded)
    for c, r in zip(commands, results):
        if c.command_type == "RecordReading" and not r.accepted:
            assert r.error_type in ("DeviceNotFound", "DeviceNotActive", "UnitMismatch")
    assert iot.DOMAIN.decode_state(json.loads(json.dumps(iot.DOMAIN.encode_state(state)))) == state


class _Record:
    """A command record as confluent-kafka hands it to the handler."""

    def __init__(self, value: bytes, offset: int):
        self._value, self._offset = value, offset

    def value(self):
        return self._value

    def key(self):
        return None

    def topic(self):
        return "commands"

    def partition(self):
        return 0

    def offset(self):
        return self._offset


def test_the_handlers_batch_decides_devices_and_accounts_side_by_side_with_idempotency():
    """One batch through the handler's own code (no Kafka): a device cannot take an account's id (nor an account
    a device's: ids are one namespace across aggregate types, as the readers know aggregates by id), a flag re-sent with its command_id gets the first result and writes nothing, and the domain's
    rejections reach the command results with their reasons."""
    from event_store.envelope import CommandResult
    from event_store.batch_decision import DecisionCounts, RecordLimits, StagedChanges, decide_records

    limits = RecordLimits.of("events", "results", "dead-letters", dict.fromkeys(("events", "results", "dead-letters"),
                                                                                  1_000_000))
    flag = cmd("FlagTelemetryAnomaly", {"rule": "out_of_range", "reading_id": "r1"}, "x", command_id="f1")
    values = [CommandEnvelope.create("OpenAccount", "a", {"customer_id": "cu", "credit_limit_minor": 10,
                                                          "currency": "USD"}, command_id="a1").to_json(),
              register(device="a", command_id="d0").to_json(),
              register(device="x", command_id="d1").to_json(), reading(1, "r1", device="x", command_id="d2").to_json(),
              flag.to_json(), flag.to_json(), reading(1, "r2", "F", device="x", command_id="d3").to_json(),
              reading(1, "r3", device="y", command_id="d4").to_json(),
              CommandEnvelope.create("OpenAccount", "x", {"customer_id": "cu", "credit_limit_minor": 10,
                                                          "currency": "USD"}, command_id="a2").to_json()]
    part, staged = PartitionState(0), StagedChanges()
    writes = decide_records([_Record(v, i) for i, v in enumerate(values)], part, staged, DecisionCounts(), T0, None,
                            limits)
    events, results = writes.events, writes.results
    answers = [CommandResult.from_json(v) for _, v in results]
    assert [(r.command_id, r.status, r.version, r.duplicate, r.error_type) for r in answers] == [
        ("a1", "accepted", 1, False, None), ("d0", "rejected", 0, False, "AggregateIdTaken"),
        ("d1", "accepted", 1, False, None), ("d2", "accepted", 2, False, None),
        ("f1", "accepted", 3, False, None), ("f1", "accepted", 3, True, None),
        ("d3", "rejected", 3, False, "UnitMismatch"), ("d4", "rejected", 0, False, "DeviceNotFound"),
        ("a2", "rejected", 0, False, "AggregateIdTaken")]
    assert "aggregate id 'x' is taken by an aggregate of type 'device'; a 'account' cannot have it" in answers[-1].reason
    assert {k: s.version for k, (_, s) in staged.states.items()} == {("account", "a"): 1, ("device", "x"): 3}
    assert [json.loads(v)["event_type"] for _, v in events] == [
        "AccountOpened", "DeviceRegistered", "ReadingRecorded", "TelemetryAnomalyDetected"]
