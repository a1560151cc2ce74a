"""The ``site`` aggregate: pure ``decide(state, command)`` and ``evolve(state, event)`` for a website's page views.

No Kafka here. A site is registered once (its id is never reused), records page views while active, and is
retired for good. Late and out-of-order views are recorded as they come: a view's ``viewed_at`` is its event time,
and the aggregate does not order views.

The state stays the same size however many views a site records: no view ids or visitors are kept. A view re-sent
with its command_id is answered from the handler's idempotency window; a view re-sent under a new command_id is
recorded again, so a sender derives a view's command_id from the site and its view id (as for a device's readings).
Why page views are a domain of their own, and what one aggregate per site costs: docs/DESIGN.md, "The site domain".
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from event_store.domain import Command, CommandRejected, Event, NewEvent, decide_quarantine

__all__ = ["SiteState", "NewEvent", "CommandRejected", "decide", "evolve", "evolve_fields", "quarantined",
           "encode_state", "decode_state", "AGGREGATE_TYPE", "STATUSES"]

AGGREGATE_TYPE = "site"
STATUSES = ("active", "retired")


@dataclass(frozen=True)
class SiteState:
    site_id: str
    version: int = 0
    registered: bool = False
    status: str = "active"
    site_name: str | None = None
    host: str | None = None
    page_views_recorded: int = 0
    # (record, reason) when the events topic holds a record of this site that cannot be read (record is
    # "topic/partition/offset"): the site takes no command but ResolveSiteQuarantine until an operator decides.
    quarantine: tuple[str, str] | None = None


def decide(state: SiteState, command: Command) -> list[NewEvent]:
    """The events ``command`` causes on ``state`` (possibly none), or CommandRejected."""
    p = command.payload
    kind = command.command_type
    if state.quarantine is not None or kind == "ResolveSiteQuarantine":
        return _decide_quarantine(state, command)
    if kind == "RecordPageView" and state.registered and state.status == "active":  # the frequent case first
        return [NewEvent("PageViewed", {"view_id": p["view_id"], "page": p["page"], "visitor_id": p["visitor_id"]},
                         p["viewed_at"])]
    if kind == "RegisterSite":
        if state.registered:
            raise CommandRejected(
                "SiteAlreadyRegistered", f"site {state.site_id} is already registered ({state.status}, "
                                         f"{state.site_name!r} at {state.host}); a site id is registered once and "
                                         f"never reused")
        return [NewEvent("SiteRegistered", {"site_name": p["site_name"], "host": p["host"]}, command.issued_at)]
    if not state.registered:
        raise CommandRejected("SiteNotFound",
                              f"site {state.site_id} is not registered; send RegisterSite first"
                              + (f" (view {p['view_id']} of {p['page']} not recorded)" if kind == "RecordPageView"
                                 else ""))
    if kind == "RecordPageView":  # registered, so retired
        raise CommandRejected(
            "SiteNotActive", f"site {state.site_id} is retired; view {p['view_id']} of {p['page']} (viewed at "
                             f"{p['viewed_at']}) is not recorded")
    if kind == "RetireSite":
        # Retiring a retired site changes nothing: accepted, no event (it may be sent twice).
        if state.status == "retired":
            return []
        return [NewEvent("SiteRetired", {"reason": p.get("reason")}, command.issued_at)]
    raise CommandRejected("UnknownCommand", f"command type {kind!r} is not handled by the site aggregate")


def _decide_quarantine(state: SiteState, command: Command) -> list[NewEvent]:
    return decide_quarantine(f"site {state.site_id}", state.quarantine, command, "ResolveSiteQuarantine",
                             "SiteQuarantineResolved", "SiteQuarantined",
                             lambda record: f"an operator sends ResolveSiteQuarantine with record {record!r} "
                                            f"(eventlake submit)")


def quarantined(state: SiteState, record: str, reason: str) -> SiteState:
    """``state`` once a record of it (``record``: "topic/partition/offset") turned out unreadable. The first
    such record stands until resolved."""
    return state if state.quarantine is not None else replace(state, quarantine=(record, reason))


def evolve(state: SiteState, event: Event) -> SiteState:
    """``state`` after ``event``. Envelopes also advance ``version``; bare NewEvents do not."""
    return evolve_fields(state, event.event_type, event.payload, getattr(event, "aggregate_version", None))


def evolve_fields(state: SiteState, kind: str, p: Mapping[str, Any], version: int | None) -> SiteState:
    """``evolve`` from an event's type, payload and (if not None) aggregate version, without an envelope."""
    changes: dict = {} if version is None else {"version": version}
    if kind == "PageViewed":
        changes["page_views_recorded"] = state.page_views_recorded + 1
    elif kind == "SiteRegistered":
        changes.update(registered=True, status="active", site_name=p["site_name"], host=p["host"])
    elif kind == "SiteRetired":
        changes["status"] = "retired"
    elif kind == "SiteQuarantineResolved":
        if state.quarantine is not None and state.quarantine[0] == p["record"]:
            changes["quarantine"] = None
    else:
        raise ValueError(f"site aggregate cannot apply unknown event type {kind!r}")
    return replace(state, **changes) if changes else state


def encode_state(state: SiteState) -> dict:
    """The state as a JSON object (its snapshot form)."""
    fields = dict(state.__dict__)
    fields["quarantine"] = list(state.quarantine) if state.quarantine else None
    return fields


def decode_state(fields: dict) -> SiteState:
    """The state ``encode_state`` wrote."""
    fields = dict(fields)
    fields["quarantine"] = tuple(fields["quarantine"]) if fields.get("quarantine") else None
    return SiteState(**fields)
