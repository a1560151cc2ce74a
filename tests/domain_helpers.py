"""Test helpers: a generated command stream turned into events by the pure core (no Kafka)."""
from __future__ import annotations

from typing import Iterable

from event_store.account import AccountState
from event_store.decider import execute
from event_store.envelope import CommandEnvelope, EventEnvelope
from event_store.errors import InvalidRecord
from eventlake.generator import (GeneratorConfig, IotGeneratorConfig, decide_all, generate_commands,
                                 generate_iot_commands, interleaved)

__all__ = ["events_for", "events_of", "iot_events_for", "interleaved"]


def events_for(cfg: GeneratorConfig, flag_every: int = 0, forget_after: int = 0) -> list[EventEnvelope]:
    """The events the command handler would append for ``cfg``'s commands, in log order; with ``flag_every``
    every n-th payment is also flagged (FlagFraud), as the fraud detector would; with ``forget_after``, the customer
    of the first account opened is forgotten after that many commands (ForgetSubject on each of their accounts, as
    ``eventlake forget`` sends it: a SubjectForgotten each, and their later commands are refused)."""
    states: dict[str, AccountState] = {}
    events: list[EventEnvelope] = []
    for n, (_, raw) in enumerate(generate_commands(cfg), 1):
        if n == forget_after + 1 and forget_after:
            customer = next(e.payload["customer_id"] for e in events if e.event_type == "AccountOpened")
            for account, state in sorted(states.items()):
                if state.customer_id == customer:
                    forget = CommandEnvelope.create("ForgetSubject", account, {"customer_id": customer})
                    states[account], new, _ = execute(state, forget, recorded_at="2026-02-01T00:00:00.000Z")
                    events += new
        try:
            command = CommandEnvelope.from_json(raw)
        except InvalidRecord:
            continue
        state = states.get(command.aggregate_id) or AccountState(command.aggregate_id)
        states[command.aggregate_id], new, _ = execute(state, command, recorded_at="2026-02-01T00:00:00.000Z")
        events += new
        payments = [e for e in new if e.event_type.startswith("Payment")]
        if flag_every and payments and sum(e.event_type.startswith("Payment") for e in events) % flag_every == 0:
            p = payments[0]
            flag = CommandEnvelope.create("FlagFraud", command.aggregate_id, {
                "payment_id": p.payload["payment_id"], "rule": "large_amount", "occurred_at": p.occurred_at,
                "evidence": f"amount {p.payload['amount_minor']}"})
            states[command.aggregate_id], new, _ = execute(states[command.aggregate_id], flag,
                                                           recorded_at="2026-02-01T00:00:01.000Z")
            events += new
    return events


def events_of(records: Iterable[tuple[str, bytes]], recorded_at: str = "2026-02-01T00:00:00.000Z"
              ) -> list[EventEnvelope]:
    """The events the command handler would append for ``records`` (any registered domain's commands, as
    (key, JSON) pairs), in log order; rejected and unreadable commands append nothing."""
    return decide_all(records, recorded_at)[0]


def iot_events_for(cfg: IotGeneratorConfig, flag_every: int = 0) -> list[EventEnvelope]:
    """The device events for ``cfg``'s commands; with ``flag_every`` every n-th reading is also flagged
    (FlagTelemetryAnomaly), as the telemetry detector would."""
    records = list(generate_iot_commands(cfg))
    if flag_every:
        flagged = []
        for n, e in enumerate(e for e in events_of(records) if e.event_type == "ReadingRecorded"):
            if n % flag_every == 0:
                flagged.append((e.aggregate_id, CommandEnvelope.create("FlagTelemetryAnomaly", e.aggregate_id, {
                    "rule": "out_of_range_run", "reading_id": e.payload["reading_id"],
                    "occurred_at": e.occurred_at, "evidence": f"value {e.payload['value_milli']}"},
                    aggregate_type="device").to_json()))
        records += flagged
    return events_of(records)

