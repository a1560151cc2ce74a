"""The Spark work of the Airflow DAGs' tasks as a spark-submit app (issue 46 part 4): where an Airflow connection
names a Spark master, a task submits this (``eventlake spark-submit airflow-job -- JOB ARGS``, through the Spark
provider's ``SparkSubmitOperator``, ``infra.airflow_spark``) instead of starting Spark in the Airflow worker.

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
import sys
from pathlib import Path

from lakehouse.settings import Settings

__all__ = ["JOBS", "result_path", "read_result", "rebuild_build", "main"]

JOBS = ("rebuild-build",)


def result_path(settings: Settings, dag_id: str, run_id: str, name: str) -> Path:
    """Where a submitted job of DAG run ``run_id`` writes what it did for read model ``name``."""
    safe_run = "".join(c if c.isalnum() or c in "-_.+" else "_" for c in run_id)
    return settings.home / "airflow-jobs" / dag_id / safe_run / f"{name}.json"


def read_result(settings: Settings, dag_id: str, run_id: str, name: str) -> dict:
    """What the submitted job wrote (``result_path``); FileNotFoundError when it wrote nothing."""
    return json.loads(result_path(settings, dag_id, run_id, name).read_text())


def _write_result(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(result))
    partial.replace(path)


def _log(line: str) -> None:
    print(line, flush=True)


def rebuild_build(settings: Settings, name: str, dag_id: str, run_id: str) -> dict:
    """The build task of ``rebuild_read_model`` run on the cluster: what its in-worker task does, as the run's
    lock owner; returns (and writes to ``result_path``) {name, generation, previous}."""
    from lakehouse import metrics
    from projection_core.rebuild_lock import RebuildLock, airflow_owner
    from spark_apps.rebuild import ProgressPush, build_generation, start_generation
    from spark_apps.session import build_session

    by = f"airflow {dag_id}/{run_id}"
    path = result_path(settings, dag_id, run_id, name)
    path.unlink(missing_ok=True)  # a retried task never reads an earlier attempt's result
    lock = RebuildLock(settings, name, log=_log, owner=airflow_owner(dag_id, run_id)).acquire()
    progress = ProgressPush(settings, name, dag_id, _log)
    try:
        previous, generation = start_generation(settings, name, by, f"{dag_id} DAG", _log)
        spark = build_session(settings, app_name=f"eventlake-rebuild-{name}", log=_log)
        try:
            built = build_generation(spark, settings, name, generation.number, by, _log, progress)
        finally:
            spark.stop()
    except BaseException:
        lock.release()
        progress.ended()
        raise
    lock.hand_over()
    metrics.push(settings, dag_id, {"read_model": name}, built.samples(), _log)
    f = built.fold
    _log(f"rebuild: {name}: generation {generation.number} built on the cluster: {f.events:,} archived events "
         f"folded at {f.events_per_second:,.0f} events/s, {built.caught_up_events:,} caught up from Kafka "
         f"({built.seconds:.0f}s); next: check")
    result = {"name": name, "generation": generation.number, "previous": previous}
    _write_result(path, result)
    return result


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
    try:
        rebuild_build(settings, args.name, args.dag, args.run_id)
    except RebuildError as e:
        print(f"airflow-job {args.job}: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
