"""Payload schemas of the reference domain's commands and events, the event envelope, and their validation.

This module is THE definition of a valid command and a valid event. Each field is described once, as a
:class:`Field` (type, required, bounds, a full-match pattern, allowed values, a length limit, or "a timestamp
in range"); every validator is generated from these descriptions: the reference Python validator
(:func:`validate_fields`, used by the handler's commands, its rebuild from the log, the policy and the
oracles), the handler's compiled msgspec decoders (:func:`payload_decoder`), and the Spark checks of the
projection, the archive and the fraud detector (``spark_apps.events``). A record is valid on one side
exactly when it is on the other (tests/integration/test_event_parsing.py holds them to it on hostile input).

Field names are the read models' names (docs/DESIGN.md). Money is an integer count of minor units plus an
ISO-4217 code; locations are short region codes such as ``US-NYC``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Mapping

import msgspec

from event_store.errors import InvalidRecord

__all__ = ["Field", "COMMANDS", "EVENTS", "EVENT_ENVELOPE", "COMMAND_ENVELOPE", "CURRENCIES", "validate_payload",
           "validate_fields", "field_problem", "payload_decoder", "EVENT_SCHEMA_VERSIONS", "country_of",
           "EVENT_TIME_MIN", "EVENT_TIME_MAX", "ID_MAX_LENGTH", "AMOUNT_MAX_MINOR", "VERSION_MAX", "time_fields"]

# ISO-4217 codes accepted by the reference domain.
CURRENCIES = frozenset({"USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK", "NOK", "DKK", "PLN", "CZK",
                        "NZD", "SGD", "HKD", "BRL", "MXN", "INR", "ZAR", "CNY"})

# Bounds that keep every value inside what every reader handles (Spark longs and timestamps, Parquet
# microseconds, pyarrow, DuckDB, pandas): event times from 1900 up to (not including) 9999-01-01, so that even
# a minute window's end stays a valid timestamp; amounts up to 10^15 minor units, so sums of many stay in
# 64 bits; ids up to 256 characters.
EVENT_TIME_MIN = datetime(1900, 1, 1, tzinfo=timezone.utc)
EVENT_TIME_MAX = datetime(9999, 1, 1, tzinfo=timezone.utc)
ID_MAX_LENGTH = 256
AMOUNT_MAX_MINOR = 10 ** 15
VERSION_MAX = 2 ** 62

# Patterns are full matches written with \A ... \Z (Python's end of input; the Spark side uses Java's \z), so
# that a trailing newline is refused on both sides. They are searched (re.search), as msgspec does.
_LOCATION = r"\A[A-Z]{2}-[A-Z0-9]{2,6}\Z"
_COUNTRY_CODE = r"\A[A-Z]{2}\Z"
# ISO-8601 with a time zone: Z or +hh:mm; whole-range month, day, hour, minute, second; up to 6 fraction digits.
_ISO_TIME = (r"\A\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?"
             r"(Z|[+-]([01]\d|2[0-3]):[0-5]\d)\Z")
_NOT_BLANK = r"\S"  # str.strip()'s notion of "not only whitespace" (both use str.isspace)


@dataclass(frozen=True)
class Field:
    """One field of a command, an event or an envelope: what a valid value is, said once."""
    kind: type                      # str, int or dict
    required: bool = True
    gt: int | None = None           # int: value > gt
    le: int | None = None           # int: value <= le
    pattern: str | None = None      # str: re.search(pattern, value) (written as a full match)
    max_length: int | None = None   # str: at most this many characters
    choices: frozenset | None = None  # str: one of these
    timestamp: bool = False         # str: an ISO-8601 timestamp with a zone in [EVENT_TIME_MIN, EVENT_TIME_MAX)
    describe: str = ""              # what the pattern means, for messages ("a region code like 'US-NYC'")

    def msgspec_type(self) -> Any:
        kind = Literal[tuple(sorted(self.choices))] if self.choices else self.kind
        constraints = {k: v for k, v in (("gt", self.gt), ("le", self.le), ("pattern", self.pattern),
                                         ("max_length", self.max_length)) if v is not None}
        kind = Annotated[kind, msgspec.Meta(**constraints)] if constraints else kind
        # Optional fields may be absent (UNSET: left out of the payload, as the JSON had it) or null.
        return kind if self.required else kind | None | msgspec.UnsetType


def country_of(location: str) -> str:
    """The country part of a region code: ``US-NYC`` -> ``US``."""
    return location.split("-", 1)[0]


def _parse_timestamp(value: str) -> datetime | None:
    """The instant ``value`` names, or None when it is not an ISO-8601 timestamp with a zone."""
    if not re.search(_ISO_TIME, value):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:  # e.g. February 30th
        return None


def field_problem(spec: Field, value: Any) -> str | None:
    """What is wrong with ``value`` (not None) as ``spec``, or None when it is fine."""
    kind = spec.kind
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        return f"must be {kind.__name__}, got {type(value).__name__} {_short(value)}"
    if spec.choices is not None and value not in spec.choices:
        return f"{_short(value)} is not {spec.describe or 'one of ' + ', '.join(sorted(spec.choices))}"
    if spec.max_length is not None and len(value) > spec.max_length:
        return f"is {len(value):,} characters long; at most {spec.max_length} are allowed"
    if spec.timestamp:
        t = _parse_timestamp(value)
        if t is None:
            return f"{_short(value)} is not an ISO-8601 UTC timestamp (e.g. 2026-01-01T00:00:00Z)"
        if not EVENT_TIME_MIN <= t < EVENT_TIME_MAX:
            return (f"{_short(value)} is out of range: event times lie from {EVENT_TIME_MIN:%Y-%m-%d} up to "
                    f"(not including) {EVENT_TIME_MAX:%Y-%m-%d}")
    elif spec.pattern is not None and not re.search(spec.pattern, value):
        return "must not be empty" if spec.pattern == _NOT_BLANK else f"{_short(value)} is not {spec.describe}"
    if spec.gt is not None and value <= spec.gt:
        return f"must be > {spec.gt}, got {value}"
    if spec.le is not None and value > spec.le:
        return f"must be <= {spec.le:,}, got {value:,}"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text):,} characters)"


_ID = Field(str, pattern=_NOT_BLANK, max_length=ID_MAX_LENGTH)
_OPTIONAL_ID = Field(str, required=False, pattern=_NOT_BLANK, max_length=ID_MAX_LENGTH)
_AMOUNT = Field(int, gt=0, le=AMOUNT_MAX_MINOR)
_CURRENCY = Field(str, choices=CURRENCIES, describe="a known ISO-4217 currency code")
_LOC = Field(str, pattern=_LOCATION, describe="a region code like 'US-NYC'")
_TIME = Field(str, timestamp=True, pattern=_ISO_TIME)
_REASON = Field(str, required=False)
_COUNTRY = Field(str, pattern=_COUNTRY_CODE, describe="a two-letter country code like 'US'")

COMMANDS: dict[str, dict[str, Field]] = {
    "OpenAccount": {"customer_id": _ID, "credit_limit_minor": _AMOUNT, "currency": _CURRENCY},
    "AuthorizePayment": {"payment_id": _ID, "amount_minor": _AMOUNT, "currency": _CURRENCY,
                         "merchant_id": _ID, "location": _LOC, "occurred_at": _TIME,
                         # Where the merchant is; defaults to the country of ``location``.
                         "merchant_country": Field(str, required=False, pattern=_COUNTRY_CODE,
                                                   describe="a two-letter country code like 'US'")},
    "ReportDeviceLocation": {"location": _LOC, "occurred_at": _TIME},
    "FreezeAccount": {"reason": _REASON},
    "UnfreezeAccount": {"reason": _REASON},
    "FlagFraud": {"payment_id": _ID, "rule": _ID, "evidence": Field(str, required=False),
                  "occurred_at": Field(str, required=False, timestamp=True, pattern=_ISO_TIME)},
    # An operator's decision on a quarantined account (a record of it in the events topic cannot be read):
    # ``record`` names that record as "topic/partition/offset", ``reason`` says what was decided and why.
    "ResolveQuarantine": {"record": _ID, "reason": _ID, "resolved_by": _ID},
}

EVENTS: dict[str, dict[str, Field]] = {
    "AccountOpened": {"customer_id": _ID, "credit_limit_minor": _AMOUNT, "currency": _CURRENCY},
    # v2 adds merchant_country; v1 events are upcast with the country of their location (event_store.upcasting).
    "PaymentAuthorized": {"payment_id": _ID, "amount_minor": _AMOUNT, "currency": _CURRENCY,
                          "merchant_id": _ID, "location": _LOC, "merchant_country": _COUNTRY},
    "PaymentDeclined": {"payment_id": _ID, "amount_minor": _AMOUNT, "currency": _CURRENCY,
                        "merchant_id": _ID, "location": _LOC, "reason": _ID},
    "DeviceLocationReported": {"location": _LOC},
    "AccountFrozen": {"reason": _REASON},
    "AccountUnfrozen": {"reason": _REASON},
    "FraudSuspected": {"payment_id": _ID, "rule": _ID, "evidence": Field(str, required=False)},
    # The audit trail of a ResolveQuarantine: the record given up, the operator's reason, who decided, and
    # (``evidence``) why the record could not be read. It takes the account's next version like any event.
    "QuarantineResolved": {"record": _ID, "reason": _ID, "resolved_by": _ID, "evidence": Field(str, required=False)},
}

# The schema version each event type is written at today (the version EVENTS describes). Every older version
# needs an upcaster in event_store.upcasting; tests/unit/test_upcasting.py checks that none is missing.
EVENT_SCHEMA_VERSIONS: dict[str, int] = {**{name: 1 for name in EVENTS}, "PaymentAuthorized": 2}

# The event envelope (docs/DESIGN.md, "Contracts"); ``payload`` is then checked against EVENTS[event_type] after
# upcasting. schema_version's upper bound depends on the type (EVENT_SCHEMA_VERSIONS): checked by the readers.
EVENT_ENVELOPE: dict[str, Field] = {
    "event_id": _ID,
    "event_type": Field(str, choices=frozenset(EVENTS), describe="a known event type"),
    "schema_version": Field(int, gt=0, le=VERSION_MAX),
    "aggregate_type": _ID,
    "aggregate_id": _ID,
    "aggregate_version": Field(int, gt=0, le=VERSION_MAX),
    "occurred_at": _TIME,
    "recorded_at": _TIME,
    "command_id": _ID,
    "correlation_id": _ID,
    "causation_id": _ID,
    "payload": Field(dict),
}

# The command envelope's fields other than command_type, payload and expected_version (checked by
# CommandEnvelope.from_dict); issued_at becomes the occurred_at of the events a command causes without one.
COMMAND_ENVELOPE: dict[str, Field] = {
    "command_id": _ID,
    "aggregate_id": _ID,
    "aggregate_type": _OPTIONAL_ID,
    "issued_at": Field(str, required=False, timestamp=True, pattern=_ISO_TIME),
    "correlation_id": _OPTIONAL_ID,
    "causation_id": _OPTIONAL_ID,
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


def time_fields(schema: Mapping[str, Field]) -> tuple[str, ...]:
    """The fields of ``schema`` that hold timestamps (their range is checked beyond the pattern)."""
    return tuple(name for name, spec in schema.items() if spec.timestamp)


def validate_fields(schema: Mapping[str, Field], obj: Mapping[str, Any], what: str, prefix: str = "") -> None:
    """Raise InvalidRecord naming the first field of ``obj`` that is missing, mistyped or out of range."""
    for name, spec in schema.items():
        value = obj.get(name)
        if value is None:
            if spec.required:
                raise InvalidRecord(f"{what}: {prefix}missing required field '{name}'")
            continue
        problem = field_problem(spec, value)
        if problem:
            raise InvalidRecord(f"{what}: {prefix}field '{name}' {problem}")


def validate_payload(schema: Mapping[str, Field], payload: Mapping[str, Any], what: str) -> None:
    """Raise InvalidRecord naming the first payload field that is missing, mistyped or out of range."""
    validate_fields(schema, payload, what, prefix="payload ")


_DECODERS: dict[int, tuple[msgspec.json.Decoder, tuple[str, ...]]] = {}


def payload_decoder(schema: Mapping[str, Field]) -> tuple[msgspec.json.Decoder, tuple[str, ...]]:
    """A compiled JSON decoder of ``schema``'s payloads (a msgspec Struct with each field's constraints; unknown
    fields refused) and the names of its optional fields. It accepts only payloads ``validate_payload`` passes
    with every field of exactly its declared type; anything it refuses must go to ``validate_payload``."""
    found = _DECODERS.get(id(schema))
    if found is None:
        fields = [(name, spec.msgspec_type()) if spec.required else (name, spec.msgspec_type(), msgspec.UNSET)
                  for name, spec in schema.items()]
        struct = msgspec.defstruct("Payload", fields, forbid_unknown_fields=True, kw_only=True)
        optional = tuple(name for name, spec in schema.items() if not spec.required)
        found = _DECODERS[id(schema)] = (msgspec.json.Decoder(struct), optional)
    return found
