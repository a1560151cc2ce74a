"""The site domain: the ``site`` aggregate (a website: registration, page views, retirement).

``DOMAIN`` is what the registry (``event_store.domains``, ``_BUILT_IN``) knows of it; its read model
(``read_models.site``) and suite (``expectations.site``) are registered with the others.
"""
from __future__ import annotations

from event_store.domain import Domain
from event_store.site import schemas
from event_store.site.aggregate import (AGGREGATE_TYPE, STATUSES, CommandRejected, NewEvent, SiteState, decide,
                                        decode_state, encode_state, evolve, evolve_fields, quarantined)

__all__ = ["DOMAIN", "AGGREGATE_TYPE", "STATUSES", "SiteState", "CommandRejected", "NewEvent", "decide", "evolve",
           "evolve_fields", "quarantined"]

DOMAIN = Domain(
    aggregate_type=AGGREGATE_TYPE,
    initial=SiteState,
    decide=decide,
    evolve=evolve,
    evolve_fields=evolve_fields,
    commands=schemas.COMMANDS,
    events=schemas.EVENTS,
    event_schema_versions=schemas.EVENT_SCHEMA_VERSIONS,
    encode_state=encode_state,
    decode_state=decode_state,
    quarantined=quarantined,
    quarantine_resolved_event="SiteQuarantineResolved",
)
