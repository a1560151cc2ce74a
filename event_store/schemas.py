"""Payload schemas of the reference domain's commands and events, and their validation.

Field names are the read models' names (DESIGN.md). Money is an integer count of minor units plus an
ISO-4217 code; locations are short region codes such as ``US-NYC``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, Mapping

import msgspec

__all__ = ["Field", "COMMANDS", "EVENTS", "CURRENCIES", "validate_payload", "payload_decoder",
           "EVENT_SCHEMA_VERSIONS", "country_of"]

# ISO-4217 codes accepted by the reference domain.
CURRENCIES = frozenset({"USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK", "NOK", "DKK", "PLN", "CZK",
                        "NZD", "SGD", "HKD", "BRL", "MXN", "INR", "ZAR", "CNY"})
_LOCATION = re.compile(r"^[A-Z]{2}-[A-Z0-9]{2,6}$")
_ISO_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


@dataclass(frozen=True)
class Field:
    kind: type | tuple[type, ...]
    required: bool = True
    check: Callable[[Any], str | None] | None = None  # returns the problem, or None when fine
    # The same check as msgspec constraints, for the handler's compiled decoder (payload_decoder): a
    # msgspec.Meta, or the allowed values. tests/unit/test_handler_core.py holds the two to the same verdicts.
    meta: msgspec.Meta | None = None
    choices: frozenset | None = None

    def msgspec_type(self) -> Any:
        kind = Literal[tuple(sorted(self.choices))] if self.choices else self.kind
        kind = Annotated[kind, self.meta] if self.meta is not None else kind
        # Optional fields may be absent (UNSET: left out of the payload, as the JSON had it) or null.
        return kind if self.required else kind | None | msgspec.UnsetType


def _positive(v: Any) -> str | None:
    return None if v > 0 else f"must be > 0, got {v}"


def _currency(v: Any) -> str | None:
    return None if v in CURRENCIES else f"{v!r} is not a known ISO-4217 currency code"


def _location(v: Any) -> str | None:
    return None if _LOCATION.match(v) else f"{v!r} is not a region code like 'US-NYC'"


def _timestamp(v: Any) -> str | None:
    return None if _ISO_TIME.match(v) else f"{v!r} is not an ISO-8601 UTC timestamp"


def _country(v: Any) -> str | None:
    return None if re.fullmatch(r"[A-Z]{2}", v) else f"{v!r} is not a two-letter country code like 'US'"


def country_of(location: str) -> str:
    """The country part of a region code: ``US-NYC`` -> ``US``."""
    return location.split("-", 1)[0]


def _non_empty(v: Any) -> str | None:
    return None if v.strip() else "must not be empty"


# msgspec's patterns are searched (re.search), as _LOCATION.match and _ISO_TIME.match anchor with "^";
# "\S" is str.strip()'s notion of "not only whitespace" (both use str.isspace).
_ID = Field(str, check=_non_empty, meta=msgspec.Meta(pattern=r"\S"))
_AMOUNT = Field(int, check=_positive, meta=msgspec.Meta(gt=0))
_CURRENCY = Field(str, check=_currency, choices=CURRENCIES)
_LOC = Field(str, check=_location, meta=msgspec.Meta(pattern=_LOCATION.pattern))
_TIME = Field(str, check=_timestamp, meta=msgspec.Meta(pattern=_ISO_TIME.pattern))
_REASON = Field(str, required=False)
_COUNTRY_CODE = msgspec.Meta(pattern=r"\A[A-Z]{2}\Z")
_COUNTRY = Field(str, check=_country, meta=_COUNTRY_CODE)

COMMANDS: dict[str, dict[str, Field]] = {
    "OpenAccount": {"customer_id": _ID, "credit_limit_minor": _AMOUNT, "currency": _CURRENCY},
    "AuthorizePayment": {"payment_id": _ID, "amount_minor": _AMOUNT, "currency": _CURRENCY,
                         "merchant_id": _ID, "location": _LOC, "occurred_at": _TIME,
                         # Where the merchant is; defaults to the country of ``location``.
                         "merchant_country": Field(str, required=False, check=_country, meta=_COUNTRY_CODE)},
    "ReportDeviceLocation": {"location": _LOC, "occurred_at": _TIME},
    "FreezeAccount": {"reason": _REASON},
    "UnfreezeAccount": {"reason": _REASON},
    "FlagFraud": {"payment_id": _ID, "rule": _ID, "evidence": Field(str, required=False),
                  "occurred_at": Field(str, required=False, check=_timestamp, meta=_TIME.meta)},
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
}

# The schema version each event type is written at today (the version EVENTS describes). Every older version
# needs an upcaster in event_store.upcasting; tests/unit/test_upcasting.py checks that none is missing.
EVENT_SCHEMA_VERSIONS: dict[str, int] = {**{name: 1 for name in EVENTS}, "PaymentAuthorized": 2}


def validate_payload(schema: Mapping[str, Field], payload: Mapping[str, Any], what: str) -> None:
    """Raise InvalidRecord naming the first field that is missing, mistyped or out of range."""
    from event_store.envelope import InvalidRecord

    for name, spec in schema.items():
        value = payload.get(name)
        if value is None:
            if spec.required:
                raise InvalidRecord(f"{what}: payload is missing required field '{name}'")
            continue
        if not isinstance(value, spec.kind) or (spec.kind is int and isinstance(value, bool)):
            expected = spec.kind.__name__ if isinstance(spec.kind, type) else "/".join(k.__name__ for k in spec.kind)
            raise InvalidRecord(f"{what}: payload field '{name}' must be {expected}, "
                                f"got {type(value).__name__} {value!r}")
        problem = spec.check(value) if spec.check else None
        if problem:
            raise InvalidRecord(f"{what}: payload field '{name}' {problem}")


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
