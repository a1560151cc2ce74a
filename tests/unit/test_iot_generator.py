"""The IoT telemetry generator: deterministic per seed, valid commands, and each deliberate case where its
config says, checked by running the stream through the device aggregate (a built-in domain)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from datetime import timedelta

import pytest

from event_store import iot
from event_store.decider import execute
from event_store.envelope import CommandEnvelope, parse_time
from eventlake.generator import IotGeneratorConfig, generate_iot_commands

CFG = IotGeneratorConfig(devices=16, sites=3, minutes=20, seed=7, run_id="t", late_rate=0.05)


def _run(cfg):
    """Every command decided in arrival order: (command, result, events) each, and the final states."""
    states, out = {}, []
    for key, raw in generate_iot_commands(cfg):
        command = CommandEnvelope.from_json(raw)
        assert key == command.aggregate_id and command.aggregate_type == "device"
        assert command.to_json() == raw  # what CommandEnvelope writes, so the handler reads it the same
        state = states.get(key) or iot.DeviceState(key)
        states[key], events, result = execute(state, command, recorded_at=command.issued_at)
        out.append((command, result, events))
    return out, states


def test_the_stream_is_deterministic_per_seed():
    assert list(generate_iot_commands(CFG)) == list(generate_iot_commands(CFG))
    assert list(generate_iot_commands(CFG)) != list(generate_iot_commands(replace(CFG, seed=8)))


def test_devices_span_sites_and_kinds_and_report_at_their_heartbeat_in_arrival_order():
    decided, states = _run(CFG)
    registered = {s.device_id: s for s in states.values() if s.registered}
    assert len(registered) == CFG.devices
    assert {s.site_id for s in registered.values()} == {f"site-{CFG.run_id}-{i:02d}" for i in range(CFG.sites)}
    assert {s.sensor_kind for s in registered.values()} == {"temperature", "humidity", "pressure", "co2",
                                                            "vibration"}
    issued = [parse_time(c.issued_at, "issued_at") for c, _, _ in decided]
    assert issued == sorted(issued)
    by_device = defaultdict(list)
    for c, r, events in decided:
        if r.accepted and events and events[0].event_type == "ReadingRecorded":
            by_device[c.aggregate_id].append(parse_time(events[0].occurred_at, "measured_at"))
    for device, times in by_device.items():
        gaps = {b - a for a, b in zip(sorted(times), sorted(times)[1:])}
        assert gaps == {timedelta(seconds=registered[device].heartbeat_interval_s)}, device


def test_each_rejection_is_a_deliberate_case_with_its_reason():
    decided, _ = _run(CFG)
    rejected = [(c, r) for c, r, _ in decided if not r.accepted]
    assert sorted(r.error_type for _, r in rejected) == sorted(
        ["DeviceNotFound"] * CFG.unknown_device_readings + ["UnitMismatch"] * CFG.wrong_unit_readings
        + ["DeviceNotActive"] * CFG.decommissions + ["DeviceAlreadyRegistered"] * CFG.duplicate_registrations)
    for c, r in rejected:
        assert {"DeviceNotFound": "-unknown-", "UnitMismatch": "-wrong-unit-",
                "DeviceNotActive": "-after-decommission"}.get(r.error_type, "") in c.payload.get("reading_id", "")
    decommissioned = [c.aggregate_id for c, r, e in decided if e and e[0].event_type == "DeviceDecommissioned"]
    assert len(decommissioned) == CFG.decommissions


def _in_range_runs(decided, states):
    """Per device, the lengths of its maximal runs of out-of-range readings in measured (event-time) order."""
    readings = defaultdict(list)
    for c, r, events in decided:
        for e in events:
            if e.event_type == "ReadingRecorded":
                readings[c.aggregate_id].append((e.occurred_at, e.payload["value_milli"]))
    runs = defaultdict(list)
    for device, values in readings.items():
        s, length = states[device], 0
        for _, value in sorted(values) + [(None, s.range_min_milli)]:
            if s.range_min_milli <= value <= s.range_max_milli:
                if length:
                    runs[device].append(length)
                length = 0
            else:
                length += 1
    return runs


def test_out_of_range_runs_of_three_or_more_and_short_runs_of_two_each_on_a_device_of_its_own():
    decided, states = _run(CFG)
    runs = _in_range_runs(decided, states)
    assert all(len(found) == 1 for found in runs.values())
    lengths = sorted(found[0] for found in runs.values())
    assert lengths[:CFG.short_out_of_range_runs] == [2] * CFG.short_out_of_range_runs
    assert len(lengths) == CFG.out_of_range_runs + CFG.short_out_of_range_runs
    assert all(3 <= n <= 5 for n in lengths[CFG.short_out_of_range_runs:])


def test_some_readings_arrive_late_behind_readings_measured_after_them():
    decided, _ = _run(CFG)
    late = out_of_order = 0
    newest = {}
    for c, r, events in decided:
        if c.command_type != "RecordReading" or not r.accepted:
            continue
        measured = parse_time(c.payload["measured_at"], "measured_at")
        late += parse_time(c.issued_at, "issued_at") - measured >= timedelta(minutes=1)
        out_of_order += measured < newest.get(c.aggregate_id, measured)
        newest[c.aggregate_id] = max(newest.get(c.aggregate_id, measured), measured)
    assert late >= 10 and out_of_order >= 10


def test_a_silent_device_stops_reporting_halfway_without_being_decommissioned():
    decided, states = _run(CFG)
    last = {}
    for c, r, events in decided:
        if r.accepted and events and events[0].event_type == "ReadingRecorded":
            last[c.aggregate_id] = max(last.get(c.aggregate_id, events[0].occurred_at), events[0].occurred_at)
    end = CFG.start + timedelta(minutes=CFG.minutes)
    silent = [d for d, t in last.items() if states[d].status == "active"
              and end - parse_time(t, "measured_at") > timedelta(seconds=states[d].heartbeat_interval_s)]
    assert len(silent) == CFG.silent_devices
    assert end - parse_time(last[silent[0]], "t") >= timedelta(minutes=CFG.minutes / 2) - timedelta(seconds=60)


@pytest.mark.parametrize("change, message", [({"devices": 5}, "devices=5 is too few for its cases"),
                                             ({"minutes": 9}, "minutes=9; at least 10 minutes")])
def test_a_config_too_small_for_its_cases_is_refused_naming_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        list(generate_iot_commands(IotGeneratorConfig(**change)))


def test_eventlake_generate_defaults_to_accounts_and_takes_iot():
    from eventlake.cli import build_parser

    assert build_parser().parse_args(["generate"]).domain == "accounts"
    args = build_parser().parse_args(["generate", "--domain", "iot", "--devices", "12"])
    assert (args.domain, args.devices) == ("iot", 12)
