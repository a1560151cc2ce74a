"""A rebuild as readers and operators meet it (issue 9): queries running during the rebuild and its switch never
fail and always see one complete generation; a rebuild killed with kill -9 at any step leaves readers on a
complete generation, and running it again finishes the job."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import read_models
from eventlake.generator import GeneratorConfig
from eventlake.query import query_duckdb
from read_models.catalog import Catalog
from projection_core.rebuild_lock import lock_path
from spark_apps.rebuild import rebuild
from tests.domain_helpers import events_for
from tests.integration.services import WORKTREE, service_env
from tests.integration.test_rebuild import publish
from tests.oracle import assert_matches_oracle
from tests.projecting import project_in_python

pytestmark = pytest.mark.slow

SUMMARY_SQL = "SELECT * FROM account_summary ORDER BY account_id"


def publish_and_project(spark, settings, events):
    publish(settings, events)
    project_in_python(spark, settings)  # the rebuild and its readers are the subject (tests/projecting.py)


def test_queries_during_a_rebuild_and_its_switch_never_fail_and_see_one_whole_generation(spark, settings):
    events = events_for(GeneratorConfig(accounts=12, commands=150, seed=29, run_id="readers"))
    publish_and_project(spark, settings, events)
    # The current generation lost a row (what a rebuild is for): old and new answers differ, so each answer
    # shows which generation it came from.
    from delta.tables import DeltaTable

    old_table = str(Catalog(settings).current("account_summary").table)
    victim = sorted({e.aggregate_id for e in events})[0]
    DeltaTable.forPath(spark, old_table).delete(f"account_id = '{victim}'")
    _, old_rows = query_duckdb(settings, SUMMARY_SQL)

    answers, failures, switched = [], [], threading.Event()
    done = threading.Event()

    def read_in_a_loop():
        after_switch = 0
        while after_switch < 3:  # a few answers after the switch too
            try:
                answers.append(query_duckdb(settings, SUMMARY_SQL)[1])
            except Exception as e:  # noqa: BLE001 -- every failure is reported by the test
                failures.append(repr(e))
            if switched.is_set():
                after_switch += 1
        done.set()

    reader = threading.Thread(target=read_in_a_loop, daemon=True)
    reader.start()
    try:
        outcome = rebuild(spark, settings, "account_summary", log=lambda *_: None)
    finally:
        switched.set()
        done.wait(120)
    assert outcome.switched
    _, new_rows = query_duckdb(settings, SUMMARY_SQL)
    assert not failures, failures[:3]
    assert any(r[0] == victim for r in new_rows) and not any(r[0] == victim for r in old_rows)
    assert len(answers) > 3
    mixed = [a for a in answers if a not in (old_rows, new_rows)]
    assert not mixed, f"{len(mixed)} of {len(answers)} answers were neither the old nor the new generation"
    assert answers[0] == old_rows and answers[-1] == new_rows
    assert_matches_oracle(spark, settings, events, models=[read_models.get("account_summary")])


# Progress lines of the rebuild, in order: a kill -9 right after each one (caught up once and being marked ready,
# or caught up again while the live projection follows it; being checked). A kill while the new generation is
# only created and being folded leaves what test_rebuild.py's taken-over lock test starts from.
KILL_AFTER = ("event(s) from Kafka after the archive's position", "checking generation")


@pytest.mark.heavy
def test_a_rebuild_killed_at_any_step_leaves_readers_on_a_whole_generation_and_a_rerun_finishes(
        spark, settings, tmp_path):
    events = events_for(GeneratorConfig(accounts=10, commands=120, seed=31, run_id="killed"))
    publish_and_project(spark, settings, events)
    _, complete = query_duckdb(settings, SUMMARY_SQL)
    env = service_env(settings)
    for i, step in enumerate(KILL_AFTER, 1):
        log_path = tmp_path / f"rebuild-killed-{i}.log"
        with open(log_path, "wb") as out:
            process = subprocess.Popen([sys.executable, "-m", "eventlake.cli", "rebuild", "account_summary"],
                                       cwd=WORKTREE, env=env, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while step not in log_path.read_text(errors="replace"):
                assert process.poll() is None, f"the rebuild ended before '{step}':\n{log_path.read_text()}"
                assert time.monotonic() < deadline, f"no '{step}' within 300s:\n{log_path.read_text()}"
                time.sleep(0.2)
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # the rebuild and its Spark JVM
            except ProcessLookupError:
                pass
            process.wait(60)
        # Readers stay on the complete generation 1; the killed rebuild left its lock and a generation behind.
        assert Catalog(settings).current("account_summary").number == 1, step
        assert query_duckdb(settings, SUMMARY_SQL)[1] == complete, step
        assert lock_path(settings, "account_summary").exists(), step

    lines = []
    outcome = rebuild(spark, settings, "account_summary", log=lines.append)
    assert outcome.switched and outcome.previous == 1, lines
    assert any("taking over" in line for line in lines), lines
    state = Catalog(settings).state("account_summary")
    assert not state.unfinished and state.current == outcome.generation
    assert query_duckdb(settings, SUMMARY_SQL)[1] == complete
    assert_matches_oracle(spark, settings, events, models=[read_models.get("account_summary")])
