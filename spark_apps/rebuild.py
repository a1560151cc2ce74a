"""A rebuild of a read model without downtime: a new generation folded from ``event_archive``
(``spark_apps.rebuild_fold``), caught up from Kafka, checked, and switched to in one catalog commit, under the
model's lock (``projection_core.rebuild_lock``). The previous generation stays for rollback.

Four steps, each a function the CLI's ``rebuild()`` calls in one process and the ``rebuild_read_model`` DAG calls as
its own task (``start_generation`` + ``build_generation`` in ``build``, ``check_generation`` in ``check``,
``switch_generation`` in ``switch``). Between them only (name, generation, previous) travels.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from lakehouse.lineage import Lineage, LineageRun, kafka_topic, table
from lakehouse.settings import Settings
from projection_core.rebuild_errors import RebuildError, RebuildFailed
from projection_core.rebuild_lock import RebuildLock
from read_models.catalog import ARCHIVE_TABLE, held_table, ledger_table
from read_models.spec import CURRENT_STATE_BY_VERSION, WINDOWED_SUM
from spark_apps.rebuild_fold import FoldResult, FoldTargets, catch_up_offsets, fold_archive, fold_steps

__all__ = ["RebuildOutcome", "BuildResult", "rebuild", "start_generation", "build_generation", "check_generation",
           "switch_generation", "rebuild_models", "rebuild_run", "main"]


@dataclass
class RebuildOutcome:
    name: str
    generation: int  # the new generation (current now, unless a dry run)
    previous: int  # the generation that was current when the rebuild began (kept for rollback)
    switched: bool
    fold: FoldResult
    caught_up_events: int = 0
    seconds: float = 0.0
    check_lines: list[str] = field(default_factory=list)


@dataclass
class BuildResult:
    """What ``build_generation`` did: the fold and the events caught up from Kafka after it."""
    name: str
    generation: int
    fold: FoldResult
    caught_up_events: int = 0
    seconds: float = 0.0
    steps: int = 0  # of the build: the fold's, then two catch-ups

    def samples(self) -> list:
        """Its Prometheus figures (``lakehouse.metrics.push``, labelled by read model)."""
        import time

        from lakehouse.metrics import Sample

        which = {"read_model": self.name}
        return [Sample("rebuild_generation", "gauge", "The generation the last rebuild built", self.generation, which),
                Sample("rebuild_archived_events", "gauge", "Archived events the last rebuild folded", self.fold.events,
                       which),
                Sample("rebuild_caught_up_events", "gauge", "Events the last rebuild caught up from Kafka after its "
                       "fold", self.caught_up_events, which),
                Sample("rebuild_seconds", "gauge", "How long the last rebuild's build took", self.seconds, which),
                Sample("rebuild_built_timestamp_seconds", "gauge", "When the last rebuild's build ended (Unix time)",
                       time.time(), which),
                *progress_samples(self.name, self.steps, self.steps, self.seconds, running=False)]


def progress_samples(name: str, done: int, total: int, elapsed_s: float, running: bool = True) -> list:
    """A build's progress as Prometheus figures (pushed by the rebuild DAG after each step, and with its outcome):
    steps done of all (the fold's steps, then two catch-ups), whether it runs, for how long."""
    import time

    from lakehouse.metrics import Sample

    which = {"read_model": name}
    return [Sample("rebuild_running", "gauge", "1 while a rebuild's build runs", 1 if running else 0, which),
            Sample("rebuild_steps_done", "gauge", "Steps of the build done (the fold's, then two catch-ups)", done,
                   which),
            Sample("rebuild_steps", "gauge", "Steps of the build in all", total, which),
            Sample("rebuild_elapsed_seconds", "gauge", "How long the build has run", elapsed_s, which),
            Sample("rebuild_progress_timestamp_seconds", "gauge", "When the build last reported (Unix time)",
                   time.time(), which)]


class ProgressPush:
    """A build's progress pushed to the Pushgateway (``lakehouse.metrics.push``, when one is configured) after each
    step: give it as ``build_generation(progress=...)``; ``ended()`` says the build is no longer running when it
    failed (a build that succeeds says so with its outcome, ``BuildResult.samples``)."""

    def __init__(self, settings: Settings, name: str, job: str, log: Callable[[str], None] = print):
        self.settings, self.name, self.job, self.log = settings, name, job, log
        self.last = (0, 0, 0.0)
        self.pushed = 0  # progress reports the Pushgateway took

    def __call__(self, done: int, total: int, elapsed_s: float) -> None:
        from lakehouse import metrics

        self.last = (done, total, elapsed_s)
        self.pushed += metrics.push(self.settings, self.job, {"read_model": self.name},
                                    progress_samples(self.name, done, total, elapsed_s), self.log)

    def ended(self) -> None:
        from lakehouse import metrics

        metrics.push(self.settings, self.job, {"read_model": self.name},
                     progress_samples(self.name, *self.last, running=False), self.log)


def start_generation(settings: Settings, name: str, by: str, reason: str = "",
                     log: Callable[[str], None] = print):
    """Step 0 (under the model's lock): abandon what an earlier rebuild left unfinished (a killed one, a failed
    run) and reserve the next generation -> (previous current generation number, the new Generation)."""
    import read_models
    from read_models.catalog import Catalog

    read_models.get(name)  # an unknown name fails here, naming the known ones
    catalog = Catalog(settings)
    for leftover in catalog.state(name).unfinished:
        log(f"rebuild: {name}: generation {leftover} was left unfinished by an earlier rebuild; abandoning it")
        catalog.abandon(name, leftover, by, "left unfinished by an earlier rebuild")
        catalog.drop(name, leftover, by, "left unfinished by an earlier rebuild")
    previous = catalog.state(name).current
    generation = catalog.create_next(name, by, reason or "rebuild from the event archive")
    log(f"rebuild: {name}: building generation {generation.number} in {generation.table} while generation "
        f"{previous} keeps serving")
    return previous, generation


def build_generation(spark, settings: Settings, name: str, number: int, by: str,
                     log: Callable[[str], None] = print,
                     progress: Callable[[int, int, float], None] | None = None,
                     lineage_run_id: str | None = None) -> BuildResult:
    """Steps 1-3 on a reserved generation: fold the archive into it, catch it up from Kafka, mark it ready (the
    live projection writes it too from its next batch) and catch up once more. Progress lines name the events
    done of the total and an ETA; ``progress(done, total, elapsed_s)`` is called after each step (the fold's,
    then each catch-up). An error abandons the generation (readers never saw it) and is raised.
    ``lineage_run_id``: the id of its OpenLineage run when planned (``rebuild_run``: the Spark application's
    parent)."""
    import read_models
    from read_models.catalog import Catalog
    from spark_apps.spark_projection import Projection

    model = read_models.get(name)
    catalog = Catalog(settings)
    generation = catalog.generation(name, number)
    started = time.monotonic()
    catch_up_name = str(generation.checkpoint.relative_to(settings.checkpoints))
    targets = {name: FoldTargets(
        table=str(generation.table), ledger=str(settings.table_path(ledger_table(catch_up_name))),
        held=str(settings.table_path(held_table(catch_up_name))),
        pending=str(generation.pending) if model.merge_strategy == CURRENT_STATE_BY_VERSION else None,
        applied=str(generation.applied) if model.merge_strategy == WINDOWED_SUM else None,
        late=str(generation.late_events) if model.merge_strategy == WINDOWED_SUM else None)}
    folding = fold_steps([model])
    steps = folding + 2  # and two catch-ups

    def report(done: int) -> None:
        if progress is not None:
            progress(done, steps, time.monotonic() - started)

    # Its OpenLineage run (lakehouse.lineage): the archive and the events topic after it in (and the reference
    # tables its fold joins), the generation out.
    lineage = Lineage.for_settings(settings, log)
    run = lineage.start(f"rebuild.{name}", [table(settings.table_path(ARCHIVE_TABLE)),
                                            kafka_topic(settings, settings.events_topic),
                                            *(table(settings.table_path(t)) for t in model.reference_tables)],
                        [table(generation.table)], job_type="JOB", run_id=lineage_run_id)
    try:
        folded = fold_archive(spark, settings, [model], targets, log=log, on_step=lambda done, _total: report(done))
        catalog.record_position(name, number, folded.position, by)
        generation = catalog.generation(name, number)

        def catch_up(step: str) -> int:
            from event_store import kafka_log

            offsets = catch_up_offsets(settings, folded.position)
            ends = {tp.partition: end for tp, end in kafka_log.end_offsets(settings, settings.events_topic).items()}
            waiting = sum(max(0, end - (offsets.get(p, 0) if offsets.get(p, 0) >= 0 else 0))
                          for p, end in ends.items())
            log(f"rebuild: {name}: {step}: up to {waiting:,} record(s) in Kafka after the folded position "
                f"(elapsed {time.monotonic() - started:.0f}s)")
            projection = Projection(spark, settings, [model], log=log, archive=False,
                                    generations={name: generation}, checkpoint=generation.checkpoint,
                                    starting_offsets=offsets)
            run = projection.run_until_caught_up()
            log(f"rebuild: {name}: {step}: {run.input_rows:,} event(s) from Kafka after the archive's position "
                f"in {run.batches} batch(es) (elapsed {time.monotonic() - started:.0f}s)")
            return run.input_rows

        caught = catch_up("catch-up [1/2]")
        report(folding + 1)
        catalog.mark_ready(name, number, by)
        caught += catch_up("catch-up [2/2] (the live projection follows it now)")
        report(steps)
    except BaseException as e:
        lineage.fail(run, e)
        _abandon_quietly(catalog, name, number, by, "the rebuild stopped with an error", log)
        raise
    lineage.complete(run)
    return BuildResult(name, number, folded, caught, time.monotonic() - started, steps)


def check_generation(settings: Settings, name: str, number: int, previous: int, by: str,
                     log: Callable[[str], None] = print) -> list[str]:
    """Step 4: the model's suite and the reconciliation on generation ``number`` -> the report lines. A failure
    (or an error) abandons the generation, so readers stay on ``previous``, and raises RebuildFailed."""
    from expectations.checks import verdict
    from read_models.catalog import Catalog

    catalog = Catalog(settings)
    try:
        state = catalog.state(name)
        if number in state.dropped or number in state.abandoned:
            raise RebuildError(f"{name}: generation {number} was abandoned meanwhile (by another rebuild or "
                               f"maintenance); run the rebuild again")
        generation = catalog.generation(name, number)
        log(f"rebuild: {name}: checking generation {number} (its suite and the reconciliation)")
        checked = verdict(settings, name, reconcile=True, generation=generation)
        lines = checked.lines()
        for line in lines:
            log(f"rebuild: {name}: {line}")
    except BaseException:
        _abandon_quietly(catalog, name, number, by, "its check stopped with an error", log)
        raise
    if checked.failed:
        _abandon_quietly(catalog, name, number, by, "failed its checks", log)
        raise RebuildFailed(f"{name}: generation {number} failed its checks; readers stay on generation {previous}",
                            lines)
    return lines


def switch_generation(settings: Settings, name: str, number: int, previous: int, by: str, reason: str = "",
                      dry_run: bool = False, log: Callable[[str], None] = print) -> bool:
    """Step 5: make the checked generation current, a compare-and-set against ``previous`` -> switched. A dry run
    (or a refused switch: another switch or rollback came first) abandons it instead; readers stay."""
    from read_models.catalog import Catalog, CatalogRefused

    catalog = Catalog(settings)
    if dry_run:
        _abandon_quietly(catalog, name, number, by, "dry run: built and checked, not switched", log)
        log(f"rebuild: {name}: generation {number} passed its checks (dry run: not switched, dropped); readers stay "
            f"on generation {previous}")
        return False
    try:
        catalog.switch(name, number, previous, by, reason or "rebuild passed its checks")
    except CatalogRefused as e:
        _abandon_quietly(catalog, name, number, by, f"switch refused: {e}", log)
        raise RebuildError(str(e)) from None
    log(f"rebuild: {name}: generation {number} is current now; generation {previous} is kept for "
        f"`eventlake rollback {name}`")
    return True


def rebuild(spark, settings: Settings, name: str, by: str = "", reason: str = "", dry_run: bool = False,
            log: Callable[[str], None] = print, lineage_run_id: str | None = None) -> RebuildOutcome:
    """Build the next generation of read model ``name`` while the current one keeps serving, check it, and
    switch readers to it in one catalog commit (issue 9):

    1. fold ``event_archive`` up to the position it has reached, into a new generation (``fold_archive``);
    2. catch the generation up from Kafka after that position (its own checkpoint and sequence ledger);
    3. mark it ``ready``: from its next batch on the live projection writes it too; catch up once more, which
       covers every batch the live projection planned before it saw the mark, so nothing is missing;
    4. its suite and the reconciliation; a failure abandons it (readers stay) and raises RebuildFailed;
    5. switch (a compare-and-set against the generation that was current at the start).

    A rebuild killed at any point leaves readers on a complete generation (only the switch changes what they
    read); running it again abandons what the killed one left and starts over. ``dry_run`` does 1-4 and then
    abandons the generation. Two rebuilds of one model at once: the second raises RebuildRefused."""
    import read_models

    read_models.get(name)
    who = by or "eventlake rebuild"
    started = time.monotonic()
    with RebuildLock(settings, name, log):
        previous, generation = start_generation(settings, name, who, reason, log)
        built = build_generation(spark, settings, name, generation.number, who, log, lineage_run_id=lineage_run_id)
        lines = check_generation(settings, name, generation.number, previous, who, log)
        switched = switch_generation(settings, name, generation.number, previous, who, reason, dry_run, log)
        outcome = RebuildOutcome(name, generation.number, previous, switched, built.fold, built.caught_up_events,
                                 time.monotonic() - started, lines)
        log(f"rebuild: {name}: done in {outcome.seconds:.0f}s")
        return outcome


def _abandon_quietly(catalog, name: str, number: int, by: str, reason: str, log: Callable[[str], None]) -> None:
    """Abandon and drop a generation that will not be switched to; a failure here is logged, not raised (the
    next rebuild abandons what is left)."""
    try:
        state = catalog.state(name)
        if number not in state.abandoned and number not in state.dropped:
            catalog.abandon(name, number, by, reason)
        catalog.drop(name, number, by, reason)
    except Exception as e:  # noqa: BLE001 -- the original error matters more
        log(f"rebuild: {name}: could not abandon generation {number} ({e}); the next rebuild will")


def rebuild_run(settings: Settings, name: str) -> LineageRun:
    """The OpenLineage run a rebuild of ``name`` will start (``Lineage.planned``: job ``rebuild.<name>``)."""
    return Lineage.for_settings(settings).planned(f"rebuild.{name}")


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: the arguments of :func:`rebuild_models`."""
    import argparse
    import getpass

    parser = argparse.ArgumentParser(prog="rebuild", description=rebuild.__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="read models to rebuild")
    parser.add_argument("--dry-run", action="store_true", help="build and check, but do not switch")
    parser.add_argument("--reason", default="", help="why (kept in the catalog)")
    parser.add_argument("--by", help="who asks (default: the current user)")
    args = parser.parse_args(argv)
    try:
        by = args.by or getpass.getuser()
    except (KeyError, OSError):
        by = "operator"
    return rebuild_models(Settings.load(), args.models, by=by, reason=args.reason, dry_run=args.dry_run)


def rebuild_models(settings: Settings, names: list[str], by: str, reason: str = "", dry_run: bool = False) -> int:
    """Rebuild each of ``names`` in turn (what ``main`` and ``eventlake rebuild`` run); 1 when any of them failed
    its checks or could not start, after trying the others."""
    from spark_apps.session import build_session

    # One model: its rebuild's OpenLineage run is the Spark application's parent (several share the application,
    # whose parent is then the settings' lineage_parent, as each rebuild's run's is).
    planned = rebuild_run(settings, names[0]) if len(names) == 1 else None
    spark = build_session(settings, app_name="eventlake-rebuild", job=True, lineage_parent=planned)
    failed = 0
    try:
        for name in names:
            try:
                outcome = rebuild(spark, settings, name, by=by, reason=reason, dry_run=dry_run,
                                  lineage_run_id=planned.run_id if planned else None)
            except RebuildError as e:
                print(f"eventlake rebuild: {e}", file=sys.stderr)
                for line in getattr(e, "lines", ()):
                    print(f"  {line}", file=sys.stderr)
                failed += 1
                continue
            f = outcome.fold
            print(f"rebuild: {name}: generation {outcome.generation} "
                  + ("is current" if outcome.switched else "checked (dry run, not switched)")
                  + f": {f.events:,} archived events folded at {f.events_per_second:,.0f} events/s, "
                    f"{outcome.caught_up_events:,} caught up from Kafka, {outcome.seconds:.0f}s in all")
    finally:
        spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
