"""Test helpers: a generated command stream turned into events by the pure core (no Kafka)."""
from __future__ import annotations

from event_store.account import AccountState
from event_store.envelope import CommandEnvelope, EventEnvelope, InvalidRecord
from event_store.handler import execute
from eventlake.generator import GeneratorConfig, generate_commands


def events_for(cfg: GeneratorConfig) -> list[EventEnvelope]:
    """The events the command handler would append for ``cfg``'s commands, in log order."""
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
    return events
