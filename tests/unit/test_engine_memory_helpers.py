"""What the memory benchmark's longer logs are made of (bench/projection.py ``continued_copies``,
``relabeled_copies``), pure. The Python engine's index of keys: tests/unit/test_known_tables.py."""
from __future__ import annotations

from collections import Counter

import pytest

from bench.projection import continued_copies, generated_events, relabeled_copies
from event_store.envelope import EventEnvelope


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
