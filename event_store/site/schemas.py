"""Payload schemas of the site domain's commands and events (the ``site`` aggregate: a website and its page views).

Built from the generic pieces of ``event_store.fields``, like the account's and the device's. Field names are one
column each in the flattened event rows (``spark_apps/events.py``), so a name this domain shares with another
(``reason``, ``record``, ``resolved_by``, ``evidence``) means the same there; its own names (``site_name``,
``host``, ``view_id``, ``page``, ``visitor_id``, ``viewed_at``) are used by no other domain.
"""
from __future__ import annotations

from event_store.fields import ID, TIME, Field

__all__ = ["COMMANDS", "EVENTS", "EVENT_SCHEMA_VERSIONS", "PAGE_MAX_LENGTH", "HOST_MAX_LENGTH", "PAGE_PATTERN",
           "HOST_PATTERN"]

PAGE_MAX_LENGTH = 1024
HOST_MAX_LENGTH = 253  # the DNS limit of a host name

# Full matches written with \A ... \Z, as in event_store.fields. ASCII classes only: Python's and Java's (the Spark
# checks, which run with (?U)) notions of letters and whitespace disagree outside ASCII, and these classes mean the
# same in both. A page is a URL path: '/' then RFC 3986 path characters (non-ASCII percent-encoded), so no
# whitespace, no control character, and no '?' or '#': a query string or fragment is not part of the page (it
# would split one page's clicks over as many keys as it has query strings).
PAGE_PATTERN = r"\A/[A-Za-z0-9._~!$&'()*+,;=:@%/-]{0," + str(PAGE_MAX_LENGTH - 1) + r"}\Z"
# A lower-case DNS host name: labels of letters, digits and inner hyphens, joined by dots; no scheme, port or path.
HOST_PATTERN = r"\A[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*\Z"

_PAGE = Field(str, pattern=PAGE_PATTERN, max_length=PAGE_MAX_LENGTH,
              describe="a URL path like '/pricing' (starting with '/', without whitespace, '?' or '#')")
_HOST = Field(str, pattern=HOST_PATTERN, max_length=HOST_MAX_LENGTH,
              describe="a lower-case host name like 'shop.example.com' (no scheme, port or path)")
_SITE_NAME = Field(str, pattern=r"\A[ -~]*[!-~][ -~]*\Z", max_length=200,
                   describe="a name of printable ASCII characters, not blank")
_REASON = Field(str, required=False)

_SITE = {"site_name": _SITE_NAME, "host": _HOST}

COMMANDS: dict[str, dict[str, Field]] = {
    # The site id is the aggregate id.
    "RegisterSite": dict(_SITE),
    # ``view_id`` names the view (as a device's reading_id): a sender derives the command_id from the site and the
    # view id, so a re-sent view is answered from the handler's idempotency window. ``viewed_at`` is its event
    # time, which may be long before the command arrives and before views already recorded (late, out of order).
    "RecordPageView": {"view_id": ID, "page": _PAGE, "visitor_id": ID, "viewed_at": TIME},
    "RetireSite": {"reason": _REASON},
    # An operator's decision on a quarantined site, as the account's ResolveQuarantine (type names are unique
    # across domains).
    "ResolveSiteQuarantine": {"record": ID, "reason": ID, "resolved_by": ID},
}

EVENTS: dict[str, dict[str, Field]] = {
    "SiteRegistered": dict(_SITE),
    # The envelope's occurred_at is the view's viewed_at.
    "PageViewed": {"view_id": ID, "page": _PAGE, "visitor_id": ID},
    "SiteRetired": {"reason": _REASON},
    "SiteQuarantineResolved": {"record": ID, "reason": ID, "resolved_by": ID, "evidence": Field(str, required=False)},
}

# Every event type is at version 1: the domain has no upcasters yet.
EVENT_SCHEMA_VERSIONS: dict[str, int] = {name: 1 for name in EVENTS}
