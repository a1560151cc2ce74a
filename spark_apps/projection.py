"""The projection runner: Structured Streaming queries from the events topic into Delta read models.

The entry point of the projection: ``main`` chooses its engine, the Structured Streaming queries
(``spark_apps.spark_projection.Projection``, named here too) or the Python engine
(``python_engine.run.PythonProjection``), and runs it. Both run the same plan (``projection_core.plan``) and keep
the same checkpoints and tables. The engine ``eventlake project`` runs when none is named: ``default_engine``.

Run it with ``eventlake project`` or as a spark-submit target:
``spark-submit --packages <see SPARK_PACKAGES> spark_apps/projection.py [--until-caught-up] [NAMES]``.
"""
from __future__ import annotations

import read_models
from lakehouse.settings import Settings
from read_models.catalog import ARCHIVE_TABLE
from read_models.spec import ReadModel
from lakehouse.lineage import Lineage, kafka_topic, table
from projection_core.plan import ProjectionPlan
from python_engine.run import PythonProjection, supports
from spark_apps.spark_projection import ARCHIVE_STATS_COLUMNS, Projection, ProjectionError, ProjectionRun
from spark_apps.spark_projection import spark_event_row_schema as _event_row_schema  # noqa: F401 -- bench/rebuild.py

__all__ = ["Projection", "ProjectionError", "ProjectionRun", "ARCHIVE_STATS_COLUMNS", "main", "project",
           "default_engine", "lineage_run", "projection_job", "projection_job_for", "selection"]


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: the arguments of :func:`project`."""
    import argparse

    parser = argparse.ArgumentParser(prog="projection", description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help=f"read models and/or {ARCHIVE_TABLE} (default: all of "
                                                  f"{', '.join(read_models.REGISTRY)} and {ARCHIVE_TABLE})")
    parser.add_argument("--until-caught-up", action="store_true",
                        help="process what the log holds now, then stop (availableNow trigger)")
    parser.add_argument("--engine", choices=("python", "spark"), default="spark",
                        help="python: run the queries in this process with DuckDB and delta-rs "
                             "(python_engine), handing batches off the common path to Spark")
    args = parser.parse_args(argv)
    return project(Settings.load(role="reader"), args.models, args.until_caught_up, args.engine)


def default_engine(settings: Settings) -> tuple[str, str]:
    """The engine ``eventlake project`` runs when none is named: (engine, why). This one wherever it can run (local
    tables and checkpoints, Spark in this process), since it gives fresher read models with less memory; the Spark
    engine for storage URIs and for a Spark cluster named by ``EVENTLAKE_SPARK_MASTER``."""
    why = supports(settings)
    if why:
        return "spark", why
    master = settings.spark_master
    if not master.startswith("local"):
        return "spark", (f"EVENTLAKE_SPARK_MASTER={master} names a Spark cluster: the Structured Streaming "
                         f"queries run there")
    return "python", ("the tables and checkpoints are local folders (--engine spark for the Structured Streaming "
                      "queries)")


def project(settings: Settings, names: list[str], until_caught_up: bool = False, engine: str = "spark") -> int:
    """Project the events into ``names`` (read models and/or event_archive; none: every read model and the archive)
    with ``engine`` (python or spark), until caught up or, as a service, until SIGTERM; what ``main`` and
    ``eventlake project`` run."""
    from event_store.kafka_access import check_access
    from lakehouse import metrics
    from lakehouse.signals import stop_requested_on_sigterm
    from spark_apps.session import build_session

    check_access(settings, timeout_s=5.0, require_answer=False)  # refused (SASL): one line, before Spark starts
    models, archive = selection(names)
    # Installed before the (slow) session start, so that a SIGTERM meanwhile is not lost either.
    stop_requested = None if until_caught_up else stop_requested_on_sigterm()
    if engine == "python":
        return _run_python_engine(settings, models, archive, until_caught_up, stop_requested)
    # Our run's id is known before the session starts: with spark_lineage=all, OpenLineage's Spark listener in the
    # session names it as the Spark application's parent.
    planned = Lineage.for_settings(settings).planned(projection_job_for(names))
    spark = build_session(settings, app_name="eventlake-projection", streaming=True, lineage_parent=planned)
    projection = Projection(spark, settings, models, archive=archive)
    server = metrics.serve(settings, "projection", projection.figures.samples)
    try:
        with lineage_run(settings, projection.plan, until_caught_up, run_id=planned.run_id):
            if until_caught_up:
                run = projection.run_until_caught_up()
                print(f"projection: caught up: {run.input_rows} events in {run.batches} batches, "
                      f"{run.seconds:.1f}s; tables under {settings.warehouse}")
                return 0
            projection.start()
            try:
                projection.await_termination(stop_requested)
            except KeyboardInterrupt:
                projection.stop()
    finally:
        if server is not None:
            server.close()
    if stop_requested.is_set():
        print(f"projection: stopped (SIGTERM); the next start resumes from the checkpoints under "
              f"{settings.checkpoints}")
    return 0


def selection(names: list[str]) -> tuple[list[ReadModel] | None, bool]:
    """What ``eventlake project NAMES`` projects: (the read models named, None for all; whether the archive),
    none named: every read model and the archive."""
    models_named = [n for n in names if n != ARCHIVE_TABLE]
    return (read_models.select(models_named) if models_named else ([] if names else None),
            not names or ARCHIVE_TABLE in names)


def projection_job(models: list[ReadModel], archive: bool) -> str:
    """The OpenLineage job of a projection of ``models`` (and the archive): ``projection.<names joined by +>``."""
    return "projection." + "+".join([m.name for m in models] + ([ARCHIVE_TABLE] if archive else []))


def projection_job_for(names: list[str]) -> str:
    """The OpenLineage job of ``eventlake project NAMES`` (``selection``)."""
    models, archive = selection(names)
    return projection_job(read_models.select(None) if models is None else models, archive)


def lineage_run(settings: Settings, plan: ProjectionPlan, until_caught_up: bool, log=print,
                run_id: str | None = None):
    """The OpenLineage run (``lakehouse.lineage``) of a projection, whichever engine runs it: job
    ``projection.<its read models, and event_archive, joined by +>``; the events topic (and the reference tables
    its folds join: dim_merchant) in; out, each read model's
    generation(s) the plan writes at the start (a rebuild's switch later moves the live writes to another
    generation, which that rebuild's own run names), the dead letters and, where the plan keeps them, the archive,
    the sequence ledger and the held events. A service (``SERVICE``) or, until caught up, a ``JOB``; a stop
    by SIGTERM or Ctrl-C completes it, an error fails it, a kill -9 leaves its START alone. ``run_id``: the run's
    id when planned (``Lineage.planned``)."""
    outputs = [table(g.table) for gs in plan.resolve().values() for g in gs]
    outputs += [table(settings.table_path(name)) for name in plan.fixed_tables()]
    # The reference tables its folds join as of each event's time (dim_merchant) are read too.
    references = sorted({name for m in plan.models for name in m.reference_tables})
    inputs = [kafka_topic(settings, settings.events_topic)] + [table(settings.table_path(n)) for n in references]
    return Lineage.for_settings(settings, log).running(
        projection_job(plan.models, plan.archive), inputs, outputs, job_type="JOB" if until_caught_up else "SERVICE",
        run_id=run_id)


def _run_python_engine(settings: Settings, models, archive: bool, until_caught_up: bool, stop_requested) -> int:
    from lakehouse import metrics
    from python_engine.figures import figures

    log = lambda line: print(line, flush=True)  # noqa: E731 -- a service's log, seen even if it is killed
    engine = PythonProjection(settings, models, archive=archive, log=log)
    server = metrics.serve(settings, "projection", lambda: figures(engine), log)
    try:
        with lineage_run(settings, engine.plan, until_caught_up, log):
            try:
                run = engine.run(until_caught_up=until_caught_up, stop_requested=stop_requested)
            except KeyboardInterrupt:
                return 0
    finally:
        if server is not None:
            server.close()
    if until_caught_up:
        print(f"projection: caught up: {run.input_rows} events in {run.batches} batches, {run.seconds:.1f}s "
              f"({engine.handed_over} handed to the Spark engine, {engine.parser.batches} parsed by two processes); "
              f"tables under {settings.warehouse}")
    elif stop_requested is not None and stop_requested.is_set():
        print(f"projection: stopped (SIGTERM); the next start resumes from the checkpoints under "
              f"{settings.checkpoints}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
