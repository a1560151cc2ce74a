"""Payload schemas of the account domain's commands and events (docs/DESIGN.md, "The reference domain").

Built from the generic pieces of ``event_store.fields``; ``event_store.schemas`` holds the union over every
registered domain. Field names are the read models' names. Money is an integer count of minor units plus an
ISO-4217 code; locations are short region codes such as ``US-NYC``.
"""
from __future__ import annotations

from event_store.fields import AMOUNT_MAX_MINOR, ID, OPTIONAL_TIME, TIME, Field, sealable

__all__ = ["COMMANDS", "EVENTS", "EVENT_SCHEMA_VERSIONS", "CURRENCIES", "country_of"]

# ISO-4217 codes accepted by the account domain.
CURRENCIES = frozenset({"USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK", "NOK", "DKK", "PLN", "CZK",
                        "NZD", "SGD", "HKD", "BRL", "MXN", "INR", "ZAR", "CNY"})

# Full matches written with \A ... \Z, as in event_store.fields.
_LOCATION = r"\A[A-Z]{2}-[A-Z0-9]{2,6}\Z"
_COUNTRY_CODE = r"\A[A-Z]{2}\Z"


def country_of(location: str) -> str:
    """The country part of a region code: ``US-NYC`` -> ``US``."""
    return location.split("-", 1)[0]


_ID = ID
_TIME = TIME
_AMOUNT = Field(int, gt=0, le=AMOUNT_MAX_MINOR)
_CURRENCY = Field(str, choices=CURRENCIES, describe="a known ISO-4217 currency code")
# Personal data (issue 45, docs/forgetting.md): where the customer was (the phone's location, and where the card was
# used), and the fraud evidence that quotes those locations. ``customer_id`` is the data subject's id itself, a
# pseudonym kept in clear to find the subject's key; amounts and merchants stay in clear under it.
_LOC = Field(str, pattern=_LOCATION, describe="a region code like 'US-NYC'", personal=True)
_EVIDENCE = Field(str, required=False, personal=True)
# The customer's name and email on OpenAccount and AccountOpened: optional, so commands and events written before
# they existed still parse. Bounded by their patterns (a sealable field has no length limit of its own: its token
# is longer than its value).
_NAME = Field(str, required=False, pattern=r"\A\S.{0,199}\Z", describe="a name of 1 to 200 characters on one line",
              personal=True)
_EMAIL = Field(str, required=False, pattern=r"\A[^@\s]{1,64}@[^@\s]{1,255}\Z", describe="an email address",
               personal=True)
# The same fields in events: the plain value or, once the handler seals personal data (personal_data_seal), a
# sealed value (event_store.fields.sealable). Commands are validated in clear.
_SEALED_LOC, _SEALED_NAME, _SEALED_EMAIL = sealable(_LOC), sealable(_NAME), sealable(_EMAIL)
_REASON = Field(str, required=False)
_COUNTRY = Field(str, pattern=_COUNTRY_CODE, describe="a two-letter country code like 'US'")

COMMANDS: dict[str, dict[str, Field]] = {
    "OpenAccount": {"customer_id": _ID, "credit_limit_minor": _AMOUNT, "currency": _CURRENCY,
                    "customer_name": _NAME, "customer_email": _EMAIL},
    "AuthorizePayment": {"payment_id": _ID, "amount_minor": _AMOUNT, "currency": _CURRENCY,
                         "merchant_id": _ID, "location": _LOC, "occurred_at": _TIME,
                         # Where the merchant is; defaults to the country of ``location``.
                         "merchant_country": Field(str, required=False, pattern=_COUNTRY_CODE,
                                                   describe="a two-letter country code like 'US'")},
    "ReportDeviceLocation": {"location": _LOC, "occurred_at": _TIME},
    "FreezeAccount": {"reason": _REASON},
    "UnfreezeAccount": {"reason": _REASON},
    "FlagFraud": {"payment_id": _ID, "rule": _ID, "evidence": _EVIDENCE,
                  "occurred_at": OPTIONAL_TIME},
    # An operator's decision on a quarantined account (a record of it in the events topic cannot be read):
    # ``record`` names that record as "topic/partition/offset", ``reason`` says what was decided and why.
    "ResolveQuarantine": {"record": _ID, "reason": _ID, "resolved_by": _ID},
    # ``eventlake forget`` (issue 45, docs/forgetting.md), sent for each of the customer's accounts once their key is
    # gone: it names the customer (the pseudonym, no personal data) and is taken even while the account is quarantined.
    "ForgetSubject": {"customer_id": _ID},
}

EVENTS: dict[str, dict[str, Field]] = {
    "AccountOpened": {"customer_id": _ID, "credit_limit_minor": _AMOUNT, "currency": _CURRENCY,
                      "customer_name": _SEALED_NAME, "customer_email": _SEALED_EMAIL},
    # v2 adds merchant_country; v1 events are upcast with the country of their location
    # (event_store.account.upcasters).
    "PaymentAuthorized": {"payment_id": _ID, "amount_minor": _AMOUNT, "currency": _CURRENCY,
                          "merchant_id": _ID, "location": _SEALED_LOC, "merchant_country": _COUNTRY},
    "PaymentDeclined": {"payment_id": _ID, "amount_minor": _AMOUNT, "currency": _CURRENCY,
                        "merchant_id": _ID, "location": _SEALED_LOC, "reason": _ID},
    "DeviceLocationReported": {"location": _SEALED_LOC},
    "AccountFrozen": {"reason": _REASON},
    "AccountUnfrozen": {"reason": _REASON},
    "FraudSuspected": {"payment_id": _ID, "rule": _ID, "evidence": _EVIDENCE},
    # The audit trail of a ResolveQuarantine: the record given up, the operator's reason, who decided, and
    # (``evidence``) why the record could not be read. It takes the account's next version like any event.
    "QuarantineResolved": {"record": _ID, "reason": _ID, "resolved_by": _ID, "evidence": Field(str, required=False)},
    # The customer was forgotten (issue 45): the account's last event. It holds no personal data; read models null
    # the account's personal columns when they fold it, and the account refuses every later command.
    "SubjectForgotten": {"customer_id": _ID},
}

# The schema version each event type is written at today (the version EVENTS describes). Every older version
# needs an upcaster in event_store.account.upcasters; tests/unit/test_upcasting.py checks that none is missing.
EVENT_SCHEMA_VERSIONS: dict[str, int] = {**{name: 1 for name in EVENTS}, "PaymentAuthorized": 2}
