"""When the projection's Python engine compacts each table (``CompactionTurns``), pure: every table on its own turn,
so that no live batch pays for several tables' compactions at once."""
from __future__ import annotations

import pytest

from python_engine.compaction import COMPACT_EVERY, CompactionTurns


@pytest.mark.parametrize("tables", [1, 9, 16])
def test_each_table_is_compacted_once_every_so_many_commits_and_never_two_in_one_batch(tables):
    turns = CompactionTurns(COMPACT_EVERY)
    names = [f"table-{i}" for i in range(tables)]
    due = {name: [] for name in names}
    for batch in range(3 * COMPACT_EVERY):  # every batch commits to every table (a live stream's batches)
        compacted = [name for name in names if turns.due(name)]
        assert len(compacted) <= 1, f"batch {batch} compacts {compacted}"
        for name in compacted:
            due[name].append(batch)
    for name, batches in due.items():
        assert len(batches) == 3 and {b - a for a, b in zip(batches, batches[1:])} == {COMPACT_EVERY}, (name, batches)


def test_a_table_written_now_and_then_counts_its_own_commits():
    turns = CompactionTurns(10)
    assert [turns.due("often") for _ in range(10)].count(True) == 1
    rare = [turns.due("rare") for _ in range(25)]  # the second table seen starts 6 commits along its turn
    assert [i for i, due in enumerate(rare) if due] == [3, 13, 23]
