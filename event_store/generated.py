"""What the domains' data generators share (``event_store/<domain>/generator.py``): a stream of generated commands
as the (key, JSON) records a producer sends."""
from __future__ import annotations

import random
import uuid
from typing import Iterator

from event_store.envelope import dumps, format_time
from event_store.fields import validate_payload

__all__ = ["command_records"]


def command_records(stream, aggregate_type: str, schemas, ids: random.Random) -> Iterator[tuple[str, bytes]]:
    """(key, command JSON) of a generator's (arrival, tiebreak, aggregate id, command type, payload) items in
    arrival order, as ``CommandEnvelope.to_json`` writes them; ``ids`` draws the command ids (a generator's own,
    salted by its domain, so two generators with one seed make different ids)."""
    for arrival, _, aggregate_id, kind, payload in sorted(stream, key=lambda item: (item[0], item[1])):
        command_id = str(uuid.UUID(int=ids.getrandbits(128), version=4))
        validate_payload(schemas[kind], payload, f"generated command {command_id} ({kind})")
        yield aggregate_id, dumps({"command_id": command_id, "command_type": kind, "aggregate_id": aggregate_id,
                                   "payload": payload, "aggregate_type": aggregate_type, "expected_version": None,
                                   "issued_at": format_time(arrival), "correlation_id": None,
                                   "causation_id": None})
