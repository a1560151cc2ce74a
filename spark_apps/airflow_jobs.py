"""The Spark work of the Airflow DAGs' tasks, one body wherever it runs (issue 46 part 4): in the Airflow worker
(the DAG's task calls it), or, where an Airflow connection names a Spark master, as a spark-submit app the task
submits (``eventlake spark-submit airflow-job -- JOB ARGS``, through the Spark provider's ``SparkSubmitOperator``,
``infra.airflow_spark``).

Jobs:

- ``rebuild-build NAME --dag DAG --run-id RUN``: a ``rebuild_read_model`` task's build, as the DAG run's owner of
  the model's rebuild lock: reserve the next generation, fold the archive into it, catch it up, mark it ready,
  and hand the lock over to the run's next task (``check``). What it built is written to ``result_path``, which
  the run's next task reads (a submitted job returns no XCom).
- ``reprocess-range NAME --from T1 --to T2 --dag DAG --run-id RUN``: a ``reprocess_windows`` task's reprocess of
  its data interval (skipped, without Spark, when no late event waits and the windows are closed); the result
  holds the figures of the read model's asset event.
- ``maintain NAME --retention-hours H --dag DAG --run-id RUN``: a ``maintenance`` task's drop, OPTIMIZE and
  VACUUM of a read model, under its rebuild lock; the result says what was done (or why it was skipped).
- ``backfill dim_merchant --dag DAG --run-id RUN``: a ``backfill_reference`` task's backfill of the read models that
  join the reference table (``spark_apps.backfill``: its MERGE with delta-rs in the driver, the windowed minutes
  reprocessed on the cluster); the result names the read models it committed to, with their Delta versions.

A job's bad argument (an unknown or unwindowed read model, a bound that is no time, a retention below Delta's
default) is refused before Spark starts, with exit code 2 and the reason. The driver's output is the task's log
(client deploy mode: the submitting process reads it).
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
from lakehouse.storage import delta_table

__all__ = ["JOBS", "RESULTS_KEPT_DAYS", "result_path", "read_result", "write_result", "rebuild_build",
           "reprocess_skipped", "reprocess_range", "maintain_model", "parser", "main"]

JOBS = ("rebuild-build", "reprocess-range", "maintain")
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
    from spark_apps.rebuild import ProgressPush, build_generation, rebuild_run, start_generation
    from spark_apps.session import build_session

    by = f"airflow {dag_id}/{run_id}"
    lock = RebuildLock(settings, name, log=log, owner=airflow_owner(dag_id, run_id)).acquire()
    progress = ProgressPush(settings, name, dag_id, log)  # each step, to the Pushgateway
    try:
        previous, generation = start_generation(settings, name, by, f"{dag_id} DAG", log)
        run = rebuild_run(settings, name)  # the Spark application's parent in lineage
        spark = build_session(settings, app_name=f"eventlake-rebuild-{name}", log=log, job=True, lineage_parent=run)
        try:
            built = build_generation(spark, settings, name, generation.number, by, log, progress, run.run_id)
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


def reprocess_skipped(settings: Settings, name: str, start, end, log: Callable[[str], None] = _log) -> dict | None:
    """Without Spark (delta-rs reads): the result of a ``reprocess_windows`` day with nothing to do (no late event
    of ``start`` .. ``end`` waiting and its windows closed, or no event applied yet), logged; None when the day
    must be reprocessed. Raises ReprocessError for bad input."""
    from spark_apps.reprocess import late_events_waiting, parse_bound

    t1, t2 = parse_bound(start, "--from"), parse_bound(end, "--to")
    waiting, watermark = late_events_waiting(settings, name, t1, t2)
    if waiting == 0 and watermark is not None and watermark >= t2:
        log(f"reprocess: {name}: no late event of {t1:%Y-%m-%dT%H:%M}Z .. {t2:%Y-%m-%dT%H:%M}Z waits to be folded "
            f"in and its windows are closed (watermark {watermark:%Y-%m-%dT%H:%M:%S}Z): skipped")
        return {"read_model": name, "skipped": "no late events waiting", "late_folded": 0}
    if waiting == 0 and watermark is None:  # e.g. a domain that has sent no event yet
        log(f"reprocess: {name}: no event applied yet (no watermark) and no late event waiting: nothing to "
            f"recompute, skipped")
        return {"read_model": name, "skipped": "no event applied yet", "late_folded": 0}
    return None


def reprocess_range(settings: Settings, name: str, start, end, dag_id: str, run_id: str,
                    log: Callable[[str], None] = _log, where: str = "") -> dict:
    """The task of ``reprocess_windows``, in the Airflow worker or submitted to a cluster (``where`` says which
    in its last log line): reprocess windowed read model ``name``'s windows ``start`` .. ``end`` (a skipped day:
    ``reprocess_skipped``, no Spark). Returns the figures of its asset event: ``table_version`` is None when
    nothing was committed. Raises ReprocessError (bad input) or ReprocessRefused (e.g. windows not closed)."""
    from lakehouse import metrics
    from spark_apps.reprocess import parse_bound, reprocess, reprocess_run
    from spark_apps.session import build_session

    t1, t2 = parse_bound(start, "--from"), parse_bound(end, "--to")
    skipped = reprocess_skipped(settings, name, t1, t2, log)
    if skipped is not None:
        return skipped
    run = reprocess_run(settings, name)  # the Spark application's parent in lineage
    spark = build_session(settings, app_name=f"eventlake-reprocess-{name}", job=True, lineage_parent=run)
    try:
        outcome = reprocess(spark, settings, name, t1, t2, by=f"airflow {dag_id} {run_id}", log=log,
                            lineage_run_id=run.run_id)
    finally:
        spark.stop()
    metrics.push(settings, dag_id, {"read_model": name}, outcome.samples())
    if where:
        log(f"reprocess: {name}: windows {t1:%Y-%m-%dT%H:%M}Z .. {t2:%Y-%m-%dT%H:%M}Z reprocessed{where}")
    return {"read_model": name, "generation": outcome.generation, "windows": outcome.windows,
            "windows_changed": outcome.windows_changed, "late_folded": outcome.late_folded,
            "table_version": outcome.table_version, "seconds": round(outcome.seconds, 1),
            "interval_start": t1.isoformat(), "interval_end": t2.isoformat()}


def backfill_models(settings: Settings, dag_id: str, run_id: str, log: Callable[[str], None] = _log,
                    where: str = "") -> dict:
    """The task of ``backfill_reference``, in the Airflow worker or submitted to a cluster (``where`` says which in
    its last log line): ``eventlake backfill`` of every read model that joins reference data. Returns what it found
    and did, and ``versions``: the read models whose table it committed to, with their Delta version now (the
    asset events due)."""
    import read_models
    from read_models.catalog import Catalog
    from spark_apps.backfill import backfill_with_spark

    catalog = Catalog(settings)
    names = [m.name for m in read_models.select(None) if m.reference_tables]

    def versions() -> dict:
        out = {}
        for name in names:
            try:
                out[name] = delta_table(catalog.current(name).table).version()
            except Exception:  # noqa: BLE001 -- delta-rs' TableNotFoundError: not projected yet
                out[name] = None
        return out

    before = versions()
    result = backfill_with_spark(settings, by=f"airflow {dag_id} {run_id}", log=log)
    after = versions()
    if where:
        log(f"backfill: done{where}")
    return {"stale": result.stale, "updated": result.updated, "windows": result.windows, "waiting": result.waiting,
            "complete": result.complete, "versions": {n: v for n, v in after.items() if v != before[n]}}


def maintain_model(settings: Settings, name: str, retention_hours: int, dag_id: str, run_id: str,
                   log: Callable[[str], None] = _log, where: str = "") -> dict:
    """The task of ``maintenance``, in the Airflow worker or submitted to a cluster (``where`` says which in its
    log): drop read model ``name``'s generations beyond the last two, OPTIMIZE and VACUUM those kept, under its
    rebuild lock. Returns what was done: ``skipped`` (why the model was left alone, or ""), ``changed`` (tables
    compacted, vacuumed or generations dropped: an asset event is due). Raises MaintenanceError (bad input)."""
    from lakehouse import metrics
    from spark_apps.maintenance import maintain
    from spark_apps.session import build_session

    spark = build_session(settings, app_name=f"eventlake-maintenance-{name}", log=log, job=True)
    try:
        report = maintain(spark, settings, name, int(retention_hours), by=f"airflow {dag_id}/{run_id}", log=log)
    finally:
        spark.stop()
    for line in report.lines():
        log(line)
    metrics.push(settings, dag_id, {"read_model": name}, report.samples(), log)
    if where and not report.skipped:
        log(f"maintenance: {name}: maintained{where}")
    return {"name": name, "current": report.current, "kept": report.kept, "dropped": report.dropped,
            "problems": report.problems, "skipped": report.skipped,
            "changed": report.current is not None and bool(report.optimized or report.vacuumed or report.dropped)}


def parser() -> argparse.ArgumentParser:
    """The ``airflow-job`` app's arguments: one subcommand per job (``JOBS``)."""
    found = argparse.ArgumentParser(prog="airflow-job", description="a DAG task's Spark work, submitted")
    jobs = found.add_subparsers(dest="job", required=True)
    build = jobs.add_parser("rebuild-build", help="build the next generation of a read model (rebuild_read_model)")
    build.add_argument("name")
    ranged = jobs.add_parser("reprocess-range", help="reprocess a windowed read model's windows of a time range "
                                                     "(reprocess_windows)")
    ranged.add_argument("name")
    ranged.add_argument("--from", dest="start", required=True, help="ISO-8601 time, on a minute (no zone: UTC)")
    ranged.add_argument("--to", dest="end", required=True, help="ISO-8601 time, on a minute (no zone: UTC)")
    maintained = jobs.add_parser("maintain", help="drop, OPTIMIZE and VACUUM a read model's generations "
                                                  "(maintenance)")
    maintained.add_argument("name")
    maintained.add_argument("--retention-hours", type=int, required=True, help="VACUUM retention, at least 168")
    backfilled = jobs.add_parser("backfill", help="the read models that join a reference table brought in line with "
                                                  "it (backfill_reference)")
    backfilled.add_argument("name", help="the reference table (dim_merchant)")
    for job in (build, ranged, maintained, backfilled):
        job.add_argument("--dag", required=True)
        job.add_argument("--run-id", required=True)
        job.add_argument("--lineage-parent", default="", help="the submitting task's OpenLineage run "
                                                              "(<namespace>/<job>/<run id>): our runs' parent")
    return found


def _refused(args: argparse.Namespace) -> str | None:
    """Why a job's arguments cannot run (checked before Spark starts), or None."""
    import read_models

    if args.job == "reprocess-range":
        from spark_apps.reprocess import ReprocessError, validate

        try:
            validate(args.name, args.start, args.end)
        except ReprocessError as e:
            return str(e)
    elif args.job == "backfill":
        from read_models.enrichment import MERCHANT_TABLE

        if args.name != MERCHANT_TABLE:
            return f"unknown reference table {args.name!r}; reference tables: {MERCHANT_TABLE}"
    elif args.job == "maintain":
        from spark_apps.maintenance import DEFAULT_RETENTION_HOURS

        if args.name not in read_models.REGISTRY:
            return f"unknown read model {args.name!r}; read models: {', '.join(read_models.REGISTRY)}"
        if args.retention_hours < DEFAULT_RETENTION_HOURS:
            return (f"--retention-hours {args.retention_hours}: below Delta's default retention of "
                    f"{DEFAULT_RETENTION_HOURS} hours")
    return None


def _run(settings: Settings, args: argparse.Namespace) -> dict:
    where = " on the cluster"
    if args.job == "rebuild-build":
        return rebuild_build(settings, args.name, args.dag, args.run_id, where=where)
    if args.job == "reprocess-range":
        return reprocess_range(settings, args.name, args.start, args.end, args.dag, args.run_id, where=where)
    if args.job == "backfill":
        return backfill_models(settings, args.dag, args.run_id, where=where)
    return maintain_model(settings, args.name, args.retention_hours, args.dag, args.run_id, where=where)


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: ``JOB ARGS`` (see the module's docstring). Exit codes: 0 done (its result
    written), 1 the job failed (the reason on stderr), 2 bad arguments."""
    from lakehouse.errors import EventlakeError

    found = parser()
    args = found.parse_args(argv)
    refused = _refused(args)
    if refused:
        found.error(f"{args.job}: {refused}")
    settings = Settings.load(role="reader")
    if args.lineage_parent:
        settings = settings.replace(lineage_parent=args.lineage_parent)
    # A retried task never reads an earlier attempt's result.
    result_path(settings, args.dag, args.run_id, args.name).unlink(missing_ok=True)
    try:
        result = _run(settings, args)
    except EventlakeError as e:  # a RebuildError, a refused reprocess, ...: the reason, not a traceback
        print(f"airflow-job {args.job}: {e}", file=sys.stderr, flush=True)
        return 1
    write_result(settings, args.dag, args.run_id, args.name, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
