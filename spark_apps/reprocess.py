"""``eventlake reprocess NAME --from T1 --to T2``: recompute the closed windows of a time range of a windowed read
model from ``event_archive``, late events included, and replace exactly that range of its current generation.

Why: a windowed model (``WINDOWED_SUM``, e.g. ``merchant_minute_volume``) applies an event to its window only
while the window is open (before the watermark); a later one is recorded in ``late_events`` instead. Reprocessing
folds those back into their windows.

How, for the current generation (read_models/catalog.py) and windows ``T1 <= window_start < T2``:

1. the log position P the table stands at (as the reconciliation finds it); the archive must have reached it;
2. the archive's events before P of the aggregates that have a model event in the range (whole aggregates, so
   the sequence rule (``rebuild_fold.admit_archived``) admits exactly what it admits over the whole log), folded with the
   model's own vectorised ``fold`` (``rebuild_fold.insert_rows``'s columns): the range's rows as the log has them;
3. if they differ from the table's rows in the range: one Delta commit, ``replaceWhere`` on the range;
4. the model's late events in the range that went into that fold get ``reprocessed_at`` (a column added to the
   late-events table on first use): they stay as the record of what came late, and the reconciliation counts
   them in their window in the table, not a second time beside it.

Only closed windows: a window ends at or before the table's watermark (what the live projection splits by), so
no event the live projection applies later can go into it (it goes to ``late_events``, unmarked, and is folded
in by the next reprocess of that range). A range reaching past the watermark is refused, naming both.
Running it twice changes nothing: the fold is the same, so the second run commits nothing. The table is written
before the marks (as every writer here writes its target before its bookkeeping): a run stopped in between
leaves late events counted twice by the reconciliation until it is run again.
"""
from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass
from typing import Callable

from event_store.sealing import Unsealer
from lakehouse.lineage import Lineage, LineageRun, table
from lakehouse.settings import Settings
from projection_core.reference import ReferenceTables
from read_models.catalog import ARCHIVE_TABLE, REPROCESSED_AT
from read_models.spec import WINDOWED_SUM, ReadModel
from lakehouse.errors import BadInput, Refused
from spark_apps.reference_join import with_reference
from spark_apps.unsealing import unsealed

__all__ = ["ReprocessError", "ReprocessRefused", "ReprocessOutcome", "WINDOW", "parse_bound", "validate",
           "late_events_waiting", "reprocess", "reprocess_closed", "reprocess_run"]

# The windows of a windowed model are event-time minutes (its fold: date_trunc('minute'), window_end = +1 minute).
WINDOW = dt.timedelta(minutes=1)
# The column of late_events that marks a late event folded into its window by a reprocess (null: not yet).
_RETRIES = 3


class ReprocessError(BadInput, ValueError):
    """A reprocess asked with bad input (a time that does not parse, an empty range, a model without windows)."""


class ReprocessRefused(Refused, RuntimeError):
    """A reprocess that cannot be done now: windows still open, no table or archive yet, the archive behind."""


@dataclass
class ReprocessOutcome:
    name: str
    generation: int
    start: dt.datetime  # UTC, aware
    end: dt.datetime
    position: dict[int, int]  # partition -> end offset (exclusive) of the events folded
    watermark: dt.datetime
    windows: int = 0  # windows in the range after the reprocess
    windows_changed: int = 0  # windows whose row was added, changed or removed
    late_folded: int = 0  # late events newly marked as folded into their window
    late_already: int = 0  # late events of the range marked by an earlier reprocess
    table_version: int | None = None  # the Delta version the replace committed (None: nothing differed)
    seconds: float = 0.0

    def samples(self) -> list:
        """Its Prometheus figures (``lakehouse.metrics.push``, labelled by read model)."""
        import time

        from lakehouse.metrics import Sample

        which = {"read_model": self.name}
        return [Sample("reprocess_windows", "gauge", "Windows in the last reprocessed range", self.windows, which),
                Sample("reprocess_windows_changed", "gauge", "Windows the last run added, changed or removed",
                       self.windows_changed, which),
                Sample("reprocess_late_events_folded", "gauge", "Late events the last run folded in",
                       self.late_folded, which),
                Sample("reprocess_seconds", "gauge", "How long the last run took", self.seconds, which),
                Sample("reprocess_range_end_timestamp_seconds", "gauge", "The end of the last range reprocessed "
                       "(Unix time)", self.end.timestamp(), which),
                Sample("reprocess_last_run_timestamp_seconds", "gauge", "When the last run ended (Unix time)",
                       time.time(), which)]

    def line(self) -> str:
        commit = (f"replaced in one commit (Delta version {self.table_version})" if self.table_version is not None
                  else "nothing differed: no commit")
        return (f"reprocess: {self.name} generation {self.generation}, windows {_iso(self.start)} .. {_iso(self.end)}: "
                f"{self.windows:,} window(s), {self.windows_changed:,} changed, {commit}; {self.late_folded:,} late "
                f"event(s) folded in ({self.late_already:,} by an earlier reprocess); {self.seconds:.1f}s")


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_bound(text, what: str) -> dt.datetime:
    """An ISO-8601 time (``2026-01-01``, ``2026-01-01T10:00``, ``...Z``, ``...+02:00``; no zone: UTC) or a datetime,
    as an aware UTC datetime; ``what`` names the input in the error (``--from``)."""
    if isinstance(text, dt.datetime):  # a plain datetime (not e.g. pendulum's subclass, which Spark cannot type)
        value = text if text.tzinfo is None else dt.datetime.fromtimestamp(text.timestamp(), dt.timezone.utc)
    else:
        try:
            value = dt.datetime.fromisoformat(str(text).strip().replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ReprocessError(f"{what} {text!r} is not a time: expected ISO-8601 such as 2026-01-01T10:00:00Z "
                                 f"(no zone: UTC)") from None
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


def validate(name: str, start, end) -> tuple[ReadModel, dt.datetime, dt.datetime]:
    """Check the request without touching any table: a known windowed model and a non-empty range of whole
    windows. -> (model, start, end) in UTC. Raises ReprocessError naming the input and the reason."""
    import read_models

    if name not in read_models.REGISTRY:
        raise ReprocessError(f"unknown read model {name!r}; read models: {', '.join(read_models.REGISTRY)}")
    model = read_models.get(name)
    if model.merge_strategy != WINDOWED_SUM:
        windowed = [m.name for m in read_models.REGISTRY.values() if m.merge_strategy == WINDOWED_SUM]
        raise ReprocessError(f"read model {name} has no time windows to reprocess (its merge strategy is "
                             f"{model.merge_strategy}; `eventlake rebuild {name}` recomputes it from the log); "
                             f"windowed read models: {', '.join(windowed)}")
    t1, t2 = parse_bound(start, "--from"), parse_bound(end, "--to")
    if t1 >= t2:
        raise ReprocessError(f"--from {_iso(t1)} is not before --to {_iso(t2)}: the range of windows is empty")
    for what, t in (("--from", t1), ("--to", t2)):
        if t.second or t.microsecond:
            floor = t.replace(second=0, microsecond=0)
            raise ReprocessError(f"{what} {_iso(t)} is not on a window boundary ({name} has 1-minute windows): "
                                 f"use {_iso(floor)} or {_iso(floor + WINDOW)}")
    return model, t1, t2


def late_events_waiting(settings: Settings, name: str, start, end) -> tuple[int, dt.datetime | None]:
    """(late events of read model ``name`` with an event time in ``start`` .. ``end`` not yet folded back in, the
    model's watermark), read with delta-rs: no JVM. The reprocess_windows DAG skips a closed day with none, so a
    catch-up over months of quiet days starts no Spark session for them."""
    import pyarrow.dataset as ds

    from lakehouse.tables import dataset
    from read_models.catalog import Catalog
    from spark_apps.status import watermark_statuses

    _, t1, t2 = validate(name, start, end)
    watermark = next((w.watermark for w in watermark_statuses(settings) if w.name == name), None)
    path = Catalog(settings).current(name).late_events
    if not (path / "_delta_log").is_dir():
        return 0, watermark
    late = dataset(path)
    waiting = ((ds.field("read_model") == name) & (ds.field("event_time") >= t1) & (ds.field("event_time") < t2))
    if REPROCESSED_AT in late.schema.names:
        waiting = waiting & ~ds.field(REPROCESSED_AT).is_valid()
    return late.count_rows(filter=waiting), watermark


def _sql_time(t: dt.datetime) -> str:
    """A timestamp literal (the session's time zone is UTC: spark_apps/session.py)."""
    return f"TIMESTAMP '{t.astimezone(dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S')}'"


def table_watermark(spark, model: ReadModel, table_path: str) -> dt.datetime | None:
    """The watermark the live projection's next batch splits ``model``'s table by (spark_apps/merge.py): from the
    newest event time on the clock its commits record; for a table from before that, its newest window, capped
    by now. None: nothing applied yet (no window is closed)."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from spark_apps.merge import newest_event_time_on_clock, watermark_delay, windowed_watermark

    table = DeltaTable.forPath(spark, table_path)
    metadata = [json.loads(r["userMetadata"]) for r in table.history(20).select("userMetadata").collect()
                if r["userMetadata"]]
    found, newest = newest_event_time_on_clock(metadata)
    if not found:
        newest_us = table.toDF().agg(F.max(F.unix_micros("window_start"))).collect()[0][0]
        if newest_us is not None:
            newest = min(dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=newest_us),
                         dt.datetime.now(dt.timezone.utc))
    return windowed_watermark(newest, watermark_delay(model))


def reprocess(spark, settings: Settings, name: str, start, end, by: str = "",
              log: Callable[[str], None] = print, lineage_run_id: str | None = None) -> ReprocessOutcome:
    """Recompute the windows ``start <= window_start < end`` of windowed read model ``name`` from the archive
    (late events included) and replace exactly that range of its current generation (one ``replaceWhere``
    commit, none when nothing differs); mark the late events folded in. ``start``/``end``: ISO-8601 text or
    datetimes (no zone: UTC), on minute boundaries. Raises ReprocessError (bad input) or ReprocessRefused
    (windows not closed, no table or archive, the archive behind the table). Once past those checks it is an
    OpenLineage run, ``reprocess.<name>`` (the archive and the late events in, the generation's table and its late
    events out; ``lineage_run_id``: its id when planned, ``reprocess_run``)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from expectations.reconciliation import archive_end, table_position
    from read_models.catalog import Catalog
    from projection_core.rebuild_errors import RebuildError
    from spark_apps.rebuild_fold import admit_archived, insert_rows, read_archive

    model, t1, t2 = validate(name, start, end)
    started = time.monotonic()
    steps = 5

    def step(k: int, text: str) -> None:
        log(f"reprocess: [{k}/{steps}] {text} (elapsed {time.monotonic() - started:.1f}s)")

    catalog = Catalog(settings)
    state = catalog.state(name)
    generation = catalog.generation(name, state.current)
    table_path = str(generation.table)
    if not (generation.table / "_delta_log").is_dir():
        raise ReprocessRefused(f"{name}: no table at {generation.table} yet (generation {generation.number}); "
                               f"run `eventlake project` first")

    # 1. Which windows are closed, and the log position the table stands at.
    watermark = table_watermark(spark, model, table_path)
    if watermark is None or t2 > watermark:
        open_from = "every window (no event applied yet: no watermark)" if watermark is None else \
            f"windows ending after the watermark {_iso(watermark)} (the newest event time on the clock's minute " \
            f"end - {model.watermark_delay})"
        closed = "" if watermark is None or watermark <= t1 else \
            f"; reprocess --from {_iso(t1)} --to {_iso(watermark.replace(second=0, microsecond=0))} for the closed part"
        raise ReprocessRefused(f"{name}: windows {_iso(t1)} .. {_iso(t2)} are not all closed: {open_from} may still "
                               f"change in the live projection; wait until the watermark passes {_iso(t2)}{closed}")
    position, why = table_position(settings, generation)
    if position is None:
        raise ReprocessRefused(f"{name}: cannot tell the log position of {generation.table}: {why}")
    archived = archive_end(settings)
    behind = {p: o for p, o in position.items() if archived.get(p, 0) < o}
    if behind:
        raise ReprocessRefused(f"{name}: the event archive has not reached the table's log position yet (partition: "
                               f"archive end / table end: "
                               + ", ".join(f"p{p}: {archived.get(p, 0)}/{o}" for p, o in sorted(behind.items()))
                               + "); run the projection until both are caught up")
    step(1, f"{name} generation {generation.number} ({table_path}): windows {_iso(t1)} .. {_iso(t2)} are closed "
            f"(watermark {_iso(watermark)}); folding the archive before offsets "
            + (", ".join(f"p{p}<{o}" for p, o in sorted(position.items())) or "(none)"))

    lineage = Lineage.for_settings(settings, log)
    run = lineage.start(f"reprocess.{name}", [table(settings.table_path(ARCHIVE_TABLE)), table(generation.late_events),
                                              *(table(settings.table_path(t)) for t in model.reference_tables)],
                        [table(generation.table), table(generation.late_events)], job_type="JOB", run_id=lineage_run_id)
    try:
        # 2. The archive's events before the table's position, of the aggregates with a model event in the range.
        try:
            archive = read_archive(spark, settings)
        except RebuildError as e:
            raise ReprocessRefused(f"{name}: {e}") from None
        before = F.lit(False)
        for p, o in sorted(position.items()):
            before = before | ((F.col("kafka_partition") == p) & (F.col("kafka_offset") < o))
        events = archive.filter(before)
        in_range = ((F.col(model.event_time) >= F.lit(t1)) & (F.col(model.event_time) < F.lit(t2))
                    & F.col("event_type").isin(*model.event_types))
        hits = events.filter(in_range).select("aggregate_id", "event_id")
        # Whole aggregates (the sequence rule judges an aggregate by all its versions), and those of any record that
        # shares an event id with one in the range (a repeated id counts once, wherever the repeat claims to be).
        aggregates = hits.select("aggregate_id").unionByName(
            events.join(hits.select("event_id").distinct(), "event_id", "left_semi").select("aggregate_id")).distinct()
        subset = events.join(aggregates, "aggregate_id", "left_semi")
        admission = admit_archived(spark, subset)
        try:
            mine = admission.admitted.filter(in_range).persist(StorageLevel.MEMORY_AND_DISK)
            admission.cached.append(mine)
            folded_events = mine.count()
            step(2, f"{admission.events:,} archived event(s) of the range's aggregates -> {folded_events:,} "
                    f"{'/'.join(model.event_types)} in the range admitted ({admission.held:,} held after a gap, "
                    f"{admission.conflicts:,} version conflict(s))")

            # 3. The range's rows as the log has them, against the table's.
            # Personal values unsealed for the fold (null once forgotten), as the live projection folds them.
            clear = with_reference(unsealed(mine, Unsealer(settings)), model, ReferenceTables(settings))
            rows = insert_rows(model, model.fold(clear)).persist(StorageLevel.MEMORY_AND_DISK)
            admission.cached.append(rows)
            window_filter = f"window_start >= {_sql_time(t1)} AND window_start < {_sql_time(t2)}"
            current = spark.read.format("delta").load(table_path).filter(window_filter).select(*rows.columns)
            outcome = ReprocessOutcome(name, generation.number, t1, t2, position, watermark, windows=rows.count())
            outcome.windows_changed = _changed_windows(rows, current, model.key)
            step(3, f"{outcome.windows:,} window(s) in the range from the fold; {outcome.windows_changed:,} differ from "
                    f"the table's")

            # 4. One commit replaces the range (none when nothing differs).
            if outcome.windows_changed:
                metadata = {"reprocess": {"read_model": name, "from": _iso(t1), "to": _iso(t2), "by": by or "reprocess",
                                          "position": {str(p): o for p, o in sorted(position.items())},
                                          "watermark": _iso(watermark)}}
                outcome.table_version = _replace_range(spark, rows, table_path, window_filter, metadata, log)
                step(4, f"replaced windows {_iso(t1)} .. {_iso(t2)} of {table_path} in one commit (Delta version "
                        f"{outcome.table_version})")
            else:
                step(4, "the table's windows already equal the fold: nothing to replace")

            # 5. The late events folded in are marked.
            outcome.late_folded, outcome.late_already = _mark_late(spark, model, generation, mine, t1, t2, by)
            step(5, f"{outcome.late_folded:,} late event(s) in the range marked {REPROCESSED_AT} in "
                    f"{generation.late_events} ({outcome.late_already:,} marked before)")
        finally:
            admission.release()
        outcome.seconds = time.monotonic() - started
        log(outcome.line())
    except BaseException as e:
        lineage.fail(run, e)
        raise
    lineage.complete(run)
    return outcome


def reprocess_run(settings: Settings, name: str) -> LineageRun:
    """The OpenLineage run a reprocess of ``name`` will start (``Lineage.planned``: job ``reprocess.<name>``)."""
    return Lineage.for_settings(settings).planned(f"reprocess.{name}")


def _changed_windows(rows, current, key: tuple[str, ...]) -> int:
    """Windows (keys) that are added, removed or have another row."""
    new_keys = rows.exceptAll(current).select(*key)
    old_keys = current.exceptAll(rows).select(*key)
    return new_keys.unionByName(old_keys).distinct().count()


def _replace_range(spark, rows, table_path: str, window_filter: str, metadata: dict,
                   log: Callable[[str], None]) -> int:
    """``rows`` replace the table's rows matching ``window_filter``: one commit; a commit that loses a race with
    the live projection's (a Delta concurrent-modification conflict) is tried again. -> the version committed."""
    from delta.tables import DeltaTable

    for attempt in range(1, _RETRIES + 1):
        try:
            (rows.write.format("delta").mode("overwrite").option("replaceWhere", window_filter)
             .option("userMetadata", json.dumps(metadata)).save(table_path))
            break
        except Exception as e:  # noqa: BLE001 -- Delta's Concurrent*Exception through py4j
            if "Concurrent" not in type(e).__name__ + str(e)[:2000] or attempt == _RETRIES:
                raise
            log(f"reprocess: the commit met a concurrent write to {table_path} ({str(e).splitlines()[0][:160]}); "
                f"trying again ({attempt}/{_RETRIES})")
    # Read through Spark, which reaches the table wherever it is (a URI needs no delta-rs storage options here).
    return int(DeltaTable.forPath(spark, table_path).history(1).select("version").first()[0])


def _mark_late(spark, model: ReadModel, generation, mine, t1: dt.datetime, t2: dt.datetime, by: str) \
        -> tuple[int, int]:
    """Set ``reprocessed_at`` on the model's late events in the range that are among the folded events ``mine``
    (late events recorded after the table's position are not: they are in no window yet). -> (newly marked,
    marked before). One MERGE, none when nothing is to be marked."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    path = str(generation.late_events)
    if not (generation.late_events / "_delta_log").is_dir():
        return 0, 0
    late = spark.read.format("delta").load(path)
    late = late.filter((F.col("read_model") == model.name) & (F.col("event_time") >= F.lit(t1))
                       & (F.col("event_time") < F.lit(t2)))
    has_column = REPROCESSED_AT in late.columns
    marked = F.col(REPROCESSED_AT).isNotNull() if has_column else F.lit(False)
    folded = late.join(mine.select("event_id").distinct(), "event_id", "left_semi")
    counts = {r["_marked"]: r["count"] for r in folded.groupBy(marked.alias("_marked")).count().collect()}
    to_mark, already = counts.get(False, 0), counts.get(True, 0)
    if not to_mark:
        return 0, already
    if not has_column:
        # Once per late-events table. The live projection appends with mergeSchema, so its rows (without the
        # column) get null: not folded yet.
        spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({REPROCESSED_AT} TIMESTAMP)")
    conf = spark.conf
    conf.set("spark.databricks.delta.commitInfo.userMetadata", json.dumps(
        {"reprocess": {"read_model": model.name, "from": _iso(t1), "to": _iso(t2), "by": by or "reprocess"}}))
    try:
        ids = mine.select("event_id").distinct()
        (DeltaTable.forPath(spark, path).alias("t").merge(
            ids.alias("s"), f"t.event_id = s.event_id AND t.read_model = '{model.name}' AND "
                            f"t.{REPROCESSED_AT} IS NULL AND t.event_time >= {_sql_time(t1)} AND "
                            f"t.event_time < {_sql_time(t2)}")
         .whenMatchedUpdate(set={REPROCESSED_AT: F.current_timestamp()}).execute())
    finally:
        conf.unset("spark.databricks.delta.commitInfo.userMetadata")
    return to_mark, already


def reprocess_closed(spark, settings: Settings, name: str, start: dt.datetime, end: dt.datetime, by: str = "",
                     log: Callable[[str], None] = print) -> dt.datetime:
    """``reprocess`` of the closed part of windows ``start`` .. ``end`` (what ``reference_data.backfill`` asks for):
    -> the end of what was reprocessed (``start``: nothing, every window still open, or refused: said in a log
    line)."""
    from read_models.catalog import Catalog

    model, t1, t2 = validate(name, start, end)
    generation = Catalog(settings).current(name)
    if not (generation.table / "_delta_log").is_dir():
        return t1
    watermark = table_watermark(spark, model, str(generation.table))
    closed_end = t1 if watermark is None else min(t2, max(t1, watermark.replace(second=0, microsecond=0)))
    if closed_end <= t1:
        return t1
    try:
        reprocess(spark, settings, name, t1, closed_end, by=by, log=log)
    except ReprocessRefused as e:
        log(f"reprocess: {e}")
        return t1
    return closed_end
