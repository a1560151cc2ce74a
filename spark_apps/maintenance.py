"""Maintenance of read-model generations: Delta OPTIMIZE and VACUUM of the tables still in use, and dropping the
generations no one can go back to (issue 9; the ``maintenance`` DAG, daily).

For each read model, under its rebuild lock (so no rebuild runs meanwhile; a model whose rebuild is running is
skipped, with who holds it):

1. **drop** every generation beyond the last two: all but the current one and the rollback target (the newest
   earlier generation that served readers, which the live projection keeps up to date). Generations a killed
   rebuild left (ready or unfinished) are abandoned first. ``eventlake rollback`` keeps working: its target is
   never dropped.
2. **OPTIMIZE** (bin-packing compaction) the tables of the current and followed generations: the table and its
   bookkeeping (``_pending``, ``_applied``, its late events). Compaction changes no data (``dataChange=false``).
3. **VACUUM** them with a retention of at least Delta's default, 7 days (168 hours, its
   ``deletedFileRetentionDuration`` and the retention check ``spark.databricks.delta.retentionDurationCheck``,
   which stays on). Why that is enough and why not less: a rollback here switches to another *generation*
   (another table, complete and kept up to date), not to an older version of the same table, so VACUUM never
   takes a rollback away; the retention protects readers and writers in flight (a DuckDB/delta-rs query on a
   snapshot, a streaming MERGE, a check or a reconciliation reading a version) and time travel for a week of
   audits. A shorter retention is refused (MaintenanceError), not silently applied.

A compaction that loses a race with a concurrent commit (the live projection's MERGE) is logged and left for
the next run; nothing is retried here.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from lakehouse.settings import Settings
from lakehouse.errors import BadInput

__all__ = ["DEFAULT_RETENTION_HOURS", "MaintenanceError", "MaintenanceReport", "generations_to_drop", "maintain"]

# Delta's default deletedFileRetentionDuration ("interval 1 week") and the floor its retention check enforces.
DEFAULT_RETENTION_HOURS = 168


class MaintenanceError(BadInput, ValueError):
    """Maintenance cannot run as asked (e.g. a retention below Delta's safety floor)."""


@dataclass
class MaintenanceReport:
    name: str
    current: int | None = None
    kept: list[int] = field(default_factory=list)  # current first, then the followed ones (rollback target)
    dropped: list[int] = field(default_factory=list)
    optimized: dict[str, str] = field(default_factory=dict)  # table path -> what OPTIMIZE did
    vacuumed: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # tables a step could not do (left for the next run)
    dropped_bytes: int = 0  # the files of the generations dropped
    vacuumed_bytes: int = 0  # the files VACUUM deleted
    skipped: str = ""  # the whole model was left alone, and why
    seconds: float = 0.0

    def samples(self) -> list:
        """Its Prometheus figures (``lakehouse.metrics.push``, labelled by read model)."""
        from lakehouse.metrics import Sample

        which = {"read_model": self.name}
        return [Sample("maintenance_generations_dropped", "gauge", "Generations the last run dropped",
                       len(self.dropped), which),
                Sample("maintenance_problems", "gauge", "Tables the last run could not maintain",
                       len(self.problems), which),
                Sample("maintenance_freed_bytes", "gauge", "Bytes the last run freed, by the dropped generations' "
                       "files and VACUUM's", self.dropped_bytes, {**which, "by": "drop"}),
                Sample("maintenance_freed_bytes", "gauge", "Bytes the last run freed, by the dropped generations' "
                       "files and VACUUM's", self.vacuumed_bytes, {**which, "by": "vacuum"}),
                Sample("maintenance_seconds", "gauge", "How long the last run took", self.seconds, which),
                Sample("maintenance_last_run_timestamp_seconds", "gauge", "When the last run ended (Unix time)",
                       time.time(), which)]

    def lines(self) -> list[str]:
        if self.skipped:
            return [f"maintenance: {self.name}: skipped: {self.skipped}"]
        out = [f"maintenance: {self.name}: generation {self.current} is current; kept "
               f"{', '.join(map(str, self.kept))}; dropped " + (", ".join(map(str, self.dropped)) or "none")
               + f"; freed {_size(self.dropped_bytes + self.vacuumed_bytes)} ({_size(self.dropped_bytes)} dropped, "
               f"{_size(self.vacuumed_bytes)} vacuumed) ({self.seconds:.0f}s)"]
        out += [f"  optimize {path}: {what}" for path, what in self.optimized.items()]
        out += [f"  vacuum {path}: {what}" for path, what in self.vacuumed.items()]
        out += [f"  problem: {p}" for p in self.problems]
        return out


def generations_to_drop(state) -> list[int]:
    """Every generation of ``state`` (read_models.catalog.ModelState) beyond the last two: neither current nor the
    rollback target, nor dropped already."""
    keep = {state.current}
    target = state.rollback_target()
    if target is not None:
        keep.add(target)
    return [n for n in sorted(state.generations) if n not in keep and n not in state.dropped]


def _tables(generation, model) -> list[str]:
    """The Delta tables of one generation that exist (its table and the bookkeeping of its merge strategy)."""
    from read_models.spec import CURRENT_STATE_BY_VERSION, WINDOWED_SUM

    paths = [generation.table]
    if model.merge_strategy == CURRENT_STATE_BY_VERSION:
        paths.append(generation.pending)
    if model.merge_strategy == WINDOWED_SUM:
        paths += [generation.applied, generation.late_events]
    return [str(p) for p in paths if (p / "_delta_log").is_dir()]


def maintain(spark, settings: Settings, name: str, retention_hours: int = DEFAULT_RETENTION_HOURS,
             by: str = "maintenance", log: Callable[[str], None] = print) -> MaintenanceReport:
    """Drop read model ``name``'s generations beyond the last two, then OPTIMIZE and VACUUM (``retention_hours``,
    at least 168) the tables of those kept. See the module's docstring for the guarantees."""
    import read_models
    from read_models.catalog import Catalog
    from projection_core.rebuild_errors import RebuildRefused
    from projection_core.rebuild_lock import RebuildLock

    if retention_hours < DEFAULT_RETENTION_HOURS:
        raise MaintenanceError(f"retention_hours={retention_hours}: below Delta's default retention of "
                               f"{DEFAULT_RETENTION_HOURS} hours; readers and writers in flight could lose files "
                               f"(rollback does not need it: it switches generations)")
    model = read_models.get(name)
    report = MaintenanceReport(name)
    started = time.monotonic()
    try:
        lock = RebuildLock(settings, name, log=log, purpose="maintenance").acquire()
    except RebuildRefused as e:
        report.skipped = str(e)
        log(report.lines()[0])
        return report
    try:
        catalog = Catalog(settings)
        state = catalog.state(name)
        for number in generations_to_drop(state):
            if number in state.ready or number in state.unfinished:  # what a killed rebuild left
                catalog.abandon(name, number, by, "maintenance: left by a rebuild that did not finish")
            freed: list[int] = []
            catalog.drop(name, number, by, "maintenance: beyond the last two generations", freed=freed)
            report.dropped.append(number)
            report.dropped_bytes += sum(freed)
            log(f"maintenance: {name}: dropped generation {number} (beyond the last two), {_size(sum(freed))} freed")
        state = catalog.state(name)
        report.current = state.current
        report.kept = [state.current, *state.followed]
        for number in report.kept:
            for path in _tables(state.generations[number], model):
                _optimize(spark, path, report, log)
                _vacuum(spark, path, retention_hours, report, log)
    finally:
        lock.release()
    report.seconds = time.monotonic() - started
    return report


def _optimize(spark, path: str, report: MaintenanceReport, log) -> None:
    from delta.tables import DeltaTable

    try:
        metrics = DeltaTable.forPath(spark, path).optimize().executeCompaction().collect()[0]["metrics"]
        what = f"{metrics['numFilesRemoved']} file(s) compacted into {metrics['numFilesAdded']}"
        report.optimized[path] = what
        log(f"maintenance: {report.name}: optimize {path}: {what}")
    except Exception as e:  # noqa: BLE001 -- e.g. a concurrent MERGE won: the next run compacts
        report.problems.append(f"optimize {path}: {_first_line(e)}")
        log(f"maintenance: {report.name}: optimize {path} not done ({_first_line(e)}); the next run tries again")


def _vacuum(spark, path: str, retention_hours: int, report: MaintenanceReport, log) -> None:
    from delta.tables import DeltaTable

    try:
        before, before_bytes = _data_files(path)
        # Delta 4 ignores VACUUM's retention argument unless this (internal) switch is off, and keeps the table's
        # deletedFileRetentionDuration (a week) instead: a longer retention asked for would silently not apply.
        spark.conf.set("spark.databricks.delta.vacuum.retentionWindowIgnore.enabled", "false")
        DeltaTable.forPath(spark, path).vacuum(float(retention_hours))
        after, after_bytes = _data_files(path)
        report.vacuumed_bytes += max(0, before_bytes - after_bytes)
        what = (f"{before - after} unreferenced file(s) older than {retention_hours}h deleted"
                + (f" ({_size(before_bytes - after_bytes)})" if before_bytes > after_bytes else ""))
        report.vacuumed[path] = what
        log(f"maintenance: {report.name}: vacuum {path}: {what}")
    except Exception as e:  # noqa: BLE001
        report.problems.append(f"vacuum {path}: {_first_line(e)}")
        log(f"maintenance: {report.name}: vacuum {path} not done ({_first_line(e)}); the next run tries again")


def _data_files(path: str) -> tuple[int, int]:
    """A table's data files: how many, and their bytes."""
    from pathlib import Path

    sizes = [p.stat().st_size for p in Path(path).rglob("*.parquet")]
    return len(sizes), sum(sizes)


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 2 ** 20 else f"{n / 2 ** 20:,.1f} MiB"


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
