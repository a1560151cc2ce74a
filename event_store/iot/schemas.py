"""Payload schemas of the IoT telemetry domain's commands and events (the ``device`` aggregate).

Built from the generic pieces of ``event_store.fields``, like the account's. A reading's value is carried the way
money is: an integer, here in thousandths of the device's unit (``value_milli``: 21.5 C is 21500), never a JSON
float. Integers are read exactly by every reader of the log (Python, msgspec, Spark longs, DuckDB, pyarrow), sums
of them are exact and do not depend on the order they are added in (a replay or a late reading gives the same
minute sums, and averages are exact), and there is no NaN or Infinity to refuse: a JSON float (``21.5``,
``1e3``) is refused as "must be int". The bound keeps a sum of ten million readings inside 64 bits.
"""
from __future__ import annotations

from event_store.fields import ID, OPTIONAL_ID, OPTIONAL_TIME, TIME, Field

__all__ = ["COMMANDS", "EVENTS", "EVENT_SCHEMA_VERSIONS", "VALUE_MAX_MILLI", "HEARTBEAT_MAX_S", "MILLI"]

# Thousandths of a unit per unit: value_milli = round(value * MILLI).
MILLI = 1000
# |value_milli| <= 10^12 (a billion units): 9.2 million readings' sum still fits a signed 64-bit integer.
VALUE_MAX_MILLI = 10 ** 12
# The longest heartbeat interval a device may declare: one week.
HEARTBEAT_MAX_S = 7 * 24 * 3600

# Full matches written with \A ... \Z, as in event_store.fields. ASCII classes only: Python's \S and Java's (the
# Spark checks) disagree on non-ASCII whitespace.
_UNIT_PATTERN = r"\A[A-Za-z0-9%/._^-]{1,16}\Z"
_KIND_PATTERN = r"\A[a-z][a-z0-9_]{0,63}\Z"

_VALUE = Field(int, gt=-VALUE_MAX_MILLI - 1, le=VALUE_MAX_MILLI)
_UNIT = Field(str, pattern=_UNIT_PATTERN, describe="a unit code of 1 to 16 characters like 'C', '%RH' or 'hPa'")
_KIND = Field(str, pattern=_KIND_PATTERN, describe="a lower-case sensor kind like 'temperature'")
_HEARTBEAT = Field(int, gt=0, le=HEARTBEAT_MAX_S)
_REASON = Field(str, required=False)

_DEVICE = {"site_id": ID, "sensor_kind": _KIND, "unit": _UNIT,
           # The allowed range, inclusive, in thousandths of ``unit``; the aggregate requires min < max.
           "range_min_milli": _VALUE, "range_max_milli": _VALUE,
           # How often the device reports; a detector flags it silent after longer than this without a reading.
           "heartbeat_interval_s": _HEARTBEAT}

COMMANDS: dict[str, dict[str, Field]] = {
    # The device id is the aggregate id.
    "RegisterDevice": dict(_DEVICE),
    # ``reading_id`` names the reading (what an anomaly refers to); ``measured_at`` is its event time, which may
    # be long before the command arrives and before readings already recorded (late, out of order).
    "RecordReading": {"reading_id": ID, "value_milli": _VALUE, "unit": _UNIT, "measured_at": TIME},
    "DecommissionDevice": {"reason": _REASON},
    # Sent by a telemetry detector, like the account's FlagFraud: its command_id derives from the device, the
    # rule and the reading (or the silence it found), so a replayed detector flags nothing twice. ``reading_id``
    # is the reading that completed the finding; a silent device's finding may have none. ``occurred_at``: the
    # finding's event time (default: issued_at).
    "FlagTelemetryAnomaly": {"rule": ID, "reading_id": OPTIONAL_ID, "evidence": Field(str, required=False),
                             "occurred_at": OPTIONAL_TIME},
    # An operator's decision on a quarantined device (a record of it in the events topic cannot be read), as
    # the account's ResolveQuarantine (type names are unique across domains).
    "ResolveDeviceQuarantine": {"record": ID, "reason": ID, "resolved_by": ID},
}

EVENTS: dict[str, dict[str, Field]] = {
    "DeviceRegistered": dict(_DEVICE),
    # The envelope's occurred_at is the reading's measured_at.
    "ReadingRecorded": {"reading_id": ID, "value_milli": _VALUE, "unit": _UNIT},
    "DeviceDecommissioned": {"reason": _REASON},
    "TelemetryAnomalyDetected": {"rule": ID, "reading_id": OPTIONAL_ID, "evidence": Field(str, required=False)},
    "DeviceQuarantineResolved": {"record": ID, "reason": ID, "resolved_by": ID,
                                 "evidence": Field(str, required=False)},
}

# Every event type is at version 1: the domain has no upcasters yet.
EVENT_SCHEMA_VERSIONS: dict[str, int] = {name: 1 for name in EVENTS}
