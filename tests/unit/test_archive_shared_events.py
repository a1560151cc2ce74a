"""The archive's batch takes its events from the read models' batches since its last (``_shared_events``), pure:
only when those batches hold exactly its records, in order; otherwise it parses its records itself."""
from __future__ import annotations

import pyarrow as pa

from spark_apps.python_projection import _shared_events


def span(starts: dict, ends: dict) -> tuple:
    return tuple(sorted(starts.items())), tuple(sorted(ends.items()))


def piece(starts: dict, ends: dict, *ids: str):
    return span(starts, ends), pa.table({"event_id": list(ids)})


def test_the_read_models_batches_since_the_archives_last_make_its_batch_in_log_order():
    pieces = [piece({0: 0, 1: 0}, {0: 2, 1: 0}, "a", "b"), piece({0: 2, 1: 0}, {0: 2, 1: 3}, "c"),
              piece({0: 2, 1: 3}, {0: 4, 1: 5}, "d", "e")]
    events, later = _shared_events(pieces, span({0: 0, 1: 0}, {0: 4, 1: 5}))
    assert events.column("event_id").to_pylist() == ["a", "b", "c", "d", "e"]
    assert later == []


def test_an_archive_batch_ending_before_the_read_models_keeps_the_batches_after_it():
    pieces = [piece({0: 0}, {0: 2}, "a", "b"), piece({0: 2}, {0: 5}, "c"), piece({0: 5}, {0: 9}, "d")]
    events, later = _shared_events(pieces, span({0: 0}, {0: 5}))
    assert events.column("event_id").to_pylist() == ["a", "b", "c"]
    assert later == pieces[2:]
    events, later = _shared_events(later, span({0: 5}, {0: 9}))
    assert events.column("event_id").to_pylist() == ["d"] and later == []


def test_records_not_all_in_the_read_models_batches_are_parsed_again():
    pieces = [piece({0: 0}, {0: 2}, "a", "b"), piece({0: 3}, {0: 5}, "d")]  # offset 2's batch is missing
    assert _shared_events(pieces, span({0: 0}, {0: 5}))[0] is None
    # the archive's batch ends inside a read models' batch (its own read limit)
    assert _shared_events([piece({0: 0}, {0: 4}, "a")], span({0: 0}, {0: 2}))[0] is None
    # the archive is further along than the read models' batches kept (its checkpoint ahead): they are dropped
    events, later = _shared_events([piece({0: 0}, {0: 2}, "a")], span({0: 2}, {0: 4}))
    assert events is None and later == []
    assert _shared_events([], span({0: 0}, {0: 2})) == (None, [])
