"""What the projection's Python engine knows of a table between batches (``python_engine.key_index``), pure (its
LMDB file in a temporary folder, no Delta table): the version its index covers moves on through the engine's own
commits and compactions, told in either order, and stops at any other; the keys and heads a batch adds are found,
others missed; and what it holds in memory between batches does not grow with the batches (issue 42)."""
import numpy as np

from python_engine.key_index import KeyIndex, covered


def test_own_writes_and_compactions_in_either_order_move_the_covered_version_on():
    assert covered(7, set(), 7) == 7
    assert covered(7, {8}, 8) == 8  # the batch's append
    assert covered(8, {10, 9}, 10) == 10  # the next batch's append, committed after the compaction's commit
    assert covered(10, {11}, 10) == 10  # a compaction told before the batch sees its commit
    assert covered(None, {1, 2}, 2) is None  # never read: rebuilt


def test_another_writers_commit_stops_it():
    assert covered(3, {5}, 5) == 3  # the engine's append at 5, after another writer's 4: caught up from 3
    assert covered(3, {4, 6}, 6) == 4


def _index(tmp_path, heads=False):
    index = KeyIndex(tmp_path / "index", str(tmp_path / "table"), ("event_id",), heads=heads, log=lambda *_: None)
    index.add(None, [])
    return index


def test_the_index_finds_every_key_and_head_added_and_misses_the_others(tmp_path):
    rng = np.random.default_rng(7)
    keys = rng.integers(0, 2**63, size=50_000, dtype=np.uint64)
    index = _index(tmp_path, heads=True)
    for part in np.array_split(keys, 37):
        index.add(None, part, {"acc-1": 3, "acc-2": 5})
    index.add(None, [], {"acc-1": 2, "acc-3": 1})  # a head never moves back
    assert index.hits(keys[::7]) == len(keys[::7])
    others = np.setdiff1d(rng.integers(0, 2**63, size=5_000, dtype=np.uint64), keys)
    assert index.hits(others) == 0
    assert index.hits(np.concatenate((others, keys[:3]))) == 3
    assert index.heads(["acc-1", "acc-2", "acc-3", "acc-4"]) == {"acc-1": 3, "acc-2": 5, "acc-3": 1}
    assert index.entries() == len(keys) + 3
    index.close()
    assert _index(tmp_path, heads=True).hits(keys[:100]) == 100  # on disk: found again by a new process


def test_one_batch_of_many_keys_and_heads_is_written_whole_across_the_write_transactions(tmp_path):
    """A batch's keys and heads go in in transactions of a few thousand (LMDB keeps the pages of a transaction in
    memory of its own for reuse: one transaction per batch would hold a page per key); all of them found."""
    rng = np.random.default_rng(11)
    keys = rng.integers(0, 2**63, size=23_456, dtype=np.uint64)
    heads = {f"acc-{i}": i % 50 + 2 for i in range(12_345)}
    index = _index(tmp_path, heads=True)
    index.add(None, keys, heads)
    index.add(None, [], {f"acc-{i}": 1 for i in range(0, 12_345, 3)} | {"acc-new": 4})  # never moves back
    assert index.hits(keys) == len(keys) and index.entries() == len(keys) + len(heads) + 1
    assert index.heads([f"acc-{i}" for i in range(12_345)] + ["acc-new"]) == heads | {"acc-new": 4}


def test_status_names_each_index_with_the_version_it_covers_and_its_size(tmp_path):
    from python_engine.key_index import INDEX_FOLDER, status_lines

    folder = tmp_path / "checkpoints" / "projection-payments" / INDEX_FOLDER
    index = KeyIndex(folder, "/w/payments", ("payment_id",), log=lambda *_: None)
    index.add(None, np.arange(1, 1001, dtype=np.uint64))
    index.record(7, table_id="t-1")
    index.close()
    ledger = KeyIndex(folder, "/w/ledger", ("event_id",), heads=True, log=lambda *_: None)
    ledger.add(None, [], {"acc-1": 2})  # never recorded: the engine was stopped before its first commit
    ledger.close()
    lines = status_lines(tmp_path / "checkpoints")
    assert len(lines) == 2
    payments = next(line for line in lines if "/w/payments" in line)
    assert "1,000 keys and heads" in payments and "covers version 7" in payments and "MiB on disk" in payments
    assert "1 keys and heads, covers nothing yet" in next(line for line in lines if line is not payments)
    assert status_lines(tmp_path / "nothing-here") == []


def _entries_held(obj, seen=None) -> int:
    """Entries of every container reachable from ``obj``'s attributes (what a per-event cache would fill)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return 0
    if hasattr(obj, "shape") and hasattr(obj, "size"):  # a NumPy array
        return int(obj.size)
    if isinstance(obj, dict):
        return len(obj) + sum(_entries_held(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return len(obj) + sum(_entries_held(v, seen) for v in obj)
    attributes = getattr(obj, "__dict__", None)
    return sum(_entries_held(v, seen) for v in attributes.values()) if attributes else 0


def test_what_the_index_holds_in_memory_does_not_grow_with_the_batches(tmp_path):
    rng = np.random.default_rng(3)
    held = []
    for batches in (5, 50):
        index = KeyIndex(tmp_path / f"index-{batches}", str(tmp_path / "table"), ("event_id",), heads=True,
                         log=lambda *_: None)
        index.add(None, [])
        index.record(0, "table-id")  # the version a first read records
        for batch in range(1, batches + 1):  # each batch's append, then a compaction told from its thread
            index.add(2 * batch - 1, rng.integers(0, 2**63, size=1_000, dtype=np.uint64),
                      {f"acc-{batch}-{i}": i + 1 for i in range(200)})
            index.written(2 * batch)
        assert index.entries() == batches * 1_200
        held.append((index.in_memory(), _entries_held(index)))
    assert held[0] == held[1], f"entries in memory after 5 and after 50 batches: {held}"
