"""The fraud rules of the reference domain, as pure functions over one account's events (no Spark, no Kafka).

``detect(state, event)`` folds one event (in aggregate-version order) into the detector's state and returns
the findings it causes. Times are epoch milliseconds of event time. The rules (docs/DESIGN.md):

1. ``rapid_attempts``: two or more payment attempts (authorized or declined) within 10 seconds of event time;
   the later one (in event time) is flagged.
2. ``amount_above_max``: a payment attempt larger than the largest previous one of the account; the first
   payment is never flagged.
3. ``location_mismatch``: a payment whose location differs from the account's last reported device location
   at that event time; no device location reported by then: no flag.

A finding's ``command_id`` derives from the payment and the rule, so a replay flags nothing twice.

Event time cannot poison the state: the bounded history (the last ``_HISTORY`` attempts and device reports)
keeps the most recently *received* entries, not the latest in event time. Kept by event time, an entry dated
far in the future (a payment at 9998-12-31, written straight into the log) would never be evicted, and enough
of them would evict every normal entry as soon as it arrived (no rapid attempt, no device location found for
the account's later payments). Received order ages an outlier out like any entry; while it stays, it only
meets events within 10 s of its own time (rule 1) or after it (rule 3), as event time says.
"""
from __future__ import annotations

import uuid
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
    attempts: tuple[tuple[int, str], ...] = ()          # (time_ms, payment_id), in the order received
    devices: tuple[tuple[int, str], ...] = ()           # (time_ms, location), in the order received


def flag_command_id(payment_id: str, rule: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{payment_id}/{rule}"))


def detect(state: FraudState, event: Observation) -> tuple[FraudState, list[Finding]]:
    """Fold one event; events at or below the last seen version are replays and change nothing."""
    if event.aggregate_version <= state.last_version:
        return state, []
    state = replace(state, last_version=event.aggregate_version)
    if event.event_type == "DeviceLocationReported":
        return replace(state, devices=(*state.devices, (event.time_ms, event.location))[-_HISTORY:]), []
    if event.event_type not in ("PaymentAuthorized", "PaymentDeclined"):
        return state, []

    findings = []
    t, pid = event.time_ms, event.payment_id
    # Rule 1: attempts within 10 s of each other; the later one in event time is the suspicious one.
    lo, hi = t - RAPID_WINDOW_MS, t + RAPID_WINDOW_MS
    for other_t, other_pid in [a for a in state.attempts if lo <= a[0] <= hi]:  # a comprehension: the hot loop
        later_t, later_pid, earlier_pid = (t, pid, other_pid) if t >= other_t else (other_t, other_pid, pid)
        findings.append(Finding(later_pid, "rapid_attempts", later_t,
                                f"payment {earlier_pid} {abs(other_t - t) / 1000:.1f}s apart"))
    # Rule 2: larger than every earlier attempt.
    if state.max_amount is not None and event.amount_minor > state.max_amount:
        findings.append(Finding(pid, "amount_above_max", t,
                                f"amount {event.amount_minor} > previous max {state.max_amount}"))
    # Rule 3: the device's location at that event time: the last report at or before it (of two reports at the
    # same time, the one received later).
    device = _device_at(state.devices, t)
    if device is not None and device != event.location:
        findings.append(Finding(pid, "location_mismatch", t, f"payment at {event.location}, device at {device}"))

    max_amount = event.amount_minor if state.max_amount is None else max(state.max_amount, event.amount_minor)
    # A payment flagged twice for rapid attempts (two neighbours) is one finding.
    unique = list({(f.payment_id, f.rule): f for f in findings}.values())
    attempts = (*state.attempts, (t, pid))[-_HISTORY:]
    return replace(state, attempts=attempts, max_amount=max_amount), unique


def _device_at(devices: tuple[tuple[int, str], ...], t: int) -> str | None:
    """The location of the latest report at or before ``t`` (``devices`` in received order), or None."""
    best_time, best = None, None
    for time_ms, location in devices:
        if time_ms <= t and (best_time is None or time_ms >= best_time):
            best_time, best = time_ms, location
    return best
