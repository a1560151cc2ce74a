"""`eventlake reprocess` (issue 9): the closed windows of a range are recomputed from the archive, late events
included, and replace exactly that range of the current generation; the late events folded in are marked; the
reconciliation agrees; a second run changes nothing; bad input is refused with the reason; the
reprocess_windows DAG runs it for its data interval."""
import os
import subprocess
import sys
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

import read_models
from eventlake.generator import GeneratorConfig
from expectations.reconciliation import reconcile
from lakehouse.settings import Settings
from read_models.catalog import REPROCESSED_AT, Catalog
from read_models.sequence import sequence
from spark_apps.status import render, watermark_statuses
from spark_apps.reprocess import (ReprocessError, ReprocessRefused, late_events_waiting, reprocess,
                                  validate)
from tests.domain_helpers import events_for
from tests.projecting import project_in_python, publish_events

NAME = "merchant_minute_volume"
MODEL = read_models.get(NAME)
ROOT = Path(__file__).resolve().parents[2]
# Event times from 2026-01-01 23:40 to about 00:18 the next day, so the watermark (minus 10 minutes) passes
# midnight: 2026-01-01 is a closed day. Late payments are 15-120 minutes older than the stream's clock.
CFG = GeneratorConfig(accounts=20, commands=400, seed=23, run_id="reproc", late_rate=0.08, mean_interval_s=6,
                      start=datetime(2026, 1, 1, 23, 40, tzinfo=timezone.utc))
T1, T2 = datetime(2026, 1, 1, 22, 0), datetime(2026, 1, 1, 23, 50)


def utc(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def projected(spark, bootstrap_servers, tmp_path_factory):
    """A log with duplicates and late payments, projected in several batches (so some payments are late)."""
    settings = Settings.load({}).replace(
        home=tmp_path_factory.mktemp("reprocess") / "home", kafka_bootstrap_servers=bootstrap_servers,
        topic_prefix=f"test-{uuid.uuid4().hex[:10]}.", topic_partitions=3)
    events = events_for(CFG, flag_every=9)
    log = events + events[:30]
    publish_events(settings, log)
    # The windowed model alone (and the archive): the others have nothing to reprocess.
    # (The reprocess is the subject: the Python engine makes the tables, tests/projecting.py.)
    project_in_python(spark, settings, [MODEL], archive=True, max_offsets_per_trigger=150)
    return settings, log


def windows(spark, settings):
    """The current generation's rows, by key."""
    rows = spark.read.format("delta").load(str(Catalog(settings).current(NAME).table)).collect()
    return {(r["merchant_id"], r["window_start"]): r.asDict() for r in rows}


def late_events(spark, settings):
    late = spark.read.format("delta").load(str(Catalog(settings).current(NAME).late_events))
    return {r["event_id"]: r.asDict() for r in late.filter(late.read_model == NAME).collect()}


def oracle(log, start, end):
    """The fold of the log (every admitted payment, late or not) for the windows start <= window_start < end."""
    return {k: {"payments": r["payments"], "amount_minor": r["amount_minor"]}
            for k, r in MODEL.python_fold(sequence(log).admitted).items() if start <= k[1] < end}


def delta_version(path) -> int:
    from deltalake import DeltaTable

    return DeltaTable(str(path)).version()


def in_range(t: datetime, start=T1, end=T2) -> bool:
    return start <= t < end


@pytest.mark.slow
def test_a_reprocess_folds_the_late_events_of_exactly_its_range_and_a_second_run_changes_nothing(spark, projected):
    settings, log = projected
    before, late_before = windows(spark, settings), late_events(spark, settings)
    late_in = {i for i, r in late_before.items() if in_range(r["event_time"])}
    assert late_in and len(late_in) < len(late_before)  # late events inside and outside the range
    assert all(r.get(REPROCESSED_AT) is None for r in late_before.values())
    assert reconcile(settings, NAME).success  # table + late events = the fold of the log
    in_table = {k: {"payments": r["payments"], "amount_minor": r["amount_minor"]} for k, r in before.items()
                if in_range(k[1])}
    assert in_table != oracle(log, T1, T2)  # the late ones are missing from their windows

    # Windows the watermark has not passed are not reprocessed: the message names the range and the watermark.
    with pytest.raises(ReprocessRefused, match=r"windows 2026-01-01T22:00:00Z \.\. 2026-01-02T02:00:00Z are not all "
                                               r"closed: windows ending after the watermark 2026-01-02T00:"):
        reprocess(spark, settings, NAME, "2026-01-01T22:00", "2026-01-02T02:00Z", log=lambda *_: None)

    waiting, watermark = late_events_waiting(settings, NAME, utc(T1), utc(T2))
    assert waiting == len(late_in) and watermark >= utc(T2)

    lines = []
    outcome = reprocess(spark, settings, NAME, utc(T1), utc(T2), by="test", log=lines.append)
    assert [line.split("]")[0] for line in lines[:-1]] == [f"reprocess: [{k}/5" for k in range(1, 6)]
    assert lines[-1].startswith(f"reprocess: {NAME} generation 1, windows 2026-01-01T22:00:00Z .. "
                                f"2026-01-01T23:50:00Z: ") and "replaced in one commit" in lines[-1], lines
    assert outcome.late_folded == len(late_in) and outcome.late_already == 0
    assert outcome.windows_changed > 0 and outcome.table_version is not None

    after = windows(spark, settings)
    assert {k: {"payments": r["payments"], "amount_minor": r["amount_minor"]} for k, r in after.items()
            if in_range(k[1])} == oracle(log, T1, T2)
    assert {k: r for k, r in after.items() if not in_range(k[1])} == \
        {k: r for k, r in before.items() if not in_range(k[1])}  # nothing outside the range changed
    late_after = late_events(spark, settings)
    assert {i for i, r in late_after.items() if r[REPROCESSED_AT] is not None} == late_in
    strip = lambda rows: {i: {c: v for c, v in r.items() if c != REPROCESSED_AT} for i, r in rows.items()}  # noqa
    assert strip(late_after) == strip(late_before)  # recorded, not lost: only the mark is new
    checked = reconcile(settings, NAME)
    assert checked.success, checked.lines()
    assert late_events_waiting(settings, NAME, utc(T1), utc(T2))[0] == 0
    # eventlake status tells the late events still out of their windows from those folded back in.
    status = next(w for w in watermark_statuses(settings) if w.name == NAME)
    assert (status.late, status.reprocessed) == (len(late_before), len(late_in))
    assert f"{len(late_before):,} late (in late_events; {len(late_in):,} of them since folded back in by " \
           f"eventlake reprocess)" in render(settings)

    # Again: the same fold, so no commit and no mark.
    table_path, late_path = Catalog(settings).current(NAME).table, Catalog(settings).current(NAME).late_events
    versions = delta_version(table_path), delta_version(late_path)
    again = reprocess(spark, settings, NAME, "2026-01-01T22:00:00Z", "2026-01-01T23:50:00Z", log=lambda *_: None)
    assert (again.windows_changed, again.table_version, again.late_folded, again.late_already) == \
        (0, None, 0, len(late_in))
    assert (delta_version(table_path), delta_version(late_path)) == versions
    assert windows(spark, settings) == after and late_events(spark, settings) == late_after


@pytest.mark.parametrize("name, start, end, reason", [
    ("account_summary", "2026-01-01", "2026-01-02", "read model account_summary has no time windows to reprocess"),
    ("nope", "2026-01-01", "2026-01-02", "unknown read model 'nope'"),
    (NAME, "2026-01-02", "2026-01-01", "--from 2026-01-02T00:00:00Z is not before --to 2026-01-01T00:00:00Z"),
    (NAME, "2026-01-01T10:00", "2026-01-01T10:00Z", "is not before"),
    (NAME, "yesterday", "2026-01-01", "--from 'yesterday' is not a time"),
    (NAME, "2026-01-01", "2026-13-01", "--to '2026-13-01' is not a time"),
    (NAME, "2026-01-01T00:00:30", "2026-01-02", "--from 2026-01-01T00:00:30Z is not on a window boundary"),
])
def test_bad_input_is_refused_naming_the_input_and_the_reason(name, start, end, reason):
    with pytest.raises(ReprocessError) as refused:
        validate(name, start, end)
    assert reason in str(refused.value)


def test_the_cli_refuses_bad_input_with_exit_2_before_starting_spark(tmp_path):
    env = {**os.environ, "EVENTLAKE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "eventlake.cli", "reprocess", "account_summary", "--from",
                          "2026-01-01", "--to", "2026-01-02"], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.startswith("eventlake reprocess: read model account_summary has no time windows"), run.stderr


@pytest.mark.slow
def test_the_dag_reprocesses_its_data_interval(spark, projected):
    settings, log = projected
    day, next_day = datetime(2026, 1, 1), datetime(2026, 1, 2)
    late_day = {i for i, r in late_events(spark, settings).items() if in_range(r["event_time"], day, next_day)}
    assert late_day
    env = {**os.environ, "EVENTLAKE_HOME": str(settings.home), "PYTHONPATH": str(ROOT),
           "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
           "EVENTLAKE_TOPIC_PREFIX": settings.topic_prefix, "EVENTLAKE_SPARK_SHUFFLE_PARTITIONS": "2"}
    # `dags test` at 2026-01-02 runs the way a manual run then would: its data interval is the day before it.
    run = subprocess.run([sys.executable, "-m", "eventlake.cli", "airflow", "dags", "test", "reprocess_windows",
                          "2026-01-02"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    assert f"reprocess: {NAME} generation 1, windows 2026-01-01T00:00:00Z .. 2026-01-02T00:00:00Z:" in out, \
        out[-6000:]
    after = windows(spark, settings)
    assert {k: {"payments": r["payments"], "amount_minor": r["amount_minor"]} for k, r in after.items()
            if in_range(k[1], day, next_day)} == oracle(log, day, next_day)
    assert {i for i, r in late_events(spark, settings).items()
            if in_range(r["event_time"], day, next_day) and r[REPROCESSED_AT] is not None} == late_day
    assert reconcile(settings, NAME).success
    # OpenLineage: the task's run (the provider's, in the same namespace) -> our reprocess run (the archive in, the
    # generation out) -> the Spark application's run (OpenLineage's Spark listener in the task's session,
    # spark_lineage=jobs, the default), whose queries name the generation's table they wrote.
    from lakehouse.lineage import events_file, read_events, spark_events_file

    ours = read_events(events_file(settings))
    tasks = {e["run"]["runId"] for e in ours
             if e["eventType"] == "START" and e["job"]["name"] == "reprocess_windows.reprocess_read_model"}
    # The module's first test ran reprocess in-process too (its runs have no task as parent): the DAG's is the one
    # whose parent is one of the mapped task's runs (the one for NAME).
    [mine] = [e for e in ours if e["eventType"] == "START" and e["job"]["name"] == f"reprocess.{NAME}"
              and e["run"]["facets"].get("parent", {}).get("run", {}).get("runId") in tasks]
    assert ("file", str(Catalog(settings).current(NAME).table)) in {(o["namespace"], o["name"])
                                                                     for o in mine["outputs"]}
    assert [e["eventType"] for e in ours if e["run"]["runId"] == mine["run"]["runId"]] == ["START", "COMPLETE"]
    spark_runs = read_events(spark_events_file(settings, f"eventlake-reprocess-{NAME}"))
    parents = {(e["run"]["facets"]["parent"]["job"]["name"], e["run"]["facets"]["parent"]["run"]["runId"])
               for e in spark_runs if "parent" in e["run"].get("facets", {})}
    assert (f"reprocess.{NAME}", mine["run"]["runId"]) in parents, (mine["run"]["runId"], parents)
    written = {(o["namespace"], o["name"]) for e in spark_runs for o in e.get("outputs", [])}
    assert ("file", str(Catalog(settings).current(NAME).table)) in written, written

    # The same day again: every late event of it is folded in, so the task is skipped without starting Spark.
    again = subprocess.run([sys.executable, "-m", "eventlake.cli", "airflow", "dags", "test", "reprocess_windows",
                            "2026-01-02"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-6000:]
    assert f"reprocess: {NAME}: no late event of 2026-01-01T00:00Z .. 2026-01-02T00:00Z waits to be folded in and " \
           f"its windows are closed" in out, out[-6000:]
    assert "eventlake-reprocess-" not in out  # no Spark session was started
