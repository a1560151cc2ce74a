"""Event and command envelopes (docs/DESIGN.md, "Contracts"), their JSON form, and validation on the way in.

Envelopes are plain frozen dataclasses; ``to_json`` / ``*.from_json`` are the only serialization.
Anything that fails validation raises :class:`event_store.errors.InvalidRecord` with a reason a person can
act on.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Annotated, Any, Mapping

import msgspec
import orjson

from event_store import domains, schemas
from event_store.errors import InvalidRecord
from event_store.fields import ISO_TIME
from event_store.upcasting import UnknownSchemaVersion, upcast

__all__ = ["load_json", "plain_event", "EventEnvelope", "CommandEnvelope", "CommandResult", "utc_now", "parse_time", "format_time", "new_id", "in_range",
           "dumps", "built"]


def new_id() -> str:
    return str(uuid.uuid4())


def utc_now() -> str:
    return format_time(datetime.now(timezone.utc))


def format_time(t: datetime) -> str:
    """ISO-8601 UTC with millisecond precision and a trailing Z."""
    if t.tzinfo is None:
        raise ValueError(f"timestamp {t!r} has no timezone")
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def parse_time(value: Any, what: str) -> datetime:
    if not isinstance(value, str):
        raise InvalidRecord(f"{what}: expected an ISO-8601 UTC timestamp string, got {type(value).__name__}")
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRecord(f"{what}: {value!r} is not an ISO-8601 timestamp") from None
    if t.tzinfo is None:
        raise InvalidRecord(f"{what}: {value!r} has no timezone (use UTC, e.g. 2026-01-01T00:00:00Z)")
    return t


def _require(obj: Mapping[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    if name not in obj or obj[name] is None:
        raise InvalidRecord(f"{what}: missing required field '{name}'")
    value = obj[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise InvalidRecord(f"{what}: field '{name}' must be {expected}, got {type(value).__name__} {value!r}")
    return value


def load_json(raw: bytes | str | None, what: str) -> dict[str, Any]:
    if raw is None:
        raise InvalidRecord(f"{what}: the record has no value (null: a tombstone or a record written without one)")
    try:
        # UTF-8 only (json.loads would also guess UTF-16/32 from bytes), as every reader of the log decodes it.
        obj = json.loads(raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidRecord(f"{what}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise InvalidRecord(f"{what}: expected a JSON object, got {type(obj).__name__}")
    return obj


def dumps(obj: Mapping[str, Any]) -> bytes:
    """The compact JSON of every envelope (what ``to_json`` returns)."""
    # orjson writes the same compact JSON (non-ASCII as UTF-8 rather than \u escapes); what it refuses
    # (integers beyond 64 bits, non-string keys) the standard library still writes.
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj, separators=(",", ":"), sort_keys=False).encode()


@dataclass(frozen=True)
class EventEnvelope:
    event_id: str
    event_type: str
    schema_version: int
    aggregate_type: str
    aggregate_id: str
    aggregate_version: int
    occurred_at: str
    recorded_at: str
    command_id: str
    correlation_id: str
    causation_id: str
    payload: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        # Spelled out rather than dataclasses.asdict: this is on the handler's hot path (asdict deep-copies).
        return {"event_id": self.event_id, "event_type": self.event_type, "schema_version": self.schema_version,
                "aggregate_type": self.aggregate_type, "aggregate_id": self.aggregate_id,
                "aggregate_version": self.aggregate_version, "occurred_at": self.occurred_at,
                "recorded_at": self.recorded_at, "command_id": self.command_id,
                "correlation_id": self.correlation_id, "causation_id": self.causation_id,
                "payload": dict(self.payload)}

    def to_json(self) -> bytes:
        return dumps(self.to_dict())

    @classmethod
    def from_json(cls, raw: bytes | str) -> "EventEnvelope":
        # Every reader's hot path (the projection's Python engine, the detectors, the policy): compiled msgspec
        # decoders for the ordinary valid event at its type's current schema version. Anything else (invalid,
        # an older version to upcast, members beyond the schema, JSON msgspec reads differently) takes the
        # reference path below, which decides and words every rejection, so the outcome is the same either way.
        event = plain_event(cls, raw)
        if event is not None:
            return event
        obj = load_json(raw, "event")
        return cls.from_dict(obj)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> "EventEnvelope":
        """The event ``obj`` describes, upcast to the current schema; InvalidRecord naming the first problem.
        Validity is schemas.EVENT_ENVELOPE, then schemas.EVENTS[event_type] after upcasting: the one definition
        the Spark side is generated from too (spark_apps.events)."""
        if not isinstance(obj, Mapping):
            raise InvalidRecord(f"event: expected a JSON object, got {type(obj).__name__}")
        event_id = obj.get("event_id")
        what = f"event {event_id if isinstance(event_id, str) and len(event_id) <= 100 else '?'}"
        schemas.validate_fields(schemas.EVENT_ENVELOPE, obj, what)
        event_type = obj["event_type"]
        # Old schema versions are upcast here, so every reader sees the current version only.
        try:
            schema_version, payload = upcast(event_type, obj["schema_version"], obj["payload"], what)
        except UnknownSchemaVersion as e:
            raise InvalidRecord(str(e)) from None
        schemas.validate_payload(schemas.EVENTS[event_type], payload, f"{what} ({event_type})")
        misused = (schemas.misused_string_name(obj, schemas.EVENT_ENVELOPE)
                   or schemas.misused_string_name(obj["payload"], schemas.EVENTS[event_type]))
        if misused:
            raise InvalidRecord(f"{what}: a field named '{misused}' beyond the schema holds a value that is not a "
                                f"string (a name of the event schema's string fields must hold a string)")
        return cls(
            event_id=obj["event_id"],
            event_type=event_type,
            schema_version=schema_version,
            aggregate_type=obj["aggregate_type"],
            aggregate_id=obj["aggregate_id"],
            aggregate_version=obj["aggregate_version"],
            occurred_at=obj["occurred_at"],
            recorded_at=obj["recorded_at"],
            command_id=obj["command_id"],
            correlation_id=obj["correlation_id"],
            causation_id=obj["causation_id"],
            payload=payload,
        )


@dataclass(frozen=True)
class CommandEnvelope:
    """A command. ``aggregate_type`` may be left out: the registry (``event_store.domains``) knows it from
    ``command_type``; a command read from JSON always has it (``from_dict`` routes it, or rejects it)."""
    command_id: str
    command_type: str
    aggregate_id: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    aggregate_type: str | None = None
    expected_version: int | None = None
    issued_at: str = field(default_factory=utc_now)
    correlation_id: str | None = None
    causation_id: str | None = None

    def __post_init__(self) -> None:
        # Built in code without an aggregate type: the owner of its command type (validated by from_dict).
        if self.aggregate_type is None:
            object.__setattr__(self, "aggregate_type", domains.COMMAND_TYPES.get(self.command_type))

    def to_dict(self) -> dict[str, Any]:
        # Spelled out rather than dataclasses.asdict, which deep-copies (clients send many commands).
        return {"command_id": self.command_id, "command_type": self.command_type, "aggregate_id": self.aggregate_id,
                "payload": dict(self.payload), "aggregate_type": self.aggregate_type,
                "expected_version": self.expected_version, "issued_at": self.issued_at,
                "correlation_id": self.correlation_id, "causation_id": self.causation_id}

    def to_json(self) -> bytes:
        return dumps(self.to_dict())

    @classmethod
    def create(cls, command_type: str, aggregate_id: str, payload: Mapping[str, Any] | None = None,
               **kwargs: Any) -> "CommandEnvelope":
        command = cls(command_id=kwargs.pop("command_id", None) or new_id(), command_type=command_type,
                      aggregate_id=aggregate_id, payload=dict(payload or {}), **kwargs)
        return cls.from_dict(command.to_dict())  # validate now: bad commands fail where they are made

    @classmethod
    def from_json(cls, raw: bytes | str) -> "CommandEnvelope":
        # The handler's hot path: compiled msgspec decoders for the ordinary, valid command. Anything else
        # (invalid, unusual types, JSON msgspec reads differently) takes the reference path below, which
        # decides and words every rejection, so the outcome is the same either way.
        command = _plain_command(cls, raw)
        if command is not None:
            return command
        return cls.from_dict(load_json(raw, "command"))

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> "CommandEnvelope":
        if not isinstance(obj, Mapping):
            raise InvalidRecord(f"command: expected a JSON object, got {type(obj).__name__}")
        command_id = obj.get("command_id")
        what = f"command {command_id if isinstance(command_id, str) and len(command_id) <= 100 else '?'}"
        command_type = _require(obj, "command_type", str, what)
        if command_type not in schemas.COMMANDS:
            raise InvalidRecord(f"{what}: unknown command_type {_short(command_type)}; "
                                f"known: {', '.join(schemas.COMMANDS)}")
        schemas.validate_fields(schemas.COMMAND_ENVELOPE, obj, what)
        expected = obj.get("expected_version")
        if expected is not None and (not isinstance(expected, int) or isinstance(expected, bool) or expected < 0
                                     or expected > schemas.VERSION_MAX):
            raise InvalidRecord(f"{what}: expected_version must be a non-negative integer, got {_short(expected)}")
        # Routed by its aggregate_type, or by its command_type when it names none (docs/DESIGN.md, "Adding a
        # domain"): an unknown aggregate type, or one that does not own the command type, is rejected here.
        aggregate_type = domains.route_command(command_type, obj.get("aggregate_type"), what)
        payload = _require(obj, "payload", dict, what)
        schemas.validate_payload(schemas.COMMANDS[command_type], payload, f"{what} ({command_type})")
        return cls(command_id=obj["command_id"], command_type=command_type, aggregate_id=obj["aggregate_id"],
                   payload=payload, aggregate_type=aggregate_type,
                   expected_version=expected, issued_at=obj.get("issued_at") or utc_now(),
                   correlation_id=obj.get("correlation_id"), causation_id=obj.get("causation_id"))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text):,} characters)"


@dataclass(frozen=True)
class CommandResult:
    """What became of one command: ``accepted`` with the versions it wrote, or ``rejected`` with a reason."""
    command_id: str
    aggregate_id: str
    status: str  # accepted | rejected
    version: int  # the aggregate's version after the command (unchanged when rejected)
    event_ids: tuple[str, ...] = ()
    error_type: str | None = None
    reason: str | None = None
    recorded_at: str = field(default_factory=utc_now)
    # True on the answer to a re-sent command_id: the FIRST result, repeated; nothing was written.
    duplicate: bool = False

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"

    def to_dict(self) -> dict[str, Any]:
        return {"command_id": self.command_id, "aggregate_id": self.aggregate_id, "status": self.status,
                "version": self.version, "event_ids": list(self.event_ids), "error_type": self.error_type,
                "reason": self.reason, "recorded_at": self.recorded_at, "duplicate": self.duplicate}

    def to_json(self) -> bytes:
        return dumps(self.to_dict())

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> "CommandResult":
        try:
            return cls(command_id=obj["command_id"], aggregate_id=obj["aggregate_id"], status=obj["status"],
                       version=obj["version"], event_ids=tuple(obj.get("event_ids") or ()),
                       error_type=obj.get("error_type"), reason=obj.get("reason"),
                       recorded_at=obj.get("recorded_at") or utc_now(), duplicate=bool(obj.get("duplicate")))
        except KeyError as e:
            raise InvalidRecord(f"command result: missing field {e}") from None

    @classmethod
    def from_json(cls, raw: bytes | str) -> "CommandResult":
        return cls.from_dict(load_json(raw, "command result"))


_new = object.__new__


def built(cls: type, **fields: Any) -> Any:
    """An instance of the frozen dataclass ``cls`` with exactly these (all of its) fields, built without the
    guarded setattr per field of its __init__ (none of these dataclasses has a __post_init__). For hot paths
    that already hold valid values; everything else uses the constructor."""
    obj = _new(cls)
    obj.__dict__.update(fields)
    return obj


def _command_head():
    """A command envelope as the fast path reads it: the envelope fields with their constraints from
    schemas.COMMAND_ENVELOPE, the payload left as raw JSON for its type's decoder."""
    fields = [("command_type", str), ("payload", msgspec.Raw)]
    for name, spec in schemas.COMMAND_ENVELOPE.items():
        kind = spec.msgspec_type(pattern=False)  # the patterns: _COMMAND_HEAD_CHECKS
        fields.append((name, kind) if spec.required else (name, kind, None))
    fields.append(("expected_version", Annotated[int, msgspec.Meta(ge=0, le=schemas.VERSION_MAX)] | None, None))
    # gc=False: the collector need not track it (text and numbers cannot form a reference cycle).
    return msgspec.defstruct("CommandHead", fields, kw_only=True, gc=False)


_CommandHead = _command_head()
_HEAD = msgspec.json.Decoder(_CommandHead)
# issued_at: its full check (pattern, date, range) is _TIME_PROBLEM's.
_command_head_patterns_hold = schemas.pattern_checker(schemas.COMMAND_ENVELOPE, skip=("issued_at",))
_TIME_FIELD = schemas.COMMAND_ENVELOPE["issued_at"]
_TIME_PROBLEM = schemas.field_problem
_UNSET = msgspec.UNSET
_COMMAND_TYPES = domains.COMMAND_TYPES


def _plain_command(cls: type[CommandEnvelope], raw: bytes | str) -> CommandEnvelope | None:
    """``CommandEnvelope.from_json(raw)`` for a valid command, decoded by compiled msgspec decoders; None when in
    any doubt (then the reference path gives the answer). Accepts nothing ``from_dict`` would reject."""
    try:
        head = _HEAD.decode(raw)
        schema = schemas.COMMANDS.get(head.command_type)
        if schema is None:
            return None
        aggregate_type = _COMMAND_TYPES[head.command_type]
        if head.aggregate_type is not None and head.aggregate_type != aggregate_type:
            return None  # routed elsewhere, or nowhere: from_dict words the rejection
        decoder, optional, patterns_hold = schemas.payload_decoder(schema)
        decoded = decoder.decode(head.payload)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    if not (_command_head_patterns_hold(head) and patterns_hold(decoded)):
        return None
    payload = msgspec.structs.asdict(decoded)
    for name in optional:  # absent from the JSON: absent from the payload, as json.loads gives it
        if payload[name] is _UNSET:
            del payload[name]
    # The patterns admit impossible dates (February 30th) and times out of range: the full check decides.
    for name in schemas.time_fields(schema):
        if payload.get(name) is not None and _TIME_PROBLEM(_TIME_FIELD, payload[name]):
            return None
    issued_at = head.issued_at
    if issued_at is None:
        issued_at = utc_now()
    elif _TIME_PROBLEM(_TIME_FIELD, issued_at):
        return None
    # The dataclass is frozen and has no __post_init__: filling its __dict__ builds the same object as
    # __init__, without a guarded setattr per field.
    command = _new(cls)
    command.__dict__.update(command_id=head.command_id, command_type=head.command_type,
                            aggregate_id=head.aggregate_id, payload=payload,
                            aggregate_type=aggregate_type, expected_version=head.expected_version,
                            issued_at=issued_at, correlation_id=head.correlation_id,
                            causation_id=head.causation_id)
    return command


def _event_head():
    """An event envelope as the fast path reads it: the envelope fields with their constraints from
    schemas.EVENT_ENVELOPE but their patterns (no member beyond them), the payload left as raw JSON for its type's
    decoder."""
    fields = [("payload", msgspec.Raw)]
    fields += [(name, spec.msgspec_type(pattern=False))
               for name, spec in schemas.EVENT_ENVELOPE.items() if name != "payload"]
    # gc=False: the collector need not track it (text and numbers cannot form a reference cycle).
    return msgspec.defstruct("EventHead", fields, kw_only=True, forbid_unknown_fields=True, gc=False)


_EVENT_HEAD = msgspec.json.Decoder(_event_head())
EVENT_TIMES = ("occurred_at", "recorded_at")
# The envelope's times are checked whole (pattern, date, range) by in_range, or a batch at a time by the caller of
# plain_event_parts.
_event_head_patterns_hold = schemas.pattern_checker(schemas.EVENT_ENVELOPE, skip=EVENT_TIMES)
_EVENT_KINDS: dict[str, tuple] = {}


def _event_kind(event_type: str) -> tuple:
    """(schema, current schema version, payload decoder, payload pattern check, payload time fields) of a
    registered event type, looked up once (again when the registry's schema for it changes)."""
    kind = _EVENT_KINDS.get(event_type)
    schema = schemas.EVENTS[event_type]
    if kind is None or kind[0] is not schema:
        decoder, _, patterns_hold = schemas.payload_decoder(schema)
        kind = _EVENT_KINDS[event_type] = (schema, schemas.EVENT_SCHEMA_VERSIONS[event_type], decoder,
                                           patterns_hold, schemas.time_fields(schema))
    return kind


_fromisoformat = datetime.fromisoformat
_iso_time = re.compile(ISO_TIME).search


def in_range(value: str) -> bool:
    """A time that matches fields.ISO_TIME, a real date, in the event time range (what ``field_problem`` decides
    for a timestamp field)."""
    if not _iso_time(value):
        return False
    try:
        t = _fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return schemas.EVENT_TIME_MIN <= t < schemas.EVENT_TIME_MAX


def plain_event_parts(raw: bytes | str) -> tuple[Any, Any] | None:
    """(envelope, payload) of a valid event at its type's current schema version, decoded by compiled msgspec
    decoders, both msgspec Structs: the envelope with EventEnvelope's fields but the payload, the payload with its
    schema's fields (an optional one left out of the JSON is UNSET). Every check ``from_dict`` makes is made but
    those of the envelope's two times (EVENT_TIMES): the caller checks them, with ``in_range`` or its equal. None
    when in any doubt (then the reference path gives the answer)."""
    try:
        head = _EVENT_HEAD.decode(raw)
        kind = _event_kind(head.event_type)
        if head.schema_version != kind[1]:
            return None  # an older version: upcast on the reference path
        payload = kind[2].decode(head.payload)
    except (msgspec.DecodeError, UnicodeDecodeError, TypeError, KeyError):
        return None
    if not (_event_head_patterns_hold(head) and kind[3](payload)):
        return None
    for name in kind[4]:  # the patterns admit impossible dates (February 30th) and times out of range
        value = getattr(payload, name)
        if isinstance(value, str) and not in_range(value):
            return None
    return head, payload


def plain_event(cls: type[EventEnvelope], raw: bytes | str) -> EventEnvelope | None:
    """``EventEnvelope.from_json(raw)`` for a valid event at its type's current schema version, decoded by
    compiled msgspec decoders; None when in any doubt (then the reference path gives the answer). Accepts nothing
    ``from_dict`` would reject."""
    parts = plain_event_parts(raw)
    if parts is None:
        return None
    head, decoded = parts
    if not (in_range(head.occurred_at) and in_range(head.recorded_at)):
        return None
    payload = msgspec.structs.asdict(decoded)
    for name in schemas.payload_decoder(schemas.EVENTS[head.event_type])[1]:
        if payload[name] is _UNSET:  # absent from the JSON: absent from the payload, as json.loads gives it
            del payload[name]
    return built(cls, event_id=head.event_id, event_type=head.event_type, schema_version=head.schema_version,
                 aggregate_type=head.aggregate_type, aggregate_id=head.aggregate_id,
                 aggregate_version=head.aggregate_version, occurred_at=head.occurred_at,
                 recorded_at=head.recorded_at, command_id=head.command_id, correlation_id=head.correlation_id,
                 causation_id=head.causation_id, payload=payload)
