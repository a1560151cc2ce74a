"""Field descriptions and the validators generated from them: the generic part of every schema.

A command, an event or an envelope field is described once, as a :class:`Field` (type, required, bounds, a
full-match pattern, allowed values, a length limit, or "a timestamp in range"); every validator is generated
from these descriptions: the reference Python validator (:func:`validate_fields`), the handler's compiled
msgspec decoders (:func:`payload_decoder`) and the Spark checks (``spark_apps.events``). Domains build their
command and event schemas from these pieces (``event_store/<domain>/schemas.py``); ``event_store.schemas``
holds their union and the envelopes. No domain is known here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from operator import attrgetter
from typing import Annotated, Any, Callable, Literal, Mapping

import msgspec

from event_store.errors import InvalidRecord

__all__ = ["Field", "COMMAND_ENVELOPE", "ID", "OPTIONAL_ID", "TIME", "OPTIONAL_TIME", "ISO_TIME", "NOT_BLANK",
           "SEALED_VALUE", "sealable",
           "validate_payload", "validate_fields", "field_problem", "payload_decoder", "pattern_checker",
           "time_fields",
           "EVENT_TIME_MIN", "EVENT_TIME_MAX", "ID_MAX_LENGTH", "AMOUNT_MAX_MINOR", "VERSION_MAX"]

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
# ISO-8601 with a time zone: Z or +hh:mm; whole-range month, day, hour, minute, second; up to 6 fraction digits.
ISO_TIME = (r"\A\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?"
            r"(Z|[+-]([01]\d|2[0-3]):[0-5]\d)\Z")
NOT_BLANK = r"\S"  # str.strip()'s notion of "not only whitespace" (both use str.isspace)


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
    personal: bool = False          # identifies or describes a person: to be sealed under its data subject's key
                                    # (issue 45, event_store/personal_data.py); no validator reads it

    def msgspec_type(self, pattern: bool = True) -> Any:
        """The field as a msgspec type with its constraints; without its pattern when ``pattern`` is False (then
        the decoder's caller checks it with :func:`pattern_checker`: msgspec's own pattern check costs about half
        a microsecond a field, most of an event's decoding)."""
        kind = Literal[tuple(sorted(self.choices))] if self.choices else self.kind
        constraints = {k: v for k, v in (("gt", self.gt), ("le", self.le),
                                         ("pattern", self.pattern if pattern else None),
                                         ("max_length", self.max_length)) if v is not None}
        kind = Annotated[kind, msgspec.Meta(**constraints)] if constraints else kind
        # Optional fields may be absent (UNSET: left out of the payload, as the JSON had it) or null.
        return kind if self.required else kind | None | msgspec.UnsetType


def _parse_timestamp(value: str) -> datetime | None:
    """The instant ``value`` names, or None when it is not an ISO-8601 timestamp with a zone."""
    if not re.search(ISO_TIME, value):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:  # e.g. February 30th
        return None


def field_problem(spec: Field, value: Any) -> str | None:
    """What is wrong with ``value`` (not None) as ``spec``, or None when it is fine. A personal field's value is
    never quoted (issue 45): the reason goes to the command's result, the logs and the dead letters, which
    forgetting its subject cannot reach."""
    _short = _unquoted if spec.personal else _quoted
    kind = spec.kind
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        return f"must be {kind.__name__}, got {type(value).__name__} " + (
            "(personal data: not quoted)" if spec.personal else _short(value))
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
        return "must not be empty" if spec.pattern == NOT_BLANK else f"{_short(value)} is not {spec.describe}"
    if spec.gt is not None and value <= spec.gt:
        return f"must be > {spec.gt}, got {value}"
    if spec.le is not None and value > spec.le:
        return f"must be <= {spec.le:,}, got {value:,}"
    return None


def _unquoted(value: Any) -> str:
    return "the value given (personal data: not quoted)"


def _quoted(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text):,} characters)"


# A sealed personal value as it is stored (event_store.personal_data: ``elk1:<subject>:<field>:<sealed>``, base64url
# parts): what a personal field of an *event* may hold instead of its plain value (``sealable``).
SEALED_VALUE = r"\Aelk1:[A-Za-z0-9_-]+:[A-Za-z_][A-Za-z0-9_]*:[A-Za-z0-9_-]+\Z"


def sealable(spec: Field) -> Field:
    """A personal field of an event (issue 45): its plain value, as ``spec`` describes it (events written before
    sealing was turned on, or with it off), or a sealed value (``SEALED_VALUE``). Said in the pattern itself, so
    every validator generated from the field (Python's, the compiled decoders', Spark's) accepts the same records.
    Commands keep the plain field: they are validated in clear, before the handler seals them."""
    if spec.kind is not str or not spec.personal or spec.choices or spec.timestamp or spec.max_length:
        raise ValueError(f"only a personal string field without choices, time or length limit can be sealed: {spec}")
    if spec.pattern in (None, NOT_BLANK):  # any (non-blank) string: a token is one already
        return spec
    pattern = f"{spec.pattern}|{SEALED_VALUE}"
    describe = f"{spec.describe or 'a string'} or a sealed value"
    return replace(spec, pattern=pattern, describe=describe)


# Building blocks of schemas: an id (not blank, bounded), an optional one, an event time.
ID = Field(str, pattern=NOT_BLANK, max_length=ID_MAX_LENGTH)
OPTIONAL_ID = Field(str, required=False, pattern=NOT_BLANK, max_length=ID_MAX_LENGTH)
TIME = Field(str, timestamp=True, pattern=ISO_TIME)
OPTIONAL_TIME = Field(str, required=False, timestamp=True, pattern=ISO_TIME)

# The command envelope's fields other than command_type, payload and expected_version (checked by
# CommandEnvelope.from_dict); issued_at becomes the occurred_at of the events a command causes without one.
# aggregate_type may be left out: the registry (event_store.domains) knows it from command_type.
COMMAND_ENVELOPE: dict[str, Field] = {
    "command_id": ID,
    "aggregate_id": ID,
    "aggregate_type": OPTIONAL_ID,
    "issued_at": OPTIONAL_TIME,
    "correlation_id": OPTIONAL_ID,
    "causation_id": OPTIONAL_ID,
}


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


def pattern_checker(schema: Mapping[str, Field], skip: tuple[str, ...] = ()) -> Callable[[Any], bool]:
    """A function of a msgspec Struct holding ``schema``'s fields (a value may be None or UNSET: absent) telling
    whether each value of a field with a pattern (but those in ``skip``) matches it: exactly what
    ``re.search(pattern, value)`` decides, as msgspec does with the pattern in the type, in a fraction of its time.
    NOT_BLANK is decided without the regular expression: \\S is the negation of str.isspace (checked over every
    code point by tests/unit/test_event_parser.py), so a value is not blank when it is not "" and not all
    whitespace."""
    blank_free = tuple(name for name, spec in schema.items() if spec.pattern == NOT_BLANK and name not in skip)
    searched = tuple((attrgetter(name), re.compile(spec.pattern).search) for name, spec in schema.items()
                     if spec.pattern not in (None, NOT_BLANK) and name not in skip)
    values = attrgetter(*blank_free) if len(blank_free) > 1 else None
    one = attrgetter(blank_free[0]) if len(blank_free) == 1 else None
    required = all(schema[name].required for name in blank_free)  # then every value is a string
    isspace = str.isspace

    def hold(struct: Any) -> bool:
        if values is not None:
            texts = values(struct)
            # None and UNSET are false, so filter leaves the strings but "" (refused before it).
            if "" in texts or any(map(isspace, texts if required else filter(None, texts))):
                return False
        elif one is not None:
            text = one(struct)
            if text == "" or (text and text.isspace()):
                return False
        for get, search in searched:
            text = get(struct)
            if isinstance(text, str) and not search(text):
                return False
        return True

    return hold


_DECODERS: dict[int, tuple[msgspec.json.Decoder, tuple[str, ...], Callable[[Any], bool]]] = {}


def payload_decoder(schema: Mapping[str, Field]) -> tuple[msgspec.json.Decoder, tuple[str, ...],
                                                          Callable[[Any], bool]]:
    """A compiled JSON decoder of ``schema``'s payloads (a msgspec Struct with each field's constraints but its
    pattern; unknown fields refused), the names of its optional fields, and the pattern check
    (:func:`pattern_checker`) the caller must run on the decoded payload Struct. The decoder and the check together
    accept only payloads ``validate_payload`` passes with every field of exactly its declared type; anything they
    refuse must go to ``validate_payload``."""
    found = _DECODERS.get(id(schema))
    if found is None:
        fields = [(name, spec.msgspec_type(pattern=False)) if spec.required
                  else (name, spec.msgspec_type(pattern=False), msgspec.UNSET) for name, spec in schema.items()]
        # Untracked by the garbage collector when it holds only text and numbers (no reference cycle possible).
        untracked = all(spec.kind in (str, int) for spec in schema.values())
        struct = msgspec.defstruct("Payload", fields, forbid_unknown_fields=True, kw_only=True, gc=not untracked)
        optional = tuple(name for name, spec in schema.items() if not spec.required)
        found = _DECODERS[id(schema)] = (msgspec.json.Decoder(struct), optional, pattern_checker(schema))
    return found
