"""The ``account`` aggregate: pure ``decide(state, command)`` and ``evolve(state, event)``.

No Kafka here. ``decide`` returns the events a command causes, or raises :class:`CommandRejected`;
``evolve`` folds one event into the state. The decider owns versions, ids, timestamps and the
``expected_version`` check (``event_store.decider``), for every domain alike.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from immutables import Map

from event_store.account.schemas import country_of
from event_store.domain import Command, CommandRejected, Event, NewEvent, decide_quarantine

__all__ = ["AccountState", "NewEvent", "CommandRejected", "decide", "evolve", "evolve_fields", "quarantined",
           "subject_of",
           "encode_state", "decode_state", "payment_ids_split", "payment_id_probe", "payment_id_known",
           "DECLINE_REASONS", "AGGREGATE_TYPE"]

AGGREGATE_TYPE = "account"
DECLINE_REASONS = ("over_credit_limit", "account_frozen")


@dataclass(frozen=True)
class AccountState:
    account_id: str
    version: int = 0
    opened: bool = False
    customer_id: str | None = None
    status: str = "open"
    credit_limit_minor: int = 0
    currency: str | None = None
    authorized_total_minor: int = 0
    payments_authorized: int = 0
    payments_declined: int = 0
    last_device_location: str | None = None
    # Every payment id this account has seen (authorized or declined), as the keys of a persistent map (values
    # None): a payment id is used once per account. Adding one id shares the rest (O(log n)), where a frozenset
    # would copy every id on every payment and make folding a long-lived account quadratic (bench/payment_ids.py).
    # A HAMT (immutables) rather than pyrsistent's pset: each version of a pset is a new C vector whose garbage-
    # collector traversal visits every id it holds, so the handler's young-generation collections grew with its
    # accounts to seconds (bench/payment_ids.py --collector); a HAMT version's new nodes hold ~32 references each.
    #
    # With the handler's state store (issue 42) the state holds only the ids not yet written to it and the ones
    # the handler looked up for the command at hand (``payment_id_probe`` / ``payment_id_known``): the store keeps
    # each payment id as a key of its own per account (``payment_ids_split`` takes them out of the state when it
    # is stored), so a long-lived account's state stays the size of its fields, not of its history. ``decide``
    # asks only whether the command's own payment id is known, which either form answers alike.
    payment_ids: Map = Map()
    # (record, reason) when the events topic holds a record of this account that cannot be read (record is
    # "topic/partition/offset"): the account takes no command but ResolveQuarantine until an operator decides.
    quarantine: tuple[str, str] | None = None
    # The customer was forgotten (SubjectForgotten, issue 45): the account refuses every command from then on.
    forgotten: bool = False

    @property
    def available_minor(self) -> int:
        return self.credit_limit_minor - self.authorized_total_minor


def decide(state: AccountState, command: Command) -> list[NewEvent]:
    """The events ``command`` causes on ``state`` (possibly none), or CommandRejected."""
    p = command.payload
    kind = command.command_type
    if state.forgotten or kind == "ForgetSubject":
        return _decide_forget(state, command)
    if state.quarantine is not None or kind == "ResolveQuarantine":
        return _decide_quarantine(state, command)
    if kind == "AuthorizePayment" and state.opened:  # by far the most frequent command: tested first
        currency = p["currency"]
        if p["payment_id"] in state.payment_ids:
            raise CommandRejected("DuplicatePayment", f"payment {p['payment_id']} was already attempted on account "
                                                      f"{state.account_id}; a payment id is used once")
        if currency != state.currency:
            raise CommandRejected("CurrencyMismatch", f"payment {p['payment_id']} is in {currency} but "
                                                      f"account {state.account_id} is in {state.currency}")
        payment = {"payment_id": p["payment_id"], "amount_minor": p["amount_minor"], "currency": currency,
                   "merchant_id": p["merchant_id"], "location": p["location"]}
        if state.status == "frozen":
            payment["reason"] = "account_frozen"
            return [NewEvent("PaymentDeclined", payment, p["occurred_at"])]
        if payment["amount_minor"] > state.credit_limit_minor - state.authorized_total_minor:
            payment["reason"] = "over_credit_limit"
            return [NewEvent("PaymentDeclined", payment, p["occurred_at"])]
        payment["merchant_country"] = p.get("merchant_country") or country_of(payment["location"])
        return [NewEvent("PaymentAuthorized", payment, p["occurred_at"])]
    if kind == "OpenAccount":
        if state.opened:
            raise CommandRejected("AccountAlreadyOpen", f"account {state.account_id} is already open")
        opened = {"customer_id": p["customer_id"], "credit_limit_minor": p["credit_limit_minor"],
                  "currency": p["currency"]}
        for name in ("customer_name", "customer_email"):  # optional: absent stays absent (older commands)
            if p.get(name) is not None:
                opened[name] = p[name]
        return [NewEvent("AccountOpened", opened, command.issued_at)]
    if not state.opened:
        raise CommandRejected("AccountNotFound",
                              f"account {state.account_id} does not exist; send OpenAccount first")
    if kind == "ReportDeviceLocation":
        return [NewEvent("DeviceLocationReported", {"location": p["location"]}, p["occurred_at"])]
    if kind == "FreezeAccount":
        # Freezing a frozen account changes nothing: accepted, no event (a policy may send it twice).
        if state.status == "frozen":
            return []
        return [NewEvent("AccountFrozen", {"reason": p.get("reason")}, command.issued_at)]
    if kind == "UnfreezeAccount":
        if state.status == "open":
            return []
        return [NewEvent("AccountUnfrozen", {"reason": p.get("reason")}, command.issued_at)]
    if kind == "FlagFraud":
        return [NewEvent("FraudSuspected", {"payment_id": p["payment_id"], "rule": p["rule"],
                                            "evidence": p.get("evidence")},
                         p.get("occurred_at") or command.issued_at)]
    raise CommandRejected("UnknownCommand", f"command type {kind!r} is not handled by the account aggregate")


def subject_of(state: AccountState, command: Command) -> str | None:
    """The data subject of ``command`` on ``state`` (``Domain.subject``): the customer, by the ``customer_id`` the
    account was opened with (the command's own for an OpenAccount of an account not opened yet). One customer may
    hold several accounts: forgetting the person forgets them all with one key. None before OpenAccount (the
    command is then refused as AccountNotFound, holding nothing to seal)."""
    if state.customer_id is not None:
        return state.customer_id
    return command.payload.get("customer_id") if command.command_type == "OpenAccount" else None


def _decide_forget(state: AccountState, command: Command) -> list[NewEvent]:
    """ForgetSubject, or any command once the customer is forgotten. ForgetSubject names the account's customer
    (whose key ``eventlake forget`` deleted): SubjectForgotten, even while quarantined (the law does not wait for an
    operator); again: accepted, no event (forget may run twice). Any other command of a forgotten customer's account
    is refused."""
    if command.command_type != "ForgetSubject":
        raise CommandRejected("SubjectForgotten", f"account {state.account_id}: its customer {state.customer_id!r} "
                                                  f"was forgotten; the account takes no command (docs/forgetting.md)")
    if not state.opened:
        raise CommandRejected("AccountNotFound", f"account {state.account_id} does not exist; nothing to forget")
    if command.payload["customer_id"] != state.customer_id:
        raise CommandRejected("SubjectMismatch", f"account {state.account_id} belongs to customer "
                                                 f"{state.customer_id!r}, not {command.payload['customer_id']!r}")
    if state.forgotten:
        return []
    return [NewEvent("SubjectForgotten", {"customer_id": state.customer_id}, command.issued_at)]


def _decide_quarantine(state: AccountState, command: Command) -> list[NewEvent]:
    return decide_quarantine(f"account {state.account_id}", state.quarantine, command, "ResolveQuarantine",
                             "QuarantineResolved", "AccountQuarantined",
                             lambda record: f"an operator resolves it: eventlake resolve-quarantine "
                                            f"{state.account_id} --record {record} --reason '...'")


def quarantined(state: AccountState, record: str, reason: str) -> AccountState:
    """``state`` once a record of it (``record``: "topic/partition/offset") turned out unreadable. The first
    such record stands until resolved; the next one then quarantines the account again."""
    return state if state.quarantine is not None else _replace(state, {"quarantine": (record, reason)})


def evolve(state: AccountState, event: Event) -> AccountState:
    """``state`` after ``event``. Envelopes also advance ``version``; bare NewEvents do not."""
    return evolve_fields(state, event.event_type, event.payload, getattr(event, "aggregate_version", None))


def evolve_fields(state: AccountState, kind: str, p: Mapping[str, Any], version: int | None) -> AccountState:
    """``evolve`` from an event's type, payload and (if not None) aggregate version, without an envelope."""
    # One copy per event (it is the costly part of the handler's state update).
    changes: dict = {} if version is None else {"version": version}
    if kind == "AccountOpened":
        changes.update(opened=True, customer_id=p["customer_id"], status="open",
                       credit_limit_minor=p["credit_limit_minor"], currency=p["currency"])
    elif kind == "PaymentAuthorized":
        changes.update(authorized_total_minor=state.authorized_total_minor + p["amount_minor"],
                       payments_authorized=state.payments_authorized + 1,
                       payment_ids=state.payment_ids.set(p["payment_id"], None))
    elif kind == "PaymentDeclined":
        changes.update(payments_declined=state.payments_declined + 1,
                       payment_ids=state.payment_ids.set(p["payment_id"], None))
    elif kind == "DeviceLocationReported":
        changes.update(last_device_location=p["location"])
    elif kind == "AccountFrozen":
        changes.update(status="frozen")
    elif kind == "AccountUnfrozen":
        changes.update(status="open")
    elif kind == "QuarantineResolved":
        if state.quarantine is not None and state.quarantine[0] == p["record"]:
            changes.update(quarantine=None)
    elif kind == "SubjectForgotten":
        changes.update(forgotten=True, last_device_location=None)
    elif kind != "FraudSuspected":
        raise ValueError(f"account aggregate cannot apply unknown event type {kind!r}")
    return _replace(state, changes) if changes else state


_new = object.__new__


def _replace(state: AccountState, changes: dict) -> AccountState:
    """``dataclasses.replace(state, **changes)`` for the known fields ``evolve`` sets, at a fraction of its cost
    (it re-runs the frozen __init__ field by field): a copy of the instance dict with ``changes`` applied."""
    new = _new(AccountState)
    fields = new.__dict__
    fields.update(state.__dict__)
    fields.update(changes)
    return new


def encode_state(state: AccountState) -> dict:
    """``dataclasses.asdict(state)`` with the payment ids as a list (JSON has no sets; their order never
    mattered, and sorting them was a fifth of a snapshot's encoding), left out when there is none (a stored
    state: its ids are in the store's index): its snapshot form."""
    fields = dict(state.__dict__)
    if state.payment_ids:
        fields["payment_ids"] = list(state.payment_ids)
    else:
        del fields["payment_ids"]
    return fields


_NO_IDS = Map()


def payment_ids_split(state: AccountState) -> tuple[AccountState, list[str]]:
    """(``state`` without its payment ids, those ids): what the state store keeps of an account, and the keys of
    its payment-id index (``Domain.index_split``)."""
    if not state.payment_ids:
        return state, []
    return _replace(state, {"payment_ids": _NO_IDS}), list(state.payment_ids)


def payment_id_probe(command: Command) -> str | None:
    """The payment id whose use ``decide`` checks for ``command`` (``Domain.index_probe``), or None."""
    return command.payload.get("payment_id") if command.command_type == "AuthorizePayment" else None


def payment_id_known(state: AccountState, payment_id: str) -> AccountState:
    """``state`` knowing that ``payment_id`` was used on the account (``Domain.index_known``)."""
    if payment_id in state.payment_ids:
        return state
    return _replace(state, {"payment_ids": state.payment_ids.set(payment_id, None)})


def decode_state(fields: dict) -> AccountState:
    """The state ``encode_state`` wrote."""
    fields = dict(fields)
    fields["payment_ids"] = Map(dict.fromkeys(fields.get("payment_ids") or ()))
    fields["quarantine"] = tuple(fields["quarantine"]) if fields.get("quarantine") else None
    return AccountState(**fields)
