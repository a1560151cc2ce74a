"""The telemetry detector's rules, as pure functions over one device's events (no Spark, no Kafka).

``detect(state, observation)`` folds one event (in aggregate-version order, the order the log has them) into the
detector's state and returns the findings it causes; ``on_timer(state, now_ms)`` is what an event-time timer
calls, for the rule no arriving event can trigger. Times are epoch milliseconds of event time (a reading's
``measured_at``). A finding becomes a ``FlagTelemetryAnomaly`` command whose ``command_id`` is
``flag_command_id(device, rule, finding.anchor)``, so a replay flags nothing twice.

1. ``out_of_range_run``: ``RUN_LENGTH`` (3) or more readings in a row outside the device's registered range
   (``range_min_milli`` .. ``range_max_milli``, inclusive), "in a row" in event time: the readings ordered by
   ``measured_at`` (ties by version), not as they arrived; consecutive readings, whatever the time between them
   (a long pause is the silence rule's business). One finding per run, when the run first reaches 3 readings;
   readings that extend it later, on either side, are part of the same run and flag nothing.
   Out of order: each reading is placed by its ``measured_at`` among the last ``_HISTORY`` readings received, so a
   late reading can complete a run (an out-of-range reading measured next to a run of 2: one finding, anchored on
   the late reading), extend a run already reported (nothing), or split one (an in-range reading measured inside
   it: nothing; both parts were reported). A reading older than every reading kept is judged against those kept
   only (bounded state).
2. ``silent_device``: no reading for more than the heartbeat interval (``heartbeat_interval_s``) after the
   newest event time the device is known at (its registration, or its newest reading's ``measured_at``:
   ``last_seen_ms``). Absence of events, so a timer: ``on_timer`` fires when ``now_ms > last_seen_ms + heartbeat``,
   once per silence; ``next_timer_ms`` says when to set the timer. The silence ends (the rule is re-armed) with
   a reading measured after the silence's deadline (``last_seen_ms + heartbeat``); a late reading measured before
   the deadline moves ``last_seen_ms`` but is no new silence. A decommissioned device is never silent (a silence
   not flagged before the decommission was processed is not flagged at all).

The handler refuses readings dated far beyond its clock (``EventTimeLimit``), so one reading cannot postpone
the silence rule indefinitely.
"""
from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass, replace

__all__ = ["TelemetryState", "Observation", "Finding", "detect", "on_timer", "next_timer_ms", "flag_command_id",
           "encode_state", "decode_state", "RULES", "RUN_LENGTH", "OUT_OF_RANGE_RUN", "SILENT_DEVICE"]

OUT_OF_RANGE_RUN = "out_of_range_run"
SILENT_DEVICE = "silent_device"
RULES = (OUT_OF_RANGE_RUN, SILENT_DEVICE)
RUN_LENGTH = 3
_HISTORY = 64  # readings kept per device, by received order: bounds the state
_EVIDENCE_READINGS = 5  # readings named in a run's evidence
_NAMESPACE = uuid.UUID("5d1e6a2b-8c4f-4b7e-9a3d-2f6c1b0e7d94")


@dataclass(frozen=True)
class Observation:
    """The parts of a device event the rules look at (``time_ms``: the event's occurred_at; a reading's
    measured_at)."""
    event_type: str
    aggregate_version: int
    time_ms: int
    reading_id: str | None = None
    value_milli: int | None = None
    range_min_milli: int | None = None
    range_max_milli: int | None = None
    heartbeat_interval_s: int | None = None


@dataclass(frozen=True)
class Finding:
    rule: str
    time_ms: int  # the finding's event time: the completing reading's measured_at; a silence's deadline
    anchor: str  # what the finding is about, for its command id: a reading id, or "since:<last_seen_ms>"
    reading_id: str | None  # the reading that completed the run; the last reading before a silence (or none)
    evidence: str


@dataclass(frozen=True)
class _Reading:
    time_ms: int
    version: int
    reading_id: str
    out_of_range: bool
    flagged: bool = False  # part of a run already reported


@dataclass(frozen=True)
class TelemetryState:
    last_version: int = 0
    registered: bool = False
    decommissioned: bool = False
    range_min_milli: int = 0
    range_max_milli: int = 0
    heartbeat_ms: int = 0
    readings: tuple[_Reading, ...] = ()  # the last _HISTORY readings, in the order received
    last_seen_ms: int | None = None  # newest event time of the registration and every reading
    last_seen_reading: str | None = None  # the reading measured at last_seen_ms (None: the registration)
    silent_since_ms: int | None = None  # last_seen_ms of the silence flagged and not ended yet


def flag_command_id(device_id: str, rule: str, anchor: str) -> str:
    """The FlagTelemetryAnomaly command id of a finding: the same finding always gets the same id."""
    return str(uuid.uuid5(_NAMESPACE, f"{device_id}/{rule}/{anchor}"))


def detect(state: TelemetryState, event: Observation) -> tuple[TelemetryState, list[Finding]]:
    """Fold one event; events at or below the last seen version are replays and change nothing."""
    if event.aggregate_version <= state.last_version:
        return state, []
    state = replace(state, last_version=event.aggregate_version)
    if event.event_type == "DeviceRegistered":
        return _seen(replace(state, registered=True, range_min_milli=event.range_min_milli,
                             range_max_milli=event.range_max_milli,
                             heartbeat_ms=event.heartbeat_interval_s * 1000), event.time_ms, None), []
    if event.event_type == "DeviceDecommissioned":
        return replace(state, decommissioned=True), []
    if event.event_type != "ReadingRecorded":
        return state, []

    t = event.time_ms
    if state.silent_since_ms is not None and t > state.silent_since_ms + state.heartbeat_ms:
        state = replace(state, silent_since_ms=None)  # the device reported after its silence: re-armed
    state = _seen(state, t, event.reading_id)
    out = not state.range_min_milli <= event.value_milli <= state.range_max_milli
    new = _Reading(t, event.aggregate_version, event.reading_id, out)
    readings = (*state.readings, new)[-_HISTORY:]
    if not out:
        return replace(state, readings=readings), []
    ordered = sorted(readings, key=lambda r: (r.time_ms, r.version))
    at = next(i for i, r in enumerate(ordered) if r is new)
    first = at
    while first > 0 and ordered[first - 1].out_of_range:
        first -= 1
    last = at
    while last + 1 < len(ordered) and ordered[last + 1].out_of_range:
        last += 1
    run = ordered[first:last + 1]
    findings = []
    if len(run) >= RUN_LENGTH and not any(r.flagged for r in run):
        named = ", ".join(r.reading_id for r in run[:_EVIDENCE_READINGS]) + (", ..." if len(run) > _EVIDENCE_READINGS else "")
        findings.append(Finding(
            OUT_OF_RANGE_RUN, t, event.reading_id, event.reading_id,
            f"{len(run)} consecutive readings (by measured_at) outside [{state.range_min_milli}, "
            f"{state.range_max_milli}] milli: {named}; this one {event.value_milli}"))
    if findings or any(r.flagged for r in run):
        # The run is reported (now or before): every reading in it is, so no part of it is reported again.
        run_ids = {id(r) for r in run}
        readings = tuple(replace(r, flagged=True) if id(r) in run_ids else r for r in readings)
    return replace(state, readings=readings), findings


def _seen(state: TelemetryState, t: int, reading_id: str | None) -> TelemetryState:
    if state.last_seen_ms is not None and t <= state.last_seen_ms:
        return state
    return replace(state, last_seen_ms=t, last_seen_reading=reading_id)


def next_timer_ms(state: TelemetryState) -> int | None:
    """The event time at which ``on_timer`` would find the device silent (the first instant past its heartbeat),
    or None when no silence can be flagged now (not registered, decommissioned, or a silence already flagged)."""
    if not state.registered or state.decommissioned or state.silent_since_ms is not None \
            or state.last_seen_ms is None:
        return None
    return state.last_seen_ms + state.heartbeat_ms + 1


def on_timer(state: TelemetryState, now_ms: int) -> tuple[TelemetryState, list[Finding]]:
    """The silence rule at event time ``now_ms`` (the detector's watermark when its timer fires): one finding
    when the device has been silent for more than its heartbeat and that silence is not flagged yet."""
    due = next_timer_ms(state)
    if due is None or now_ms < due:
        return state, []
    deadline = state.last_seen_ms + state.heartbeat_ms
    after = f"reading {state.last_seen_reading}" if state.last_seen_reading else "registration"
    finding = Finding(SILENT_DEVICE, deadline, f"since:{state.last_seen_ms}", state.last_seen_reading,
                      f"no reading for {(now_ms - state.last_seen_ms) / 1000:.1f}s after the {after} at "
                      f"{state.last_seen_ms} ms (heartbeat {state.heartbeat_ms // 1000}s)")
    return replace(state, silent_since_ms=state.last_seen_ms), [finding]


def encode_state(state: TelemetryState) -> str:
    """The state as JSON text (what a streaming detector keeps per device between batches); readings as lists."""
    fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    fields["readings"] = [dataclasses.astuple(r) for r in state.readings]
    return json.dumps(fields, separators=(",", ":"))


def decode_state(text: str) -> TelemetryState:
    """The state ``encode_state`` wrote."""
    fields = json.loads(text)
    fields["readings"] = tuple(_Reading(*r) for r in fields["readings"])
    return TelemetryState(**fields)
