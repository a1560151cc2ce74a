"""What the memory benchmark's longer logs are made of (bench/projection.py ``continued_copies``,
``relabeled_copies``) and the Python engine's index of keys (``Hashes``), pure."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from bench.projection import continued_copies, generated_events, relabeled_copies
from event_store.envelope import EventEnvelope
from python_engine.caches import Hashes


@pytest.mark.parametrize("made, accounts", [(continued_copies, 60), (relabeled_copies, 180)])
def test_copies_make_a_longer_log_of_gap_free_versions_and_ids_of_their_own(tmp_path, made, accounts):
    records = generated_events(2000, 60, tmp_path)
    out = made(records, 3)
    events = [EventEnvelope.from_json(value) for _, value in out]
    assert [key.decode() for key, _ in out] == [e.aggregate_id for e in events]
    versions: dict[str, int] = {}
    for e in events:  # in log order, each account's versions go on from 1 without a gap
        assert e.aggregate_version == versions.get(e.aggregate_id, 0) + 1, (e.aggregate_id, e.aggregate_version)
        versions[e.aggregate_id] = e.aggregate_version
    assert len(versions) == accounts
    assert len({e.event_id for e in events}) == len(events)
    paid = Counter(e.payload["payment_id"] for e in events if e.event_type == "PaymentAuthorized")
    assert paid and max(paid.values()) == 1
    opened = sum(1 for e in events if e.event_type == "AccountOpened")
    assert opened == accounts
    assert len(out) == 3 * len(records) - (2 * 60 if made is continued_copies else 0)


def test_the_key_index_finds_every_key_added_and_misses_the_others():
    rng = np.random.default_rng(7)
    keys = rng.integers(0, 2**63, size=50_000, dtype=np.uint64)
    index = Hashes()
    for part in np.array_split(keys, 37):  # chunks of unequal sizes, merged as they grow
        index.add(part)
    assert len(index) == len(keys) and len(index.chunks) < 10
    assert all(np.all(c[:-1] <= c[1:]) for c in index.chunks)
    assert index.hits(keys[::7]) == len(keys[::7])
    others = np.setdiff1d(rng.integers(0, 2**63, size=5_000, dtype=np.uint64), keys)
    assert index.hits(others) == 0
    assert index.hits(np.concatenate((others, keys[:3]))) == 3
