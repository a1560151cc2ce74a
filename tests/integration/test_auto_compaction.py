"""A table that collects small files from streaming commits is compacted by its writer (Delta's auto compaction,
``EVENTLAKE_AUTO_COMPACT_MIN_FILES``), so that reads stay fast between the maintenance DAG's runs (issue 10);
and a commit whose post-commit hook fails is a committed write, not a failed batch."""
import pytest
from deltalake import DeltaTable

import read_models
from eventlake.generator import GeneratorConfig
from lakehouse.settings import Settings
from read_models.catalog import legacy_generation
from spark_apps.events import parse_events
from spark_apps.merge import BatchContext, apply, commit_conflict, post_commit_hook_failure
from spark_apps.projection import Projection
from tests.domain_helpers import events_for
from tests.oracle import assert_matches_oracle

pytestmark = pytest.mark.slow

CFG = GeneratorConfig(accounts=4, commands=60, seed=23, run_id="compact")
BATCHES = 6
MIN_FILES = "spark.databricks.delta.autoCompact.minNumFiles"


def test_the_setting_reads_from_the_environment():
    assert Settings.load({}).auto_compact_min_files == 10
    assert Settings.load({"EVENTLAKE_AUTO_COMPACT_MIN_FILES": "0"}).auto_compact_min_files == 0


def test_small_merges_into_an_insert_heavy_model_are_compacted_by_the_projection(spark, settings):
    # The shared session was built by build_session from the default settings: auto compaction on.
    assert spark.conf.get("spark.databricks.delta.autoCompact.enabled") == "true"
    model = read_models.get("payments")  # insert-once: each MERGE adds files, none rewritten
    events = events_for(CFG)
    Projection(spark, settings, [model], archive=False, log=lambda *_: None).ensure_tables()
    table = str(legacy_generation(settings, model.name).table)
    lines = []
    before = spark.conf.get(MIN_FILES)
    spark.conf.set(MIN_FILES, "3")  # the default (10) would take 10 batches to show
    try:
        for batch in range(BATCHES):
            part = events[batch::BATCHES]
            records = spark.createDataFrame(
                [(e.aggregate_id.encode(), e.to_json(), "events", 0, i) for i, e in enumerate(part)],
                "key binary, value binary, topic string, partition int, offset long")
            valid, _ = parse_events(records)
            apply(BatchContext(spark, settings, "compact-test", "compact-test", batch, input_rows=-1,
                               log=lines.append), model, valid)
    finally:
        spark.conf.set(MIN_FILES, before)

    history = DeltaTable(table).history()
    merges = [c for c in history if c["operation"] == "MERGE"]
    compactions = [c for c in history if c["operation"] == "OPTIMIZE"]
    assert len(merges) == BATCHES
    assert compactions, f"no compaction in {[c['operation'] for c in history]}"
    assert all(str(c["operationParameters"].get("auto")).lower() == "true" for c in compactions)
    assert len(DeltaTable(table).file_uris()) < 3, "the table kept the small files of its commits"
    assert lines == []  # no race lost, no hook failed
    assert_matches_oracle(spark, settings, events, [model])


def test_a_failed_post_commit_hook_is_a_committed_write_not_a_conflict():
    """Delta's message when auto compaction (a post-commit hook) fails after the commit: the write is kept and
    not run again, whatever the hook's failure was (a lost race included)."""
    class Py4JJavaError(Exception):
        pass

    error = Py4JJavaError(
        "An error occurred while calling o812.execute.\n: org.apache.spark.sql.delta.DeltaRuntimeException: "
        "[DELTA_POST_COMMIT_HOOK_FAILED] Committing to the Delta table version 14 succeeded but error while "
        "executing post-commit hook Auto Compact: [DELTA_CONCURRENT_DELETE_DELETE] ConcurrentDeleteDeleteException: "
        "This transaction attempted to delete one or more files that were deleted by a concurrent update.\n"
        "\tat org.apache.spark.sql.delta.DeltaErrorsBase.postCommitHookFailedException")
    wrapped = RuntimeError("batch failed")
    wrapped.__cause__ = error
    assert post_commit_hook_failure(wrapped) == (
        "its post-commit hook failed: Auto Compact: [DELTA_CONCURRENT_DELETE_DELETE] ConcurrentDeleteDeleteException: "
        "This transaction attempted to delete one or more files that were deleted by a concurrent update.")
    assert post_commit_hook_failure(ValueError("[DELTA_CONCURRENT_DELETE_DELETE] ...")) is None
    assert commit_conflict(ValueError("[DELTA_CONCURRENT_DELETE_DELETE] ...")) == "ConcurrentDeleteDeleteException"
