"""Upcasting: old event payloads are brought to the current schema on read, so the log is never rewritten.

Every reader of the events topic goes through :func:`upcast` (``EventEnvelope.from_dict`` calls it), so the
handler's state rebuild, the policy and the Python folds all see current-version events only. Each domain
brings one upcaster per (event type, version), taking a payload at that version to the next one
(``event_store/<domain>/upcasters.py``); ``UPCASTERS`` is their union (``event_store.domains``), and
:func:`upcast` chains them.
"""
from __future__ import annotations

from typing import Any, Mapping

from event_store.domain import Upcaster
from event_store.domains import UPCASTERS
from event_store.schemas import EVENT_SCHEMA_VERSIONS
from lakehouse.errors import BadInput

__all__ = ["UPCASTERS", "Upcaster", "upcast", "missing_upcasters", "UnknownSchemaVersion"]


class UnknownSchemaVersion(BadInput, ValueError):
    """An event whose schema version this code cannot read (newer than current, or no upcaster path)."""


def missing_upcasters() -> list[tuple[str, int]]:
    """(event type, version) pairs below the current schema version that have no upcaster (should be none)."""
    return [(name, v) for name, current in EVENT_SCHEMA_VERSIONS.items() for v in range(1, current)
            if (name, v) not in UPCASTERS]


def upcast(event_type: str, schema_version: int, payload: Mapping[str, Any], what: str = "event"
           ) -> tuple[int, dict[str, Any]]:
    """(current schema version, payload at that version) for a payload stored at ``schema_version``."""
    current = EVENT_SCHEMA_VERSIONS[event_type]
    if schema_version == current:
        return current, dict(payload)
    if schema_version > current or schema_version < 1:
        raise UnknownSchemaVersion(f"{what}: {event_type} schema_version {schema_version} is not readable here "
                                   f"(this code reads versions 1..{current}); upgrade eventlake to read it")
    data = dict(payload)
    for version in range(schema_version, current):
        step = UPCASTERS.get((event_type, version))
        if step is None:
            raise UnknownSchemaVersion(f"{what}: no upcaster for {event_type} from schema_version {version} "
                                       f"to {version + 1}")
        data = step(data)
    return current, data
