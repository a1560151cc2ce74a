"""The definition of a valid command and a valid event: the event envelope, and the payload schemas of every
registered domain.

Each field is described once, as a :class:`~event_store.fields.Field`; every validator is generated from these
descriptions: the reference Python validator (:func:`validate_fields`, used by the handler's commands, its
rebuild from the log, the policy and the oracles), the handler's compiled msgspec decoders
(:func:`payload_decoder`), and the Spark checks of the projection, the archive and the fraud detector
(``spark_apps.events``). A record is valid on one side exactly when it is on the other
(tests/integration/test_event_parsing.py holds them to it on hostile input).

``COMMANDS``, ``EVENTS`` and ``EVENT_SCHEMA_VERSIONS`` are the unions over the registered domains
(``event_store.domains``; each domain's own are in ``event_store/<domain>/schemas.py``). The generic pieces
(``Field``, the validators, the limits, the command envelope) live in ``event_store.fields`` and are named here
too, for the readers that import them from here.
"""
from __future__ import annotations

from typing import Any, Mapping

from event_store import domains
from event_store.domains import COMMANDS, EVENT_SCHEMA_VERSIONS, EVENTS
from event_store.fields import (AMOUNT_MAX_MINOR, COMMAND_ENVELOPE, EVENT_TIME_MAX, EVENT_TIME_MIN, ID, ID_MAX_LENGTH,
                                TIME, VERSION_MAX, Field, field_problem, pattern_checker,
                                payload_decoder, time_fields, validate_fields, validate_payload)

__all__ = ["Field", "COMMANDS", "EVENTS", "EVENT_ENVELOPE", "COMMAND_ENVELOPE", "validate_payload",
           "validate_fields", "field_problem", "payload_decoder", "pattern_checker",
           "EVENT_SCHEMA_VERSIONS", "string_field_names",
           "misused_string_name", "EVENT_TIME_MIN", "EVENT_TIME_MAX", "ID_MAX_LENGTH", "AMOUNT_MAX_MINOR",
           "VERSION_MAX", "time_fields"]


def _event_type_field() -> Field:
    return Field(str, choices=frozenset(EVENTS), describe="a known event type")


# The event envelope (docs/DESIGN.md, "Contracts"); ``payload`` is then checked against EVENTS[event_type] after
# upcasting. schema_version's upper bound depends on the type (EVENT_SCHEMA_VERSIONS): checked by the readers.
EVENT_ENVELOPE: dict[str, Field] = {
    "event_id": ID,
    "event_type": _event_type_field(),
    "schema_version": Field(int, gt=0, le=VERSION_MAX),
    "aggregate_type": ID,
    "aggregate_id": ID,
    "aggregate_version": Field(int, gt=0, le=VERSION_MAX),
    "occurred_at": TIME,
    "recorded_at": TIME,
    "command_id": ID,
    "correlation_id": ID,
    "causation_id": ID,
    "payload": Field(dict),
}


def string_field_names() -> frozenset[str]:
    """Every name the event envelope or an event payload uses for a string field."""
    names = {n for n, spec in EVENT_ENVELOPE.items() if spec.kind is str}
    for schema in EVENTS.values():
        names |= {n for n, spec in schema.items() if spec.kind is str}
    return frozenset(names)


_STRING_NAMES = None


def misused_string_name(obj: Mapping[str, Any], schema: Mapping[str, Field]) -> str | None:
    """The first member of ``obj`` outside ``schema`` (at any depth below it) that is named like one of the
    event string fields but holds something other than a string or null; None when there is none.

    Fields beyond the schema are ignored, except this: Spark's JSON reader takes the text of any JSON value
    for a string field (a number 5 reads as "5"), so the Spark side finds such values by their name in the
    record's text, wherever they are; this is the same rule in Python (spark_apps.events._NOT_A_STRING)."""
    global _STRING_NAMES
    if _STRING_NAMES is None:
        _STRING_NAMES = string_field_names()
    if len(obj) <= len(schema) and obj.keys() <= schema.keys():
        return None  # the common case: no member beyond the schema
    stack = [(k, v) for k, v in obj.items() if k not in schema]
    while stack:
        name, value = stack.pop()
        if name in _STRING_NAMES and not (value is None or isinstance(value, str)):
            return name
        if isinstance(value, dict):
            stack += value.items()
        elif isinstance(value, list):
            stack += [("", v) for v in value]
    return None




def _refresh() -> None:
    """A domain was registered or removed: the known event types and string field names follow."""
    global _STRING_NAMES
    EVENT_ENVELOPE["event_type"] = _event_type_field()
    _STRING_NAMES = None


domains.on_change(_refresh)
