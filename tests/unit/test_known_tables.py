"""What the projection's Python engine keeps of a table between batches (``Known``), pure: it holds while every
commit since it was read is the engine's own (its writes and its compactions, committed in either order, a
compaction told from the background thread), and is read again after any other writer's commit."""
from python_engine.caches import Known


class _Table:
    def __init__(self, version: int):
        self.at = version

    def version(self) -> int:
        return self.at


def test_own_writes_and_compactions_in_either_order_keep_it_current():
    known, table = Known(), _Table(7)
    assert not known.current(table)  # never read
    known.loaded(7)
    assert known.current(table)
    table.at = 8
    known.written(8)  # the batch's append
    table.at = 10
    known.written(10)  # the next batch's append, committed after ...
    known.written(9)  # ... the background compaction's commit
    assert known.current(table) and known.version == 10
    known.written(11)  # a compaction told before the batch sees its commit
    assert known.current(table) and known.version == 10
    table.at = 11
    assert known.current(table) and known.version == 11


def test_another_writers_commit_makes_it_read_again():
    known, table = Known(), _Table(3)
    known.loaded(3)
    known.written(5)  # the engine's append, committed after another writer's version 4
    table.at = 5
    assert not known.current(table)
    assert not known.current(table)  # and stays so until read again
    known.loaded(5)
    assert known.current(table)


def test_a_compaction_committed_while_the_table_was_read_is_kept():
    known, table = Known(), _Table(12)
    known.written(13)  # the background compaction's commit, told while the batch read version 12
    known.loaded(12)
    table.at = 13
    assert known.current(table)


def test_forgotten_or_a_table_behind_it_is_not_current():
    known = Known()
    known.loaded(4)
    assert not known.current(_Table(3))  # a table recreated at an older version
    known.forget()
    assert not known.current(_Table(4))
