"""Which events of the log the read models apply: each aggregate's events once, in version order, no gap.

The pure rule (no Spark); ``spark_apps.sequence`` is its vectorised twin, which every read model's events
pass before any model sees them, so the read models never disagree about which events count:

- an event id seen before is a duplicate and counts once;
- the first event at an (aggregate_id, aggregate_version) takes that version; a *different* event at a taken
  version is a version conflict: it counts nowhere and is dead-lettered, naming both event ids;
- an aggregate's events count from version 1 up, without a gap: a later version waits until the ones before
  it are there (per-partition order normally guarantees that; a gap only comes from records written around
  the command handler).

"First" is log order: the events as listed here, the (partition, offset) order in Spark.

A live engine cannot hold every event ever admitted, and need not: ``spark_apps.sequence`` judges a batch by
its aggregates' heads (last admitted version and event id). A record above its head is new when its id is the
derivation of its own fields (``event_store.decider.event_id_for``); at the head, the head's id tells a
duplicate from a conflict; below the head, and for an id that is not its derivation, it looks the record up
by key. The verdicts are this function's (tests/integration/test_sequence_heads.py).
"""
from __future__ import annotations

from typing import Iterable, NamedTuple

__all__ = ["Sequenced", "sequence"]


class Sequenced(NamedTuple):
    admitted: list  # in log order of admission: per aggregate, versions 1, 2, 3, ...
    conflicts: list  # (the event, the event id that holds its version)
    waiting: list  # events after a gap


def sequence(events: Iterable) -> Sequenced:
    """Split ``events`` (envelopes in log order) into what the read models apply, the version conflicts and
    what still waits for an earlier version."""
    events = list(events)  # read twice below: a generator would leave the second pass empty
    seen: set[str] = set()
    taken: dict[tuple[str, int], object] = {}
    for e in events:
        if e.event_id in seen:
            continue
        seen.add(e.event_id)
        taken.setdefault((e.aggregate_id, e.aggregate_version), e)
    conflicts = []
    seen.clear()
    for e in events:
        if e.event_id in seen:  # a repeated id counts once, wherever the repeat claims to be
            continue
        seen.add(e.event_id)
        holder = taken[(e.aggregate_id, e.aggregate_version)]
        if holder.event_id != e.event_id:
            conflicts.append((e, holder.event_id))
    admitted, waiting = [], []
    heads: dict[str, int] = {}
    for (aggregate_id, version), e in sorted(taken.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if version == heads.get(aggregate_id, 0) + 1:
            heads[aggregate_id] = version
            admitted.append(e)
        else:
            waiting.append(e)
    return Sequenced(admitted, conflicts, waiting)
