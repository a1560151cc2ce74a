"""Test helpers: a generated command stream turned into events by the pure core (no Kafka)."""
from __future__ import annotations

from event_store.account import AccountState
from event_store.decider import execute
from event_store.envelope import CommandEnvelope, EventEnvelope
from event_store.errors import InvalidRecord
from eventlake.generator import GeneratorConfig, generate_commands


def events_for(cfg: GeneratorConfig, flag_every: int = 0) -> list[EventEnvelope]:
    """The events the command handler would append for ``cfg``'s commands, in log order; with ``flag_every``
    every n-th payment is also flagged (FlagFraud), as the fraud detector would."""
    states: dict[str, AccountState] = {}
    events: list[EventEnvelope] = []
    for _, raw in generate_commands(cfg):
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
