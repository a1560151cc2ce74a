"""``eventlake backfill``: the read-model rows that join reference data, brought in line with what the reference
data knows now (issue 46 part 2).

A fold joins ``dim_merchant`` as of each event's time (``read_models.enrichment``), with the dimension as the
projection read it. A payment projected before its merchant was loaded holds null attributes, where a rebuild
now gives it the merchant's first version; an event folded before a load whose versions start earlier than the
event holds the version that was current then. The reconciliation's oracle joins the dimension as it is now, so
those rows differ from it until the backfill, which the ``backfill_reference`` DAG runs after every load:

1. per insert-once model that joins a reference table (``payments``, the ledger of the events: one row each), its
   rows whose joined columns differ from the join with the dimension now (DuckDB over the table's files: the
   key, the merchant, the time and those columns only);
2. per windowed model that joins one (``category_minute_volume``), the minutes of those rows, recomputed from the
   archive with the dimension now and replaced where different (``eventlake reprocess``, through the
   ``reprocess`` callable: the caller's Spark session). Only closed minutes can be: the rows of a minute still
   open stay as they are (step 3 skips them), so the next run, after the watermark passed it, finds them again;
3. the ledger's rows: one MERGE setting the joined columns, retried when the projection commits first.

What a run reads does not grow with the log: a run records, per ledger table, the table's Delta version it checked,
the reference tables' versions it joined and the merchants of the rows it left waiting
(``<home>/backfill/<model>.json``). The next run reads only the rows of the data files added since that version (new
batches, compactions), and of the older files only the rows of those merchants and of merchants whose dimension rows
changed since (pyarrow skips a file or row group whose ``merchant_id`` statistics exclude them). Without a record (a
first run, a new generation), or where a recorded version can no longer be read, it reads the whole table and says
so.

A second run finds nothing to do. The current generation of each model is backfilled (a rebuild's new one is
built with the dimension of its time; run the backfill after it switches). ``dry_run`` counts and writes nothing.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Callable

import read_models
from lakehouse.errors import Refused
from lakehouse.lineage import Lineage, table
from lakehouse.settings import Settings
from lakehouse.storage import delta_table
from projection_core.reference import ReferenceTables
from read_models.catalog import ARCHIVE_TABLE, Catalog
from read_models.enrichment import MERCHANT_COLUMNS, enriched_sql
from read_models.spec import INSERT_ONCE, WINDOWED_SUM, ReadModel

__all__ = ["Backfill", "BackfillConflict", "Checked", "Scope", "backfill", "stale_rows", "scope_since", "ranges"]

MERGE_ATTEMPTS = 5
WINDOW = dt.timedelta(minutes=1)
# Reprocess callable: (model name, first window start, end) -> the end of what it reprocessed (the start itself:
# nothing, every window open).
Reprocess = Callable[[str, dt.datetime, dt.datetime], dt.datetime]


class BackfillConflict(Refused, RuntimeError):
    """The table kept changing under the backfill's MERGE (the projection committing each time): run it again."""


@dataclass
class Backfill:
    """What a backfill found and did, per model (its lines name each)."""
    dry_run: bool = False
    stale: dict[str, int] = field(default_factory=dict)       # ledger model -> rows that differed
    updated: dict[str, int] = field(default_factory=dict)     # ledger model -> rows set
    windows: dict[str, int] = field(default_factory=dict)     # windowed model -> minutes reprocessed
    waiting: dict[str, int] = field(default_factory=dict)     # ledger model -> rows left for a later run
    versions: dict[str, int | None] = field(default_factory=dict)  # reference table -> the version joined

    @property
    def complete(self) -> bool:
        return not any(self.waiting.values())

    def lines(self) -> list[str]:
        joined = ", ".join(f"{name} version {v}" if v is not None else f"{name} (no table yet)"
                           for name, v in self.versions.items())
        out = [f"backfill{' (dry run)' if self.dry_run else ''}: joined with {joined or 'no reference table'}"]
        for name, n in self.stale.items():
            done = "would be set" if self.dry_run else f"{self.updated.get(name, 0):,} set"
            wait = self.waiting.get(name, 0)
            out.append(f"  {name}: {n:,} row(s) differed from the reference data now, {done}"
                       + (f"; {wait:,} wait for their minute to close (run again later)" if wait else ""))
        for name, n in self.windows.items():
            out.append(f"  {name}: {n:,} minute(s) reprocessed from the archive")
        return out


@dataclass(frozen=True)
class Checked:
    """What a backfill checked a ledger table through: the table (its location), the table's Delta version whose
    rows it compared, the version of each reference table it compared them with, and the merchants of the rows it
    left waiting (their minute still open), which the next run compares again."""
    table: str
    version: int
    references: dict[str, int | None]
    waiting: tuple[str, ...] = ()

    @staticmethod
    def path(settings: Settings, model: str):
        return settings.home / "backfill" / f"{model}.json"

    @classmethod
    def load(cls, settings: Settings, model: str) -> "Checked | None":
        import json

        try:
            raw = json.loads(cls.path(settings, model).read_text())
            return cls(str(raw["table"]), int(raw["version"]), dict(raw["references"]),
                       tuple(raw.get("waiting", ())))
        except (OSError, ValueError, KeyError, TypeError):  # none, or damaged: the whole table is read again
            return None

    def save(self, settings: Settings, model: str) -> None:
        import json
        import os

        path = self.path(settings, model)
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".part")
        part.write_text(json.dumps({"table": self.table, "version": self.version, "references": self.references,
                                    "waiting": sorted(self.waiting)}))
        os.replace(part, path)


@dataclass(frozen=True)
class Scope:
    """The part of a ledger table a backfill compares (``scope_since``): its data files added since the recorded
    version, whole, and in its other files the rows of ``merchants``."""
    added: frozenset[str]      # data files (``DeltaTable.file_uris()``)
    older: frozenset[str]
    merchants: frozenset[str]  # merchant ids whose reference rows changed since the recorded versions, or whose
    #                            rows were left waiting

    def describe(self) -> str:
        return (f"{len(self.added):,} data file(s) added since, and {len(self.merchants):,} merchant(s) changed "
                f"since in the {len(self.older):,} other(s)")


def _changed_merchants(reference: ReferenceTables, name: str, since: int | None, now: int | None) -> set[str]:
    """The merchant ids whose rows of reference table ``name`` differ between versions ``since`` and ``now``."""
    from lakehouse.tables import read_table
    from projection_core.reference import COLUMNS

    def rows(version):
        if version is None:
            return set()
        table = read_table(delta_table(reference.settings.table_path(name), version=version),
                           columns=list(COLUMNS[name]))
        return set(zip(*(table.column(c).to_pylist() for c in COLUMNS[name])))
    return {row[0] for row in rows(since) ^ rows(now)}


def scope_since(table, model: ReadModel, reference: ReferenceTables, checked: Checked | None,
                location: str) -> tuple[Scope | None, str]:
    """What of ``table`` (the ledger table at ``location``, a ``deltalake.DeltaTable``) a backfill must compare,
    after ``checked``: (a Scope, what it holds) or (None, why the whole table)."""
    if checked is None:
        return None, "no earlier run recorded"
    if checked.table != location:
        return None, "the last run checked another table (generation)"
    now = reference.versions(model.reference_tables)
    for name in model.reference_tables:
        before, current = checked.references.get(name), now[name]
        if before is not None and (current is None or current < before):
            return None, f"{name} is older than the last run's version {before} (recreated)"
    if table.version() < checked.version:
        return None, f"the table is older than the last run's version {checked.version} (recreated)"
    try:
        then = set(delta_table(location, version=checked.version).file_uris())
        merchants = set(checked.waiting)
        for name in model.reference_tables:
            merchants |= _changed_merchants(reference, name, checked.references.get(name), now[name])
    except Exception as e:  # noqa: BLE001 -- delta-rs: a version whose log has been cleaned up
        return None, f"a recorded version can no longer be read ({str(e).splitlines()[0][:200]})"
    files = set(table.file_uris())
    scope = Scope(frozenset(files - then), frozenset(files & then), frozenset(merchants))
    return scope, scope.describe()


def _exists(path) -> bool:
    try:
        delta_table(path)
    except Exception:  # noqa: BLE001 -- delta-rs' TableNotFoundError
        return False
    return True


def _ledgers(models: list[ReadModel]) -> list[ReadModel]:
    return [m for m in models if m.reference_tables and m.merge_strategy == INSERT_ONCE]


def _windowed(models: list[ReadModel], ledger: ReadModel) -> list[ReadModel]:
    """The windowed models whose events ``ledger`` records one per row (its event types cover theirs) and that
    join its reference tables: a ledger row that changes says which of their minutes change."""
    return [m for m in models if m.merge_strategy == WINDOWED_SUM and m.reference_tables
            and set(m.event_types) <= set(ledger.event_types) and set(m.reference_tables) <= set(ledger.reference_tables)]


def stale_rows(table, model: ReadModel, reference: ReferenceTables, event_time: str = "occurred_at",
               scope: Scope | None = None):
    """The rows of ``table`` (a ``deltalake.DeltaTable`` of insert-once ``model``) whose joined columns differ from
    the join with the reference tables now: the key, ``event_time`` and the new values, as Arrow. ``scope``: only
    its part of the table (``scope_since``); None: the whole table."""
    import duckdb
    import pyarrow as pa
    import pyarrow.dataset as ds

    from lakehouse.tables import dataset

    columns = [c for c in MERCHANT_COLUMNS.values() if c in model.columns]
    present = set(table.schema().to_arrow().names)  # a table of an older release lacks them: nulls until written
    read = list(dict.fromkeys([*model.key, "merchant_id", event_time, *(c for c in columns if c in present)]))
    if scope is None:
        stored = dataset(table)
    else:
        stored = dataset(table, scope.added).to_table(columns=read)
        if scope.merchants and scope.older:
            older = dataset(table, scope.older).to_table(
                columns=read, filter=ds.field("merchant_id").isin(sorted(scope.merchants)))
            stored = pa.concat_tables([stored, older])
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("stored", stored)
        for name in model.reference_tables:
            con.register(name, reference.arrow(name))
        keys = ", ".join(dict.fromkeys([*model.key, "merchant_id", event_time]))
        old = ", ".join(f"{c if c in present else 'NULL'} AS _old_{c}" for c in columns)
        joined = enriched_sql(f"(SELECT {keys}, {old} FROM stored)", model.reference_tables)
        differs = " OR ".join(f"{c} IS DISTINCT FROM _old_{c}" for c in columns)
        picked = ", ".join(dict.fromkeys([*model.key, "merchant_id", event_time, *columns]))
        return con.sql(f"SELECT {picked} FROM ({joined}) WHERE {differs}").to_arrow_table()
    finally:
        con.close()


def ranges(minutes: list[dt.datetime], gap: dt.timedelta = dt.timedelta(minutes=10)) -> list[tuple]:
    """Sorted window starts as ranges [start, end) to reprocess: minutes closer than ``gap`` share one."""
    out: list[list] = []
    for m in sorted(set(minutes)):
        if out and m - out[-1][1] < gap:
            out[-1][1] = m + WINDOW
        else:
            out.append([m, m + WINDOW])
    return [tuple(r) for r in out]


def backfill(settings: Settings, names: list[str] | None = None, *, dry_run: bool = False,
             reprocess: Reprocess | None = None, by: str = "", log: Callable[[str], None] = print,
             lineage_run_id: str | None = None) -> Backfill:
    """Backfill the read models ``names`` (default: every one that joins reference data) of ``settings``' home
    (module docstring). ``reprocess`` recomputes a windowed model's closed minutes (needed only when a windowed
    model's minutes changed; without it those rows wait). Its OpenLineage run (job ``backfill``, not for a dry
    run): the reference tables and the archive in, the models' current tables out; ``lineage_run_id``: its id
    when planned (``Lineage.planned``: the parent of the Spark application that reprocesses)."""
    models = [m for m in read_models.select(names) if m.reference_tables]
    if names and len(models) < len(names):
        plain = sorted(set(names) - {m.name for m in models})
        raise ValueError(f"eventlake backfill: {', '.join(plain)} join(s) no reference table; the read models that "
                         f"do: {', '.join(m.name for m in read_models.select(None) if m.reference_tables)}")
    if dry_run:
        return _backfill(settings, models, dry_run, reprocess, by, log)
    catalog = Catalog(settings)
    references = sorted({t for m in models for t in m.reference_tables})
    inputs = [table(settings.table_path(n)) for n in [*references, ARCHIVE_TABLE]]
    outputs = [table(catalog.current(m.name).table) for m in models]
    with Lineage.for_settings(settings, log).running("backfill", inputs, outputs, run_id=lineage_run_id):
        return _backfill(settings, models, dry_run, reprocess, by, log)


def _backfill(settings: Settings, models: list[ReadModel], dry_run: bool, reprocess: Reprocess | None, by: str,
              log: Callable[[str], None]) -> Backfill:
    import pyarrow as pa
    import pyarrow.compute as pc

    every = read_models.select(None)
    reference = ReferenceTables(settings)
    catalog = Catalog(settings)
    result = Backfill(dry_run=dry_run, versions=reference.versions(
        sorted({t for m in models for t in m.reference_tables})))
    for ledger in _ledgers(every):
        # A windowed model without a table yet has no minute to redo (its first batch joins the dimension now).
        windowed = [m for m in _windowed(every, ledger)
                    if m in models and _exists(catalog.current(m.name).table)]
        if ledger not in models and not windowed:
            continue
        path = catalog.current(ledger.name).table
        try:
            table = delta_table(path)
        except Exception:  # noqa: BLE001 -- delta-rs' TableNotFoundError: nothing projected yet
            log(f"backfill: {ledger.name}: no table at {path} yet: nothing to backfill")
            continue
        event_time = windowed[0].event_time if windowed else "occurred_at"
        missing = [c for c in MERCHANT_COLUMNS.values() if c in ledger.columns
                   and c not in table.schema().to_arrow().names]
        if missing:
            log(f"backfill: {ledger.name}: its table has no {', '.join(missing)} yet (written by an older release); "
                f"the projection adds them with its next batch: run the backfill after it")
            continue
        location = str(path)
        checked = Checked.load(settings, ledger.name)

        def scope_now(table=table, ledger=ledger, checked=checked, location=location) -> Scope | None:
            scope, what = scope_since(table, ledger, reference, checked, location)
            log(f"backfill: {ledger.name}: comparing {what if scope else 'the whole table: ' + what} "
                f"(version {table.version()})")
            return scope

        scanned = table.version()
        stale = stale_rows(table, ledger, reference, event_time, scope_now())
        result.stale[ledger.name] = stale.num_rows
        references = {name: result.versions.get(name) for name in ledger.reference_tables}
        if dry_run:
            continue
        if not stale.num_rows:
            if ledger in models:
                Checked(location, scanned, references).save(settings, ledger.name)
            continue
        starts = [t.replace(second=0, microsecond=0) for t in stale.column(event_time).to_pylist() if t is not None]
        waiting: tuple[str, ...] = ()
        if windowed and starts:
            # The windowed models' minutes first; the ledger's rows after, only those whose minute every windowed
            # model has reprocessed (the others wait: the ledger's difference is what finds them next time).
            done_until = None
            for model in windowed:
                reached = min(starts)  # nothing reprocessed yet
                for start, end in ranges(starts) if reprocess is not None else ():
                    reached = reprocess(model.name, start, end)
                    result.windows[model.name] = result.windows.get(model.name, 0) + (reached - start) // WINDOW
                    if reached < end:  # the rest is open (past the watermark): so are the later ranges
                        break
                done_until = reached if done_until is None else min(done_until, reached)
            times = stale.column(event_time)
            ready = pc.fill_null(pc.less(times, pa.scalar(done_until, times.type)), False)
            result.waiting[ledger.name] = stale.num_rows - pc.sum(ready.cast(pa.int64())).as_py()
            waiting = tuple(set(stale.filter(pc.invert(ready)).column("merchant_id").to_pylist()) - {None})
            stale = stale.filter(ready)
        if ledger in models:
            result.updated[ledger.name], scanned = _merge(table, ledger, stale, reference, event_time, by, log,
                                                          scope_now, scanned)
            Checked(location, scanned, references, waiting).save(settings, ledger.name)
        else:
            result.waiting.pop(ledger.name, None)
    for line in result.lines():
        log(line)
    return result


def _merge(table, model: ReadModel, rows, reference: ReferenceTables, event_time: str, by: str, log,
           scope_now: Callable[[], Scope | None], scanned: int) -> tuple[int, int]:
    """Set the joined columns of ``rows`` (found on version ``scanned`` of ``table``, by key): one MERGE; when
    another writer commits first, the rows are found again on the new version (in ``scope_now()``) and the MERGE
    retried. -> (rows set, the version whose rows were compared last)."""
    from deltalake import CommitProperties
    from deltalake.exceptions import CommitFailedError

    columns = [c for c in MERCHANT_COLUMNS.values() if c in model.columns]
    on = " AND ".join(f"t.{k} = s.{k}" for k in model.key)
    keys = set(map(tuple, zip(*(rows.column(k).to_pylist() for k in model.key))))
    for attempt in range(1, MERGE_ATTEMPTS + 1):
        if not rows.num_rows:
            return 0, scanned
        try:
            metrics = (table.merge(rows, predicate=on, source_alias="s", target_alias="t",
                                   commit_properties=CommitProperties(custom_metadata={
                                       "eventlake.backfill": by or "backfill"}))
                       .when_matched_update(updates={c: f"s.{c}" for c in columns}).execute())
            # Its own commit right after the version compared (no other writer between): the files it rewrote hold
            # rows compared and set, so the next run need not read them again.
            return (int(metrics.get("num_target_rows_updated", rows.num_rows)),
                    table.version() if table.version() == scanned + 1 else scanned)
        except CommitFailedError:
            log(f"backfill: {model.name}: the projection committed first; finding the rows again "
                f"(attempt {attempt} of {MERGE_ATTEMPTS})")
            table.update_incremental()
            scanned = table.version()
            fresh = stale_rows(table, model, reference, event_time, scope_now())
            mine = [i for i, k in enumerate(zip(*(fresh.column(k).to_pylist() for k in model.key))) if k in keys]
            rows = fresh.take(mine)
    raise BackfillConflict(f"backfill: {model.name}: the table changed under each of {MERGE_ATTEMPTS} MERGEs; "
                           f"run it again")
