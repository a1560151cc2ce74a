"""The pure decider of the write side: a command and an aggregate's state in, events and a result out.

The command goes to the domain of its ``aggregate_type`` (``event_store.domains``), and every domain gets the
same treatment: ``expected_version`` is checked here, before the domain's ``decide``; versions, ids and
timestamps are added here. ``execute`` runs the aggregate's ``decide`` and ``evolve`` (no Kafka, no clock
unless given one) and wraps the
new events in envelopes whose ids derive from the command id, so a batch redone after an aborted transaction
writes the same events. ``execute_encoded`` is the same, with the events already as JSON: the command handler's
hot path. The handler's transaction loop (``event_store.handler``) calls these and only these to decide.
See docs/DESIGN.md ("Guarantees").
"""
from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

from event_store.domain import CommandRejected, Domain, NewEvent
from event_store.domains import DOMAINS
from event_store.envelope import (CommandEnvelope, CommandResult, EventEnvelope, built, dumps, format_time, parse_time,
                                  utc_now)
from event_store.errors import InvalidRecord
from event_store.fields import time_fields
from event_store.schemas import COMMANDS, EVENT_SCHEMA_VERSIONS

__all__ = ["EVENT_ID_NAMESPACE", "execute", "execute_encoded", "event_id_for", "EventTimeLimit", "domain_for", "initial_state",
           "id_taken"]

# Event ids derive from the event's place in the log (aggregate type, id and version) and its command, so a batch
# redone after an aborted transaction writes the same ids, and two events never share one, even when clients
# reuse a command id on another aggregate or after it left the idempotency window (a shared id would make readers
# skip the second event as a repeat: the sequence gate, the handler's rebuild).
EVENT_ID_NAMESPACE = uuid.UUID("6f1c2b1e-7a4d-4e0b-9a59-3f0e2c1d8b71")
EVENT_ID_SHA1 = hashlib.sha1(EVENT_ID_NAMESPACE.bytes)


def event_id_for(aggregate_type: str, aggregate_id: str, version: int, command_id: str) -> str:
    """The id of the event at ``version`` of the aggregate, caused by ``command_id`` (deterministic, so redone
    batches match).

    ``uuid.uuid5(EVENT_ID_NAMESPACE, f"{aggregate_type}/{aggregate_id}/{version}/{command_id}")``, computed
    without building UUID objects."""
    sha1 = EVENT_ID_SHA1.copy()
    sha1.update(f"{aggregate_type}/{aggregate_id}/{version}/{command_id}".encode())
    h = sha1.hexdigest()
    # RFC 4122: version 5 in the high nibble of byte 6, variant 10 in the top bits of byte 8.
    return (f"{h[:8]}-{h[8:12]}-5{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:32]}")


_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


@dataclass(frozen=True)
class EventTimeLimit:
    """The latest event time (``occurred_at``) the handler accepts: its clock plus the allowed skew.

    One event dated far ahead would move every event-time watermark past all later events, so such a command
    is rejected before anything is written (settings.max_event_time_ahead_s)."""
    now: datetime
    max_ahead_s: float
    latest: datetime
    latest_second: str  # "YYYY-MM-DDTHH:MM:SS" of ``latest``: a text comparison settles the ordinary case

    @classmethod
    def at(cls, now: datetime, max_ahead_s: float) -> "EventTimeLimit":
        latest = now + timedelta(seconds=max_ahead_s)
        return cls(now, max_ahead_s, latest, latest.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"))

    def check(self, command: CommandEnvelope, new_events: Sequence[NewEvent]) -> None:
        """Raise CommandRejected (``EventTimeInFuture``) when an event of ``command`` lies beyond the limit."""
        for new in new_events:
            occurred_at = new.occurred_at
            # Schemas allow only "YYYY-MM-DDTHH:MM:SS[.fff](Z|+hh:mm)": a UTC time earlier than the limit's second
            # is fine as text; anything else (an offset, the same second or later) is parsed.
            if occurred_at[-1] == "Z" and occurred_at[:19] < self.latest_second:
                continue
            # The payload's time field the event time came from (a domain names its own: occurred_at,
            # measured_at, ...), else the envelope's issued_at.
            field_name = next((name for name in time_fields(COMMANDS[command.command_type])
                               if command.payload.get(name) == occurred_at), "issued_at")
            try:
                t = parse_time(occurred_at, f"command {command.command_id}: {field_name}")
            except InvalidRecord as e:
                raise CommandRejected("InvalidCommand", str(e)) from None
            except ValueError as e:  # e.g. out of range after the offset is applied
                raise CommandRejected("InvalidCommand", f"command {command.command_id}: {field_name} "
                                                        f"{occurred_at!r} is not a valid time ({e})") from None
            if t > self.latest:
                raise CommandRejected(
                    "EventTimeInFuture",
                    f"command {command.command_id}: {field_name} {occurred_at} ({new.event_type}) lies "
                    f"{(t - self.now).total_seconds():,.0f}s ahead of the handler's clock ({format_time(self.now)}); "
                    f"at most {self.max_ahead_s:,.0f}s ahead is accepted (max_event_time_ahead_s, "
                    f"EVENTLAKE_MAX_EVENT_TIME_AHEAD_S)")


_DOMAINS_GET = DOMAINS.get


def domain_for(command: CommandEnvelope) -> Domain:
    """The domain ``command`` goes to; CommandRejected (``InvalidCommand``) when none is registered for it (only a
    command built in code can get here: one read from JSON is routed, or rejected, by CommandEnvelope)."""
    domain = DOMAINS.get(command.aggregate_type)  # type: ignore[arg-type]
    if domain is None:
        raise CommandRejected("InvalidCommand",
                              f"command {command.command_id}: no domain is registered for aggregate_type "
                              f"{command.aggregate_type!r} (command_type {command.command_type!r}); known: "
                              f"{', '.join(DOMAINS)}")
    return domain


def initial_state(command: CommandEnvelope) -> Any:
    """The state of ``command``'s aggregate before any event (for callers that keep states themselves)."""
    return domain_for(command).initial(command.aggregate_id)


def _decide(state: Any, command: CommandEnvelope, time_limit: EventTimeLimit | None,
            sealer: Any = None) -> tuple[Domain, list[NewEvent]]:
    """The command's domain and the events it causes; CommandRejected for a stale ``expected_version`` (the
    same check for every domain), for what the domain refuses, and for events dated beyond ``time_limit``.
    With ``sealer`` (``event_store.sealing.Sealer``: personal data sealed), a forgotten data subject's command is
    refused before its domain decides, and the events' personal fields come back sealed: the domain decides on
    the plain values, the state and the log get tokens."""
    domain = _DOMAINS_GET(command.aggregate_type) or domain_for(command)  # one lookup on the hot path
    if command.expected_version is not None and command.expected_version != state.version:
        raise CommandRejected("ConcurrencyConflict",
                              f"expected version {command.expected_version} of {domain.aggregate_type} "
                              f"{command.aggregate_id}, but it is at version {state.version}")
    if sealer is not None:
        sealer.check(domain, state, command)
    new_events = domain.decide(state, command)
    if time_limit is not None and new_events:
        time_limit.check(command, new_events)
    if sealer is not None and new_events:
        new_events = sealer.seal(domain, state, command, new_events)
    return domain, new_events


def _rejection(state: Any, command: CommandEnvelope, e: CommandRejected, recorded_at: str) -> CommandResult:
    return CommandResult(command.command_id, command.aggregate_id, "rejected", state.version,
                         error_type=e.error_type, reason=e.reason, recorded_at=recorded_at)


def id_taken(state: Any, command: CommandEnvelope, owner: str, recorded_at: str) -> CommandResult:
    """The rejection of a command that would start an aggregate under an id another aggregate type already has.
    Aggregate ids are one namespace across domains: the topics are keyed by aggregate id, and the readers (the
    sequence gate, the idempotency window, the read models) know an aggregate by its id (docs/DESIGN.md,
    section 3)."""
    return _rejection(state, command, CommandRejected(
        "AggregateIdTaken",
        f"command {command.command_id}: aggregate id {command.aggregate_id!r} is taken by an aggregate of type "
        f"{owner!r}; a {command.aggregate_type!r} cannot have it (aggregate ids are unique across aggregate "
        f"types)"), recorded_at)


def _accepted(command: CommandEnvelope, state: Any, event_ids: list[str], recorded_at: str) -> CommandResult:
    return built(CommandResult, command_id=command.command_id, aggregate_id=command.aggregate_id,
                 status="accepted", version=state.version, event_ids=tuple(event_ids), error_type=None,
                 reason=None, recorded_at=recorded_at, duplicate=False)


def execute(state: Any, command: CommandEnvelope, recorded_at: str | None = None,
            time_limit: EventTimeLimit | None = None,
            sealer: Any = None) -> tuple[Any, list[EventEnvelope], CommandResult]:
    """Pure: the new state, the event envelopes to append and the command's result (no Kafka). ``state`` is
    the state of the command's aggregate (its domain's ``initial`` when it has no event yet). With
    ``time_limit`` (the handler's clock), events dated beyond it reject the command. With ``sealer``, personal
    fields are sealed (``_decide``)."""
    recorded_at = recorded_at or utc_now()
    try:
        domain, new_events = _decide(state, command, time_limit, sealer)
    except CommandRejected as e:
        return state, [], _rejection(state, command, e, recorded_at)
    command_id, aggregate_id = command.command_id, command.aggregate_id
    correlation_id = command.correlation_id or command_id
    aggregate_type, evolve = domain.aggregate_type, domain.evolve
    envelopes = []
    for i, new in enumerate(new_events):
        event_type = new.event_type
        event = built(EventEnvelope, event_id=event_id_for(aggregate_type, aggregate_id, state.version + 1, command_id),
                      event_type=event_type,
                      schema_version=EVENT_SCHEMA_VERSIONS[event_type], aggregate_type=aggregate_type,
                      aggregate_id=aggregate_id, aggregate_version=state.version + 1,
                      occurred_at=new.occurred_at, recorded_at=recorded_at, command_id=command_id,
                      correlation_id=correlation_id, causation_id=command_id, payload=new.payload)
        state = evolve(state, event)
        envelopes.append(event)
    return state, envelopes, _accepted(command, state, [e.event_id for e in envelopes], recorded_at)


def execute_encoded(state: Any, command: CommandEnvelope, recorded_at: str,
                    time_limit: EventTimeLimit | None = None,
                    sealer: Any = None) -> tuple[Any, list[bytes], CommandResult]:
    """``execute`` with the events as their JSON (``EventEnvelope.to_json()``), without building envelopes:
    the handler's hot path. Same state, same bytes, same result (tests/unit/test_handler_core.py); with a
    ``sealer``, the same but for the sealed values (fresh nonces each time)."""
    try:
        domain, new_events = _decide(state, command, time_limit, sealer)
    except CommandRejected as e:
        return state, [], _rejection(state, command, e, recorded_at)
    command_id, aggregate_id = command.command_id, command.aggregate_id
    correlation_id = command.correlation_id or command_id
    aggregate_type, fold = domain.aggregate_type, domain.evolve_fields or domain.fold_fields
    encoded, event_ids = [], []
    for i, new in enumerate(new_events):
        event_type, payload, version = new.event_type, new.payload, state.version + 1
        event_id = event_id_for(aggregate_type, aggregate_id, version, command_id)
        # The fields of EventEnvelope.to_dict, in its order.
        encoded.append(dumps({
            "event_id": event_id, "event_type": event_type, "schema_version": EVENT_SCHEMA_VERSIONS[event_type],
            "aggregate_type": aggregate_type, "aggregate_id": aggregate_id, "aggregate_version": version,
            "occurred_at": new.occurred_at, "recorded_at": recorded_at, "command_id": command_id,
            "correlation_id": correlation_id, "causation_id": command_id,
            "payload": payload if type(payload) is dict else dict(payload)}))
        state = fold(state, event_type, payload, version)
        event_ids.append(event_id)
    return state, encoded, _accepted(command, state, event_ids, recorded_at)
