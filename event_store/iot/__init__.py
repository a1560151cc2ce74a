"""The IoT telemetry domain: the ``device`` aggregate (registration, readings, decommissioning, anomalies).

``DOMAIN`` is what the registry (``event_store.domains``, ``_BUILT_IN``) knows of it: the handler routes its
commands, the Spark event parser flattens its payload fields, and its read models (``read_models.iot``) and
suites (``expectations.iot``) are in the read-model and suite registries.
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
