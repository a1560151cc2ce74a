"""Hypothesis strategies for event logs as Kafka can deliver them (used by the property-based tests).

A clean log comes from the domain (``tests.domain_helpers.events_for``). It is split into partitions the way
Kafka keys it (an aggregate lives in one partition), then transformed inside each partition: duplicates of a
record, replays of a slice, optionally forged records written around the command handler (a different event at
a taken version, an event after a gap or right after the last version). The partitions are then interleaved in
an arbitrary order that keeps each partition's own order: the only order Kafka promises.
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from functools import lru_cache

from hypothesis import strategies as st

from event_store.envelope import EventEnvelope
from eventlake.generator import GeneratorConfig
from tests.domain_helpers import events_for

__all__ = ["Log", "logs", "interleavings", "partition_of", "forged", "short"]


def short(e: EventEnvelope) -> str:
    """An event in a line: the account's number, the version and the start of the event id."""
    return f"{e.aggregate_id[-2:]}:v{e.aggregate_version}:{e.event_id[:8]}"


def partition_of(aggregate_id: str, partitions: int) -> int:
    """The partition an aggregate's records go to (a stable hash of the key, as Kafka's partitioner)."""
    return zlib.crc32(aggregate_id.encode()) % partitions


@lru_cache(maxsize=256)
def _clean(accounts: int, commands: int, seed: int, flag_every: int) -> tuple[EventEnvelope, ...]:
    return tuple(events_for(GeneratorConfig(accounts=accounts, commands=commands, seed=seed, run_id="prop",
                                            late_rate=0.05), flag_every=flag_every))


def forged(event: EventEnvelope, event_id: str, **changes) -> EventEnvelope:
    """A copy of ``event`` under another event id (a different event), with envelope ``changes``; a payment
    or fraud alert gets its own payment id, so it is a different fact, not a copy."""
    obj = json.loads(event.to_json())
    obj.update(changes, event_id=event_id)
    if "payment_id" in obj["payload"]:
        obj["payload"]["payment_id"] = f"pay-{event_id}"
    if "amount_minor" in obj["payload"]:
        obj["payload"]["amount_minor"] += 1
    return EventEnvelope.from_dict(obj)


@dataclass(frozen=True)
class Log:
    clean: tuple[EventEnvelope, ...]  # what the command handler wrote, in its order
    partitions: tuple[tuple[EventEnvelope, ...], ...]  # each partition's records, transformed, in their order
    merged: tuple[EventEnvelope, ...]  # one interleaving of the partitions (what a consumer may see)
    forgeries: tuple[str, ...]  # what was forged, in words (shown in a falsifying example)

    def __repr__(self) -> str:
        """A falsifying example worth reading: each partition's records as account:version:event id."""
        return (f"Log(clean={len(self.clean)} events, forgeries={list(self.forgeries)}, partitions="
                f"{[[short(e) for e in p] for p in self.partitions]})")

    def _repr_pretty_(self, printer, cycle) -> None:  # Hypothesis prints examples with this
        printer.text(repr(self))


def _position(draw, length: int, low: int = 0) -> int:
    """An insertion position in ``low..length``."""
    return draw(st.integers(low, max(low, length)))


@st.composite
def interleavings(draw, partitions) -> tuple[EventEnvelope, ...]:
    """One interleaving of ``partitions`` that keeps each partition's order."""
    heads = [0] * len(partitions)
    out = []
    total = sum(len(p) for p in partitions)
    while len(out) < total:
        open_ = [i for i, p in enumerate(partitions) if heads[i] < len(p)]
        i = open_[draw(st.integers(0, len(open_) - 1))] if len(open_) > 1 else open_[0]
        out.append(partitions[i][heads[i]])
        heads[i] += 1
    return tuple(out)


@st.composite
def logs(draw, forge: bool = False, max_accounts: int = 4, max_commands: int = 40, max_partitions: int = 4):
    """A generated log with duplicates and replays in each partition and, with ``forge``, forged records."""
    accounts = draw(st.integers(1, max_accounts), label="accounts")
    commands = draw(st.integers(accounts, accounts + max_commands), label="commands")
    seed = draw(st.integers(0, 2**16), label="seed")
    flag_every = draw(st.sampled_from([0, 2, 5]), label="flag_every")
    n = draw(st.integers(1, max_partitions), label="partitions")
    clean = _clean(accounts, commands, seed, flag_every)
    parts: list[list[EventEnvelope]] = [[] for _ in range(n)]
    for e in clean:
        parts[partition_of(e.aggregate_id, n)].append(e)
    forgeries = []
    for p, records in enumerate(parts):
        if not records:
            continue
        # Duplicates: a record again, later in its partition (a producer retry, a second writer).
        for _ in range(draw(st.integers(0, 4))):
            i = draw(st.integers(0, len(records) - 1))
            records.insert(_position(draw, len(records), i + 1), records[i])
        # Replays: a slice of the partition again, after its start (a re-sent batch, a restore).
        for _ in range(draw(st.integers(0, 2))):
            start = draw(st.integers(0, len(records) - 1))
            end = draw(st.integers(start + 1, min(len(records), start + 12)))
            at = _position(draw, len(records), start + 1)
            records[at:at] = records[start:end]
        if not forge:
            continue
        for k in range(draw(st.integers(0, 3))):
            victim = records[draw(st.integers(0, len(records) - 1))]
            event_id = f"forged-{p}-{k}-{victim.event_id[:8]}"
            last = max(e.aggregate_version for e in clean if e.aggregate_id == victim.aggregate_id)
            kind = draw(st.sampled_from(["conflict", "after_gap", "next"]))
            version = {"conflict": victim.aggregate_version, "after_gap": last + 2, "next": last + 1}[kind]
            # Anywhere in the partition: a forged record before the real one takes its version.
            records.insert(_position(draw, len(records)), forged(victim, event_id, aggregate_version=version))
            forgeries.append(f"{kind} {event_id} at v{version} of {victim.aggregate_id}")
    partitions = tuple(tuple(r) for r in parts)
    return Log(clean, partitions, draw(interleavings(partitions)), tuple(forgeries))
