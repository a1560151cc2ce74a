"""A read model's write that loses a Delta commit race (maintenance's OPTIMIZE of the same table committing
between the MERGE's read and its commit) runs again instead of stopping the projection (issue 9), and the
table ends as if no race had happened.

The race is made deterministic: the batch's events pass a Python filter that, while Delta's MERGE job is
running (Spark's job description says so: "MERGE operation - materialize source"), compacts the target table
once with delta-rs -- a second writer committing in the middle of the MERGE."""
import os
from pathlib import Path

import pytest
from deltalake import DeltaTable

import read_models
from eventlake.generator import GeneratorConfig
from read_models.catalog import legacy_generation
from spark_apps.merge import BatchContext, apply, commit_conflict
from spark_apps.projection import Projection
from tests.domain_helpers import events_for
from tests.integration.test_projection import publish
from tests.oracle import assert_matches_oracle

pytestmark = pytest.mark.slow

CFG = GeneratorConfig(accounts=8, commands=160, seed=41, run_id="race")


def compacting_filter(table: str, flag: Path):
    """A filter that keeps every row and, the first time it runs inside a MERGE job, compacts ``table``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType

    def keep(_event_id):
        from pyspark import TaskContext

        description = (TaskContext.get().getLocalProperty("spark.job.description") or "").lower()
        if "merge" in description:
            try:
                fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return True
            os.close(fd)
            DeltaTable(table).optimize.compact()
        return True

    return F.udf(keep, BooleanType())("event_id")


def test_a_merge_that_loses_a_commit_race_to_optimize_runs_again(spark, settings, tmp_path):
    name = "payments"  # insert-once: its MERGE reads the batch itself (the other strategies read a cache)
    model = read_models.get(name)
    events = events_for(CFG)
    half = len(events) // 2
    # The log in the archive (one streaming run); part 1 applied as one batch, its table then rearranged into
    # 3 files without changing data (as many small batches leave it), so that there is something to compact.
    publish(settings, [(e.aggregate_id, e.to_json()) for e in events])
    Projection(spark, settings, [], archive=True, log=lambda *_: None).run_until_caught_up()
    archive = spark.read.format("delta").load(str(settings.table_path("event_archive")))
    part_1, part_2 = {e.event_id for e in events[:half]}, {e.event_id for e in events[half:]}
    Projection(spark, settings, [model], archive=False, log=lambda *_: None).ensure_tables()
    apply(BatchContext(spark, settings, "race-test", "race-test", 0, input_rows=-1),
          model, archive.filter(archive.event_id.isin(*part_1)))
    table = str(legacy_generation(settings, name).table)
    (spark.read.format("delta").load(table).repartition(3).write.format("delta").mode("overwrite")
     .option("dataChange", "false").save(table))
    assert len(DeltaTable(table).file_uris()) > 1, "the test needs a table with files to compact"

    # Part 2 as the next batch, whose MERGE meets a compaction committed by another writer in its middle.
    flag = tmp_path / "compacted"
    batch = archive.filter(archive.event_id.isin(*part_2)).filter(compacting_filter(table, flag))
    lines = []
    ctx = BatchContext(spark, settings, "race-test", "race-test", 1, input_rows=-1, log=lines.append)
    apply(ctx, model, batch, attempts=int(os.environ.get("RACE_TEST_ATTEMPTS", "6")))

    assert flag.exists(), "the compaction did not run inside the MERGE: no race was made"
    assert ctx.retries >= 1, "the MERGE did not lose the race it was meant to lose"
    assert "lost a race with another writer" in lines[0] and name in lines[0]
    operations = [c["operation"] for c in DeltaTable(table).history(5)]
    assert "OPTIMIZE" in operations and operations[0] == "MERGE"
    assert_matches_oracle(spark, settings, events, [model])


def test_a_conflict_of_the_same_writer_is_not_retried():
    """ConcurrentTransactionException: two copies of one projection (same idempotent-write id) must stop."""
    class ConcurrentTransactionException(Exception):
        pass

    class ConcurrentAppendException(Exception):
        pass

    assert commit_conflict(ConcurrentTransactionException("x")) is None
    assert commit_conflict(ConcurrentAppendException("x")) == "ConcurrentAppendException"
    wrapped = RuntimeError("batch failed")
    wrapped.__cause__ = Exception("[DELTA_CONCURRENT_DELETE_READ] This transaction attempted to read ...")
    assert commit_conflict(wrapped) == "ConcurrentDeleteReadException"
    assert commit_conflict(ValueError("[DELTA_CONCURRENT_TRANSACTION] ...")) is None
