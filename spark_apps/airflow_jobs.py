"""The Spark work of the Airflow DAGs' tasks, one body wherever it runs (issue 46 part 4): in the Airflow worker
(the DAG's task calls it), or, where an Airflow connection names a Spark master, as a spark-submit app the task
submits (``eventlake spark-submit airflow-job -- JOB ARGS``, through the Spark provider's ``SparkSubmitOperator``,
``infra.airflow_spark``).

Jobs:

- ``rebuild-build NAME --dag DAG --run-id RUN``: a ``rebuild_read_model`` task's build, as the DAG run's owner of
  the model's rebuild lock: reserve the next generation, fold the archive into it, catch it up, mark it ready,
  and hand the lock over to the run's next task (``check``). What it built is written to ``result_path``, which
  the run's next task reads (a submitted job returns no XCom).

The driver's output is the task's log (client deploy mode: the submitting process reads it).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

from lakehouse.files import write_whole
from lakehouse.settings import Settings

__all__ = ["JOBS", "RESULTS_KEPT_DAYS", "result_path", "read_result", "write_result", "rebuild_build", "main"]

JOBS = ("rebuild-build",)
RESULTS_KEPT_DAYS = 7


def result_path(settings: Settings, dag_id: str, run_id: str, name: str) -> Path:
    """Where a submitted job of DAG run ``run_id`` writes what it did for read model ``name``."""
    safe_run = "".join(c if c.isalnum() or c in "-_.+" else "_" for c in run_id)
    return settings.home / "airflow-jobs" / dag_id / safe_run / f"{name}.json"


def read_result(settings: Settings, dag_id: str, run_id: str, name: str) -> dict:
    """What the submitted job wrote (``result_path``); FileNotFoundError when it wrote nothing."""
    return json.loads(result_path(settings, dag_id, run_id, name).read_text())


def _log(line: str) -> None:
    print(line, flush=True)


def write_result(settings: Settings, dag_id: str, run_id: str, name: str, result: dict) -> None:
    """Write what a submitted job did (``result_path``), and remove the results of this DAG's runs older than
    RESULTS_KEPT_DAYS (their runs are long over: the folder holds recent runs, not every run ever)."""
    path = result_path(settings, dag_id, run_id, name)
    write_whole(path, json.dumps(result))
    oldest = time.time() - RESULTS_KEPT_DAYS * 86_400
    for run in path.parent.parent.iterdir():
        if run != path.parent and run.is_dir() and run.stat().st_mtime < oldest:
            shutil.rmtree(run, ignore_errors=True)


def rebuild_build(settings: Settings, name: str, dag_id: str, run_id: str,
                  log: Callable[[str], None] = _log, where: str = "") -> dict:
    """The build task of ``rebuild_read_model``, in the Airflow worker or submitted to a cluster (``where`` says
    which in its log line): as the DAG run's owner of the model's rebuild lock, reserve the next generation, fold
    the archive into it, catch it up, mark it ready, and hand the lock over to the run's next task (``check``).
    Returns {name, generation, previous}; a RebuildError (the lock held by another, a refused start) leaves
    nothing behind."""
    from lakehouse import metrics
    from projection_core.rebuild_lock import RebuildLock, airflow_owner
    from spark_apps.rebuild import ProgressPush, build_generation, start_generation
    from spark_apps.session import build_session

    by = f"airflow {dag_id}/{run_id}"
    lock = RebuildLock(settings, name, log=log, owner=airflow_owner(dag_id, run_id)).acquire()
    progress = ProgressPush(settings, name, dag_id, log)  # each step, to the Pushgateway
    try:
        previous, generation = start_generation(settings, name, by, f"{dag_id} DAG", log)
        spark = build_session(settings, app_name=f"eventlake-rebuild-{name}", log=log)
        try:
            built = build_generation(spark, settings, name, generation.number, by, log, progress)
        finally:
            spark.stop()
    except BaseException:
        lock.release()
        progress.ended()
        raise
    lock.hand_over()
    metrics.push(settings, dag_id, {"read_model": name}, built.samples(), log)
    f = built.fold
    log(f"rebuild: {name}: generation {generation.number} built{where}: {f.events:,} archived events folded at "
        f"{f.events_per_second:,.0f} events/s, {built.caught_up_events:,} caught up from Kafka "
        f"({built.seconds:.0f}s)" + (f"; its progress pushed after {progress.pushed} of {built.steps} steps"
                                    if progress.pushed else "") + "; next: check")
    return {"name": name, "generation": generation.number, "previous": previous}


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: ``JOB ARGS`` (see the module's docstring)."""
    from projection_core.rebuild_errors import RebuildError

    parser = argparse.ArgumentParser(prog="airflow-job", description="a DAG task's Spark work, submitted")
    jobs = parser.add_subparsers(dest="job", required=True)
    build = jobs.add_parser("rebuild-build", help="build the next generation of a read model (rebuild_read_model)")
    build.add_argument("name")
    build.add_argument("--dag", required=True)
    build.add_argument("--run-id", required=True)
    args = parser.parse_args(argv)
    settings = Settings.load(role="reader")
    # A retried task never reads an earlier attempt's result.
    result_path(settings, args.dag, args.run_id, args.name).unlink(missing_ok=True)
    try:
        result = rebuild_build(settings, args.name, args.dag, args.run_id, where=" on the cluster")
    except RebuildError as e:
        print(f"airflow-job {args.job}: {e}", file=sys.stderr, flush=True)
        return 1
    write_result(settings, args.dag, args.run_id, args.name, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
