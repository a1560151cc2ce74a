"""The ``device`` aggregate: pure ``decide(state, command)`` and ``evolve(state, event)`` for IoT telemetry.

No Kafka here. A device is registered once (its id is never reused), records readings in its one unit while
active, and is decommissioned for good. Readings are recorded whatever their value: a value outside the
device's range is data, and the telemetry detector (not the aggregate) decides when a run of them is an
anomaly, which it reports with ``FlagTelemetryAnomaly``. Late and out-of-order readings are recorded as they
come: the reading's ``measured_at`` is its event time, and the aggregate does not order readings.

The state stays the same size however many readings a device sends (a device reports forever, unlike an
account's payments): no reading ids are kept. A reading re-sent with its command_id is answered from the
handler's idempotency window; a reading re-sent under a new command_id is recorded again, so a sender derives a
reading's command_id from the device and its reading id.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from event_store.domain import Command, CommandRejected, Event, NewEvent, decide_quarantine

__all__ = ["DeviceState", "NewEvent", "CommandRejected", "decide", "evolve", "evolve_fields", "quarantined",
           "encode_state", "decode_state", "AGGREGATE_TYPE", "STATUSES"]

AGGREGATE_TYPE = "device"
STATUSES = ("active", "decommissioned")


@dataclass(frozen=True)
class DeviceState:
    device_id: str
    version: int = 0
    registered: bool = False
    status: str = "active"
    site_id: str | None = None
    sensor_kind: str | None = None
    unit: str | None = None
    range_min_milli: int = 0
    range_max_milli: int = 0
    heartbeat_interval_s: int = 0
    readings_recorded: int = 0
    anomalies_detected: int = 0
    # (record, reason) when the events topic holds a record of this device that cannot be read (record is
    # "topic/partition/offset"): the device takes no command but ResolveDeviceQuarantine until an operator decides.
    quarantine: tuple[str, str] | None = None


def decide(state: DeviceState, command: Command) -> list[NewEvent]:
    """The events ``command`` causes on ``state`` (possibly none), or CommandRejected."""
    p = command.payload
    kind = command.command_type
    if state.quarantine is not None or kind == "ResolveDeviceQuarantine":
        return _decide_quarantine(state, command)
    if kind == "RecordReading" and state.registered and state.status == "active":  # the frequent case first
        if p["unit"] != state.unit:
            raise CommandRejected(
                "UnitMismatch", f"reading {p['reading_id']} of device {state.device_id} is in {p['unit']!r}, but "
                                f"the device measures {state.sensor_kind} in {state.unit!r}; convert it, or "
                                f"register a device for that unit")
        return [NewEvent("ReadingRecorded", {"reading_id": p["reading_id"], "value_milli": p["value_milli"],
                                             "unit": p["unit"]}, p["measured_at"])]
    if kind == "RegisterDevice":
        if state.registered:
            raise CommandRejected(
                "DeviceAlreadyRegistered",
                f"device {state.device_id} is already registered ({state.status}, {state.sensor_kind} at site "
                f"{state.site_id}); a device id is registered once and never reused")
        low, high = p["range_min_milli"], p["range_max_milli"]
        if low >= high:
            raise CommandRejected(
                "InvalidDeviceRange", f"device {state.device_id}: range_min_milli {low} must be below "
                                      f"range_max_milli {high} (the allowed range, in thousandths of {p['unit']})")
        return [NewEvent("DeviceRegistered", {name: p[name] for name in (
            "site_id", "sensor_kind", "unit", "range_min_milli", "range_max_milli", "heartbeat_interval_s")},
            command.issued_at)]
    if not state.registered:
        raise CommandRejected("DeviceNotFound",
                              f"device {state.device_id} is not registered; send RegisterDevice first"
                              + (f" (reading {p['reading_id']} not recorded)" if kind == "RecordReading" else ""))
    if kind == "RecordReading":  # registered, so decommissioned
        raise CommandRejected(
            "DeviceNotActive", f"device {state.device_id} is decommissioned; reading {p['reading_id']} "
                               f"(measured at {p['measured_at']}) is not recorded")
    if kind == "DecommissionDevice":
        # Decommissioning a decommissioned device changes nothing: accepted, no event (it may be sent twice).
        if state.status == "decommissioned":
            return []
        return [NewEvent("DeviceDecommissioned", {"reason": p.get("reason")}, command.issued_at)]
    if kind == "FlagTelemetryAnomaly":
        # Also on a decommissioned device: a finding about readings it recorded while active. Idempotent by its
        # command_id, which the detector derives from the device, the rule and the reading.
        return [NewEvent("TelemetryAnomalyDetected", {"rule": p["rule"], "reading_id": p.get("reading_id"),
                                                      "evidence": p.get("evidence")},
                         p.get("occurred_at") or command.issued_at)]
    raise CommandRejected("UnknownCommand", f"command type {kind!r} is not handled by the device aggregate")


def _decide_quarantine(state: DeviceState, command: Command) -> list[NewEvent]:
    return decide_quarantine(f"device {state.device_id}", state.quarantine, command, "ResolveDeviceQuarantine",
                             "DeviceQuarantineResolved", "DeviceQuarantined",
                             lambda record: f"an operator sends ResolveDeviceQuarantine with record {record!r} "
                                            f"(eventlake submit)")


def quarantined(state: DeviceState, record: str, reason: str) -> DeviceState:
    """``state`` once a record of it (``record``: "topic/partition/offset") turned out unreadable. The first
    such record stands until resolved."""
    return state if state.quarantine is not None else replace(state, quarantine=(record, reason))


def evolve(state: DeviceState, event: Event) -> DeviceState:
    """``state`` after ``event``. Envelopes also advance ``version``; bare NewEvents do not."""
    return evolve_fields(state, event.event_type, event.payload, getattr(event, "aggregate_version", None))


def evolve_fields(state: DeviceState, kind: str, p: Mapping[str, Any], version: int | None) -> DeviceState:
    """``evolve`` from an event's type, payload and (if not None) aggregate version, without an envelope."""
    changes: dict = {} if version is None else {"version": version}
    if kind == "ReadingRecorded":
        changes["readings_recorded"] = state.readings_recorded + 1
    elif kind == "DeviceRegistered":
        changes.update(registered=True, status="active", site_id=p["site_id"], sensor_kind=p["sensor_kind"],
                       unit=p["unit"], range_min_milli=p["range_min_milli"], range_max_milli=p["range_max_milli"],
                       heartbeat_interval_s=p["heartbeat_interval_s"])
    elif kind == "DeviceDecommissioned":
        changes["status"] = "decommissioned"
    elif kind == "TelemetryAnomalyDetected":
        changes["anomalies_detected"] = state.anomalies_detected + 1
    elif kind == "DeviceQuarantineResolved":
        if state.quarantine is not None and state.quarantine[0] == p["record"]:
            changes["quarantine"] = None
    else:
        raise ValueError(f"device aggregate cannot apply unknown event type {kind!r}")
    return replace(state, **changes) if changes else state


def encode_state(state: DeviceState) -> dict:
    """The state as a JSON object (its snapshot form)."""
    fields = dict(state.__dict__)
    fields["quarantine"] = list(state.quarantine) if state.quarantine else None
    return fields


def decode_state(fields: dict) -> DeviceState:
    """The state ``encode_state`` wrote."""
    fields = dict(fields)
    fields["quarantine"] = tuple(fields["quarantine"]) if fields.get("quarantine") else None
    return DeviceState(**fields)
