"""The fraud rules of the reference domain, as pure functions over one account's events (no Spark, no Kafka).

``detect(state, event)`` folds one event (in aggregate-version order) into the detector's state and returns
the findings it causes. Times are epoch milliseconds of event time. The rules (DESIGN.md):

1. ``rapid_attempts``: two or more payment attempts (authorized or declined) within 10 seconds of event time;
   the later one (in event time) is flagged.
2. ``amount_above_max``: a payment attempt larger than the largest previous one of the account; the first
   payment is never flagged.
3. ``location_mismatch``: a payment whose location differs from the account's last reported device location
   at that event time; no device location reported by then: no flag.

A finding's ``command_id`` derives from the payment and the rule, so a replay flags nothing twice.
"""
from __future__ import annotations

import uuid
from bisect import bisect_right, insort
from dataclasses import dataclass, replace

__all__ = ["FraudState", "Finding", "Observation", "detect", "flag_command_id", "RULES", "RAPID_WINDOW_MS"]

RAPID_WINDOW_MS = 10_000
RULES = ("rapid_attempts", "amount_above_max", "location_mismatch")
_HISTORY = 64  # attempts and device locations kept per account: bounds the state
_NAMESPACE = uuid.UUID("0b5a7f4e-2c1d-4f6a-8e3b-9d7c6a5b4e3f")


@dataclass(frozen=True)
class Observation:
    """The parts of an event the rules look at."""
    event_type: str
    aggregate_version: int
    time_ms: int
    payment_id: str | None = None
    amount_minor: int | None = None
    location: str | None = None


@dataclass(frozen=True)
class Finding:
    payment_id: str
    rule: str
    time_ms: int
    evidence: str


@dataclass(frozen=True)
class FraudState:
    last_version: int = 0
    max_amount: int | None = None
    attempts: tuple[tuple[int, str], ...] = ()          # (time_ms, payment_id), sorted by time
    devices: tuple[tuple[int, str], ...] = ()           # (time_ms, location), sorted by time


def flag_command_id(payment_id: str, rule: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{payment_id}/{rule}"))


def detect(state: FraudState, event: Observation) -> tuple[FraudState, list[Finding]]:
    """Fold one event; events at or below the last seen version are replays and change nothing."""
    if event.aggregate_version <= state.last_version:
        return state, []
    state = replace(state, last_version=event.aggregate_version)
    if event.event_type == "DeviceLocationReported":
        devices = list(state.devices)
        insort(devices, (event.time_ms, event.location))
        return replace(state, devices=tuple(devices[-_HISTORY:])), []
    if event.event_type not in ("PaymentAuthorized", "PaymentDeclined"):
        return state, []

    findings = []
    t, pid = event.time_ms, event.payment_id
    # Rule 1: attempts within 10 s of each other; the later one in event time is the suspicious one.
    for other_t, other_pid in state.attempts:
        if abs(other_t - t) <= RAPID_WINDOW_MS:
            later_t, later_pid, earlier_pid = (t, pid, other_pid) if t >= other_t else (other_t, other_pid, pid)
            findings.append(Finding(later_pid, "rapid_attempts", later_t,
                                    f"payment {earlier_pid} {abs(other_t - t) / 1000:.1f}s apart"))
    # Rule 2: larger than every earlier attempt.
    if state.max_amount is not None and event.amount_minor > state.max_amount:
        findings.append(Finding(pid, "amount_above_max", t,
                                f"amount {event.amount_minor} > previous max {state.max_amount}"))
    # Rule 3: the device's location at that event time (the last report at or before it).
    i = bisect_right([d[0] for d in state.devices], t)
    if i > 0 and state.devices[i - 1][1] != event.location:
        findings.append(Finding(pid, "location_mismatch", t,
                                f"payment at {event.location}, device at {state.devices[i - 1][1]}"))

    attempts = list(state.attempts)
    insort(attempts, (t, pid))
    max_amount = event.amount_minor if state.max_amount is None else max(state.max_amount, event.amount_minor)
    # A payment flagged twice for rapid attempts (two neighbours) is one finding.
    unique = list({(f.payment_id, f.rule): f for f in findings}.values())
    return replace(state, attempts=tuple(attempts[-_HISTORY:]), max_amount=max_amount), unique
