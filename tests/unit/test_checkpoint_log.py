"""projection_core.checkpoint: the checkpoint log both engines, status and the checks read (Spark's own format is
held to it by tests/integration/test_checkpoint_format.py)."""
from __future__ import annotations

import pytest

from projection_core import checkpoint as log
from projection_core.checkpoint import LOG_VERSION, Checkpoint
from projection_core.errors import ProjectionError


def test_a_planned_and_committed_batch_reads_back(tmp_path):
    cp = Checkpoint(tmp_path / "q", "events-t", shuffle_partitions=4)
    cp.start({0: 0, 1: 5})
    assert cp.initial() == {0: 0, 1: 5} and (tmp_path / "q" / log.METADATA).exists()
    cp.plan(0, {0: 3, 1: 9})
    assert cp.last_planned() == 0 and cp.last_committed() is None
    cp.commit(0)
    assert (tmp_path / "q" / log.OFFSETS / "0").read_text().splitlines()[0] == LOG_VERSION
    assert cp.ends(0) == log.batch_offsets(tmp_path / "q", 0, "events-t") == {0: 3, 1: 9}
    assert log.offsets_total(tmp_path / "q", 0, "events-t") == 12
    assert log.last_committed_batch(tmp_path / "q") == 0 and log.batch_offsets(tmp_path / "q", 1, "events-t") is None


def test_the_log_keeps_spark_s_retention_and_refuses_another_format(tmp_path):
    cp = Checkpoint(tmp_path / "q", "events-t", shuffle_partitions=1)
    for batch in range(log.RETAINED_BATCHES + 5):
        cp.plan(batch, {0: batch + 1})
        cp.commit(batch)
    assert log.committed_batches(tmp_path / "q")[0] == 4 and len(log.committed_batches(tmp_path / "q")) == 101
    (tmp_path / "q" / log.OFFSETS / "104").write_text("v2\n{}\n{}")
    with pytest.raises(ProjectionError, match="format"):
        cp.ends(104)
