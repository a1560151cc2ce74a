"""The IoT telemetry domain: the ``device`` aggregate (registration, readings, decommissioning, anomalies).

``DOMAIN`` is what the registry (``event_store.domains``) would know of it. It is not in ``domains._BUILT_IN``
yet: the Spark event parser (``spark_apps/events.py``) still lists payload columns by hand and refuses at import
a registered schema whose fields it does not list, so the domain is registered once that parser takes its
columns from the domains' schemas. Until then tests register it (``domains.registered(iot.DOMAIN)``).
"""
from __future__ import annotations

from event_store.domain import Domain
from event_store.iot import schemas
from event_store.iot.aggregate import (AGGREGATE_TYPE, STATUSES, CommandRejected, DeviceState, NewEvent, decide,
                                       decode_state, encode_state, evolve, evolve_fields, quarantined)

__all__ = ["DOMAIN", "AGGREGATE_TYPE", "STATUSES", "DeviceState", "CommandRejected", "NewEvent", "decide", "evolve",
           "evolve_fields", "quarantined"]

DOMAIN = Domain(
    aggregate_type=AGGREGATE_TYPE,
    initial=DeviceState,
    decide=decide,
    evolve=evolve,
    evolve_fields=evolve_fields,
    commands=schemas.COMMANDS,
    events=schemas.EVENTS,
    event_schema_versions=schemas.EVENT_SCHEMA_VERSIONS,
    encode_state=encode_state,
    decode_state=decode_state,
    quarantined=quarantined,
    quarantine_resolved_event="DeviceQuarantineResolved",
)
