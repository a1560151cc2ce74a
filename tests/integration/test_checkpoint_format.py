"""Tripwire: a checkpoint written by real Spark (a Structured Streaming query on the Kafka source, a few batches) is
read by ``projection_core.checkpoint`` and matches its format constants. The Python engine writes checkpoints Spark
resumes from, and status, the checks and the benchmarks read Spark's: a pyspark upgrade that changes the format
fails here first."""
from __future__ import annotations

import json

import pytest

from projection_core import checkpoint as log
from projection_core.checkpoint import LOG_VERSION, SPARK_OFFSET_CONF, Checkpoint
from spark_apps.events import read_event_records
from tests.integration.test_projection import publish

pytestmark = pytest.mark.slow


def test_a_checkpoint_spark_writes_is_read_by_the_checkpoint_module(spark, settings, tmp_path):
    publish(settings, [(f"acc-{i % 5}", json.dumps({"n": i}).encode()) for i in range(30)])
    where = tmp_path / "tripwire-checkpoint"
    query = (read_event_records(spark, settings, max_offsets_per_trigger=10).writeStream.format("noop")
             .option("checkpointLocation", str(where)).trigger(availableNow=True).start())
    query.awaitTermination()

    cp = Checkpoint(where, settings.events_topic, shuffle_partitions=2)
    last = cp.last_committed()
    assert cp.last_planned() == last == log.last_committed_batch(where) and last >= 2  # batches of 10 at most
    assert sum(cp.ends(last).values()) == 30 and 0 < log.offsets_total(where, 0, settings.events_topic) <= 10
    assert cp.initial() == {0: 0, 1: 0, 2: 0}  # sources/0/0: "earliest" as offsets
    assert set(json.loads((where / log.METADATA).read_text())) == {"id"}
    for batch in range(last + 1):
        offsets = (where / log.OFFSETS / str(batch)).read_text().splitlines()
        commits = (where / log.COMMITS / str(batch)).read_text().splitlines()
        assert offsets[0] == commits[0] == LOG_VERSION and len(offsets) == 3
        meta = json.loads(offsets[1])
        assert {"batchWatermarkMs", "batchTimestampMs", "conf"} <= set(meta)
        # What this engine writes for a checkpoint it starts: the very settings Spark records with a batch.
        assert set(meta["conf"]) == set(SPARK_OFFSET_CONF) | {"spark.sql.shuffle.partitions"}, \
            sorted(set(meta["conf"]) ^ (set(SPARK_OFFSET_CONF) | {"spark.sql.shuffle.partitions"}))
        assert set(json.loads(offsets[2])) == {settings.events_topic}
        assert set(json.loads(commits[1])) == {"nextBatchWatermarkMs"}
    # The same files the module writes: a batch planned and committed here reads back like Spark's.
    cp.plan(last + 1, cp.ends(last))
    cp.commit(last + 1)
    assert cp.ends(last + 1) == cp.ends(last) and log.committed_batches(where)[-2:] == [last, last + 1]
    assert (where / log.OFFSETS / str(last + 1)).read_text().splitlines()[0] == LOG_VERSION
