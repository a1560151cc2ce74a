"""The catalog: which physical generation of each read model is current, kept as a small event-sourced Delta table.

A read model is a logical name (``account_summary``); what readers and the projection use is one of its
*generations*: a physical Delta table together with its own bookkeeping (``_pending``, ``_applied``, its late
events) and its own checkpoint. The catalog table ``warehouse/_catalog`` holds one row per change (written and
read with delta-rs: no JVM, so the CLI and Airflow tasks answer fast):

=============  ===================================================================================================
``seq``        the catalog's change number (1, 2, 3 ...): the order of the changes
``name``       the read model
``generation`` the generation the row is about (1, 2, ...)
``action``     ``created`` (paths reserved), ``positioned`` (the log position it is complete up to is recorded),
               ``ready`` (a rebuild about to switch: the live projection writes it too from its next batch),
               ``abandoned`` (a rebuild that did not switch: no longer written), ``switched`` (it becomes
               current), ``dropped`` (maintenance deleted it)
``paths``      JSON: ``table``, ``pending``, ``applied``, ``late_events`` relative to the warehouse, ``checkpoint``
               relative to the checkpoints folder, ``late_events_shared``
``position``   JSON ``{partition: end offset}`` or null: the Kafka offsets the generation is complete up to
``previous``   for ``switched``: the generation that was current (the compare-and-set's expected value)
``at``         UTC, microseconds; ``by``, ``reason``: who changed it and why
=============  ===================================================================================================

The state of a name is the fold of its rows: its current generation is the target of the last ``switched`` row.
The live projection writes the current generation and the *followed* ones (``ModelState.followed``): a generation
marked ``ready`` by a rebuild (so nothing the live projection applies between the rebuild's last catch-up and
its switch is missing from it), and the rollback target (so a rollback is one commit to a complete table; the
price is a second write of that model per batch until maintenance drops the older generation).

**Atomic and serial.** Each change is one appended commit. Every commit also carries a Delta application
transaction (``txn``, app id ``eventlake-catalog``), and delta-rs refuses a commit when another commit with that
app id landed after the snapshot it was built on ("concurrent transaction"). So catalog changes are serialised:
each is checked (e.g. "is the current generation still the expected one?") against the state it commits on top
of; a writer that loses a race re-reads and checks again, and a switch whose expectation no longer holds is
refused. This relies only on Delta's atomic commit files (put-if-absent), so it holds across processes and hosts.

**Back-compat.** A name without rows is at generation 1, the layout that existed before generations:
``warehouse/<name>``, ``warehouse/_pending/<name>``, ``warehouse/_applied/<name>``, the shared
``warehouse/late_events`` (its rows with ``read_model = <name>``) and the live projection's checkpoint. It is
registered (a ``created`` row) on the first change of that name, in the same commit; readers never write.

API: ``Catalog(settings)``; ``.current(name)``, ``.current_all()``, ``.generation(name, n)``, ``.generations(name)``,
``.history(name)``; ``.create_next(name, by, reason)``, ``.record_position(name, n, position, by)``,
``.switch(name, n, expected_current, by, reason)``, ``.rollback(name, by, reason)``, ``.drop(name, n, by, reason)``.
Non-model tables (the archive, the dead letters, a projection's sequence ledger and held events, the catalog
itself) stay at ``settings.table_path(name)``; their names are here too (``ARCHIVE_TABLE``, ``DEAD_LETTER_TABLE``,
``ledger_table``, ``held_table``, ``SHARED_LATE_EVENTS_TABLE``), so that every table's identity has one owner.

It lives in ``read_models`` rather than in the bottom layer (``lakehouse``) because it knows the read models: the
registry's names (the names it accepts, the live projection's checkpoint) and each model's merge strategy (which
ones have late events). Everything that uses it (``spark_apps``, ``expectations``, ``eventlake``) is above it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Mapping

import read_models
from lakehouse.settings import Settings
from lakehouse.storage import Location, delta_table, remove_tree, storage_options, tree_bytes
from lakehouse.errors import NotFound, Refused
from read_models.enrichment import MERCHANT_TABLE

__all__ = ["Catalog", "CatalogError", "CatalogEntry", "CatalogRefused", "Generation", "ModelState",
           "CATALOG_TABLE", "GENERATIONS_FOLDER", "SHARED_LATE_EVENTS_TABLE", "late_events_sources",
           "legacy_generation", "ARCHIVE_TABLE", "DEAD_LETTER_TABLE", "REPROCESSED_AT", "ledger_table", "held_table",
           "heads_table", "DIM_MERCHANT_TABLE", "MERCHANT_LOADS_TABLE", "MERCHANT_STAGING", "MERCHANT_QUARANTINE"]

CATALOG_TABLE = "_catalog"
GENERATIONS_FOLDER = "_generations"
# The late events of every generation-1 windowed model, told apart by ``read_model`` (the layout before generations).
SHARED_LATE_EVENTS_TABLE = "late_events"
# A late-events row folded back in by ``eventlake reprocess`` carries the time it was, in this column.
REPROCESSED_AT = "reprocessed_at"
# Every valid event with its topic/partition/offset: read models can be rebuilt from it after Kafka
# retention has removed old segments.
ARCHIVE_TABLE = "event_archive"
# The events records that are no valid event, and the version conflicts, with the reason and the original bytes.
DEAD_LETTER_TABLE = "_dead_letters/events"
# Reference data (reference_data/, issue 46), at ``settings.table_path(name)`` like the other non-model tables:
# the merchants dimension, kept as SCD type 2 history (one row per merchant and attribute version) ...
DIM_MERCHANT_TABLE = MERCHANT_TABLE  # "dim_merchant": the name the read models' as-of join reads (enrichment)
# ... the ledger of its loads (one row per load, keyed by the content hash of what was loaded) ...
MERCHANT_LOADS_TABLE = "_reference/merchants/loads"
# ... the folder of staged batches (one Delta table per load, removed once merged) ...
MERCHANT_STAGING = "_reference/merchants/staging"
# ... and of refused batches (per load: its report, and the staged rows when there were any).
MERCHANT_QUARANTINE = "_quarantine/merchants"
_TXN_APP_ID = "eventlake-catalog"
_ACTIONS = ("created", "positioned", "ready", "abandoned", "switched", "dropped")
_RETRIES = 8


def ledger_table(projection: str) -> str:
    """The sequence ledger of ``projection`` (the query's name): each aggregate's versions admitted so far."""
    return f"_sequence/{projection}"


def held_table(projection: str) -> str:
    """The events ``projection`` holds back until the versions before them arrive."""
    return f"_sequence_held/{projection}"


def heads_table(projection: str) -> str:
    """The sequence gate's heads of ``projection``: per aggregate, its last admitted version and that event's id
    (what a batch is judged against), and the ledger version they reflect."""
    return f"_sequence_heads/{projection}"


class CatalogError(NotFound, RuntimeError):
    """The catalog cannot be read or written (an unknown read model, a generation that does not exist, ...)."""


class CatalogRefused(Refused, CatalogError):
    """A change the catalog refuses: a stale switch, a rollback with nothing to go back to, dropping the current
    generation. The message says why and what is current."""


@dataclass(frozen=True)
class Generation:
    """One physical generation of a read model: where its table, bookkeeping and checkpoint are."""
    name: str
    number: int
    table: Location
    pending: Location        # CURRENT_STATE_BY_VERSION models: events waiting for an earlier version
    applied: Location        # WINDOWED_SUM models: the ledger of applied event ids
    late_events: Location    # WINDOWED_SUM models: events later than the watermark
    late_events_shared: bool  # True: ``late_events`` is the shared table; this model's rows have read_model = name
    checkpoint: Location     # the checkpoint of the projection that builds it (generation 1: the live projection's)
    position: Mapping[int, int] | None = None  # partition -> end offset it is complete up to (None: not recorded)
    created_at: datetime | None = None
    created_by: str = ""
    reason: str = ""

    @property
    def label(self) -> str:
        return f"g{self.number:04d}"

    def paths(self) -> dict[str, Location]:
        return {"table": self.table, "pending": self.pending, "applied": self.applied,
                "late_events": self.late_events, "checkpoint": self.checkpoint}


@dataclass(frozen=True)
class CatalogEntry:
    """One row of the catalog: one change."""
    seq: int
    name: str
    generation: int
    action: str
    paths: dict
    position: dict | None
    previous: int | None
    at: datetime
    by: str
    reason: str


@dataclass(frozen=True)
class ModelState:
    """The fold of one name's rows."""
    name: str
    current: int
    generations: dict[int, Generation]   # every generation ever created (generation 1 always)
    dropped: frozenset[int]
    served: frozenset[int]               # generations that have been current (generation 1 always)
    switched: CatalogEntry | None        # the row that made ``current`` current (None: generation 1 by default)
    entries: tuple[CatalogEntry, ...] = field(default=())
    ready: frozenset[int] = frozenset()  # marked ready by a rebuild, not yet switched to nor abandoned

    @property
    def followed(self) -> tuple[int, ...]:
        """The generations the live projection writes besides the current one: the ready ones and the rollback
        target (see the module's docstring)."""
        extra = set(self.ready) - {self.current} - set(self.dropped)
        target = self.rollback_target()
        if target is not None:
            extra.add(target)
        return tuple(sorted(extra))

    @property
    def unfinished(self) -> tuple[int, ...]:
        """Generations newer than every served one that were never switched to, abandoned nor dropped: what a
        rebuild that stopped part-way (kill -9) left."""
        return tuple(n for n in sorted(self.generations)
                     if n > max(self.served) and n not in self.dropped and n not in self.abandoned)

    @property
    def abandoned(self) -> frozenset[int]:
        return frozenset(e.generation for e in self.entries if e.action == "abandoned")

    def rollback_target(self) -> int | None:
        """The newest generation older than the current one that has served readers and is not dropped."""
        earlier = [n for n in self.served if n < self.current and n not in self.dropped]
        return max(earlier) if earlier else None


def legacy_generation(settings: Settings, name: str) -> Generation:
    """Generation 1 of ``name``: the layout from before generations (no I/O)."""
    live = "projection-" + "+".join(read_models.REGISTRY)  # the default projection's checkpoint
    return Generation(name, 1, settings.warehouse / name, settings.warehouse / "_pending" / name,
                      settings.warehouse / "_applied" / name, settings.warehouse / SHARED_LATE_EVENTS_TABLE, True,
                      settings.checkpoints / live)


def _relative_paths(generation: Generation, settings: Settings) -> dict:
    out = {k: str(p.relative_to(settings.warehouse)) for k, p in generation.paths().items() if k != "checkpoint"}
    out["checkpoint"] = str(generation.checkpoint.relative_to(settings.checkpoints))
    out["late_events_shared"] = generation.late_events_shared
    return out


def _generation_from(settings: Settings, entry: CatalogEntry) -> Generation:
    p = entry.paths
    w = settings.warehouse
    return Generation(entry.name, entry.generation, w / p["table"], w / p["pending"], w / p["applied"],
                      w / p["late_events"], bool(p.get("late_events_shared")), settings.checkpoints / p["checkpoint"],
                      None, entry.at, entry.by, entry.reason)


def fold(settings: Settings, name: str, entries: Iterable[CatalogEntry]) -> ModelState:
    """A name's state from its rows in ``seq`` order (pure; rows that break a rule are skipped, though the
    serialised writes never commit such rows)."""
    import dataclasses

    generations = {1: legacy_generation(settings, name)}
    current, dropped, served, switched, mine, ready = 1, set(), {1}, None, [], set()
    for e in entries:
        if e.name != name:
            continue
        mine.append(e)
        n = e.generation
        if e.action == "created":
            if n == 1:  # the registration of the old layout keeps the row's time, by and reason
                generations[1] = dataclasses.replace(generations[1], created_at=e.at, created_by=e.by, reason=e.reason)
            elif n not in generations:
                generations[n] = dataclasses.replace(_generation_from(settings, e), position=e.position)
        elif e.action == "positioned" and n in generations:
            generations[n] = dataclasses.replace(generations[n], position=e.position)
        elif e.action == "ready" and n in generations and n not in dropped:
            ready.add(n)
        elif e.action == "abandoned":
            ready.discard(n)
        elif e.action == "switched" and n in generations and n not in dropped:
            current, switched = n, e
            served.add(n)
            ready.discard(n)
        elif e.action == "dropped" and n in generations and n != current:
            dropped.add(n)
            ready.discard(n)
    return ModelState(name, current, generations, frozenset(dropped), frozenset(served), switched, tuple(mine),
                      frozenset(ready))


def _positions(value) -> dict[int, int] | None:
    return None if value is None else {int(p): int(o) for p, o in value.items()}


class Catalog:
    """Reads and changes the catalog at ``settings.table_path("_catalog")``. Reads are cached by the catalog
    table's Delta version (one small log read per call when nothing changed)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.path = settings.table_path(CATALOG_TABLE)
        self._table = None
        self._cached: tuple[int, tuple[CatalogEntry, ...]] | None = None

    # -- reading ------------------------------------------------------------------------------------------------
    def _exists(self) -> bool:
        return (self.path / "_delta_log").is_dir()

    def _snapshot(self, fresh: bool = False):
        """(DeltaTable or None, rows in seq order) as of the newest catalog version."""
        from lakehouse.tables import read_table

        if not self._exists():
            return None, ()
        if self._table is None or fresh:
            self._table = delta_table(self.path)
        else:
            self._table.update_incremental()
        version = self._table.version()
        if self._cached is None or self._cached[0] != version or fresh:
            rows = read_table(self._table).to_pylist()
            entries = [CatalogEntry(r["seq"], r["name"], r["generation"], r["action"], json.loads(r["paths"]),
                                    _positions(json.loads(r["position"])) if r["position"] else None,
                                    r["previous"], r["at"].replace(tzinfo=timezone.utc) if r["at"].tzinfo is None
                                    else r["at"], r["by"] or "", r["reason"] or "")
                       for r in rows]
            entries.sort(key=lambda e: (e.seq, e.generation, _ACTIONS.index(e.action)))
            self._cached = (version, tuple(entries))
        return self._table, self._cached[1]

    def history(self, name: str | None = None) -> list[CatalogEntry]:
        """Every change (of ``name``), oldest first."""
        _, entries = self._snapshot()
        return [e for e in entries if name is None or e.name == name]

    def state(self, name: str) -> ModelState:
        _check_name(name)
        return fold(self.settings, name, self._snapshot()[1])

    def states(self, names: Iterable[str] | None = None) -> dict[str, ModelState]:
        """Every read model's state from one read of the catalog (consistent with each other)."""
        names = list(read_models.REGISTRY) if names is None else list(names)
        for name in names:
            _check_name(name)
        entries = self._snapshot()[1]
        return {name: fold(self.settings, name, entries) for name in names}

    def current(self, name: str) -> Generation:
        """The generation readers and the live projection use now."""
        state = self.state(name)
        return state.generations[state.current]

    def current_all(self, names: Iterable[str] | None = None, as_of: datetime | None = None) \
            -> dict[str, Generation]:
        """name -> current generation for every read model (or ``names``), from one read of the catalog; with
        ``as_of`` (aware UTC): the generation that was current then (the changes made up to that time)."""
        if as_of is None:
            return {name: s.generations[s.current] for name, s in self.states(names).items()}
        names = list(read_models.REGISTRY) if names is None else list(names)
        entries = [e for e in self._snapshot()[1] if e.at <= as_of]
        states = {name: fold(self.settings, name, entries) for name in names}
        return {name: s.generations[s.current] for name, s in states.items()}

    def generation(self, name: str, number: int) -> Generation:
        state = self.state(name)
        if number not in state.generations:
            raise CatalogError(f"read model {name} has no generation {number} (it has "
                               f"{', '.join(map(str, sorted(state.generations)))})")
        return state.generations[number]

    def generations(self, name: str) -> list[Generation]:
        """Every generation of ``name`` that is not dropped, oldest first."""
        state = self.state(name)
        return [g for n, g in sorted(state.generations.items()) if n not in state.dropped]

    # -- changing -----------------------------------------------------------------------------------------------
    def create_next(self, name: str, by: str, reason: str, position: Mapping[int, int] | None = None) -> Generation:
        """Reserve the next generation of ``name`` (its folders under ``warehouse/_generations/<name>/gNNNN`` and
        ``checkpoints/_generations/<name>/gNNNN``; the tables are created by whoever writes them). It does not
        serve readers until ``switch``."""
        def plan(state: ModelState):
            number = max(state.generations) + 1
            folder = Path(GENERATIONS_FOLDER) / name / f"g{number:04d}"
            w = self.settings.warehouse
            generation = Generation(name, number, w / folder / "table", w / folder / "_pending",
                                    w / folder / "_applied", w / folder / "late_events", False,
                                    self.settings.checkpoints / folder)
            return [self._row(name, number, "created", paths=_relative_paths(generation, self.settings),
                              position=position, by=by, reason=reason)]

        state = self._change(name, plan)
        created = state.generations[max(state.generations)]
        created.checkpoint.mkdir(parents=True, exist_ok=True)
        created.table.parent.mkdir(parents=True, exist_ok=True)
        return created

    def record_position(self, name: str, number: int, position: Mapping[int, int], by: str,
                        reason: str = "complete up to this log position") -> Generation:
        """Record the Kafka offsets (partition -> end offset) generation ``number`` is complete up to."""
        def plan(state: ModelState):
            self._require(state, number)
            return [self._row(name, number, "positioned", position=position, by=by, reason=reason)]

        return self._change(name, plan).generations[number]

    def mark_ready(self, name: str, number: int, by: str, reason: str = "caught up; about to be checked and switched to") \
            -> Generation:
        """From the live projection's next batch on, it writes generation ``number`` too (``followed``)."""
        def plan(state: ModelState):
            self._require(state, number)
            return [] if number in state.ready else [self._row(name, number, "ready", by=by, reason=reason)]

        return self._change(name, plan).generations[number]

    def abandon(self, name: str, number: int, by: str, reason: str) -> Generation:
        """A generation a rebuild will not switch to (a failed check, a dry run, a killed rebuild's leftover):
        no longer followed; ``drop`` deletes its files."""
        def plan(state: ModelState):
            self._require(state, number, allow_dropped=True)
            if number == state.current or number in state.served:
                raise CatalogRefused(f"{name}: generation {number} has served readers; it is not abandoned")
            return [self._row(name, number, "abandoned", by=by, reason=reason)]

        return self._change(name, plan).generations[number]

    def switch(self, name: str, number: int, expected_current: int, by: str, reason: str) -> Generation:
        """Make generation ``number`` current, only if ``expected_current`` still is (compare-and-set: refused
        with CatalogRefused otherwise, e.g. when another switch or rollback came first)."""
        def plan(state: ModelState):
            self._require(state, number)
            if state.current != expected_current:
                raise CatalogRefused(f"{name}: not switched to generation {number}: the current generation is "
                                     f"{state.current}, not {expected_current} as expected "
                                     f"({_changed_by(state)}); check it again and retry")
            if number == state.current:
                raise CatalogRefused(f"{name}: generation {number} is already current")
            return [self._row(name, number, "switched", previous=state.current, by=by, reason=reason)]

        state = self._change(name, plan)
        return state.generations[state.current]

    def rollback(self, name: str, by: str, reason: str = "") -> Generation:
        """Switch ``name`` back to the newest earlier generation that served readers and is not dropped."""
        def plan(state: ModelState):
            target = state.rollback_target()
            if target is None:
                raise CatalogRefused(f"{name}: cannot roll back: generation {state.current} is current and no earlier "
                                     f"generation is left to go back to"
                                     + (f" (dropped: {', '.join(map(str, sorted(state.dropped)))})"
                                        if state.dropped else ""))
            return [self._row(name, target, "switched", previous=state.current, by=by,
                              reason=reason or f"rollback from generation {state.current}")]

        state = self._change(name, plan)
        return state.generations[state.current]

    def drop(self, name: str, number: int, by: str, reason: str = "maintenance",
             delete_files: bool = True, freed: list[int] | None = None) -> Generation:
        """Mark generation ``number`` dropped and delete its files (never the current generation; dropping one
        already dropped only deletes what is left of its files). Generation 1's checkpoint is the live
        projection's and is never deleted; its late events are deleted from the shared table. The bytes of the
        folders deleted are appended to ``freed`` when given (rows deleted from the shared table are not counted:
        their files go at that table's next VACUUM)."""
        state = self.state(name)
        self._require(state, number, allow_dropped=True)
        if number not in state.dropped:
            def plan(state: ModelState):
                self._require(state, number, allow_dropped=True)
                if number == state.current:
                    raise CatalogRefused(f"{name}: generation {number} is current; switch to another one before "
                                         f"dropping it")
                return [] if number in state.dropped else [self._row(name, number, "dropped", by=by, reason=reason)]

            state = self._change(name, plan)
        generation = state.generations[number]
        if delete_files:
            deleted = _delete_files(generation, self.settings)
            if freed is not None:
                freed.append(deleted)
        return generation

    # -- internals ----------------------------------------------------------------------------------------------
    @staticmethod
    def _require(state: ModelState, number: int, allow_dropped: bool = False) -> None:
        if number not in state.generations:
            raise CatalogRefused(f"{state.name}: there is no generation {number} (generations: "
                                 f"{', '.join(map(str, sorted(state.generations)))})")
        if number in state.dropped and not allow_dropped:
            raise CatalogRefused(f"{state.name}: generation {number} was dropped")

    def _row(self, name: str, number: int, action: str, paths: dict | None = None, position=None,
             previous: int | None = None, by: str = "", reason: str = "") -> dict:
        return {"name": name, "generation": number, "action": action, "paths": json.dumps(paths or {}),
                "position": None if position is None else json.dumps({str(p): int(o) for p, o in position.items()}),
                "previous": previous, "at": datetime.now(timezone.utc), "by": by, "reason": reason}

    def _change(self, name: str, plan) -> ModelState:
        """Commit the rows ``plan(state)`` returns on top of the newest catalog version, as one Delta commit that
        fails if any other catalog commit landed since that version; then re-read and re-plan. Returns the state
        after the commit."""
        import pyarrow as pa
        from deltalake import write_deltalake
        from deltalake.exceptions import CommitFailedError, DeltaError
        from deltalake.transaction import CommitProperties, Transaction

        _check_name(name)
        for _ in range(_RETRIES):
            table, entries = self._snapshot(fresh=True)
            state = fold(self.settings, name, entries)
            rows = plan(state)
            if not rows:
                return state
            if not state.entries and rows[0]["generation"] != 1:  # first change of this name: register generation 1
                legacy = legacy_generation(self.settings, name)
                rows.insert(0, self._row(name, 1, "created", paths=_relative_paths(legacy, self.settings),
                                         by=rows[0]["by"], reason="the layout from before generations, registered"))
            seq = max((e.seq for e in entries), default=0) + 1
            batch = pa.Table.from_pylist([{"seq": seq, **r} for r in rows], schema=_SCHEMA())
            try:
                write_deltalake(table if table is not None else str(self.path), batch, mode="append",
                                storage_options=None if table is not None else storage_options(self.path),
                                commit_properties=CommitProperties(
                                    app_transactions=[Transaction(_TXN_APP_ID, seq)],
                                    custom_metadata={"catalog": json.dumps([[r["name"], r["generation"], r["action"]]
                                                                            for r in rows])}))
            except CommitFailedError:
                continue  # another catalog change landed first: check again against it
            except DeltaError:
                if table is None:  # two writers created the catalog at once: the other one won
                    continue
                raise
            return fold(self.settings, name, self._snapshot(fresh=True)[1])
        raise CatalogError(f"{name}: the catalog at {self.path} kept changing under this write ({_RETRIES} tries); "
                           f"try again")


def _SCHEMA():
    import pyarrow as pa

    return pa.schema([("seq", pa.int64()), ("name", pa.string()), ("generation", pa.int64()),
                      ("action", pa.string()), ("paths", pa.string()), ("position", pa.string()),
                      ("previous", pa.int64()), ("at", pa.timestamp("us", tz="UTC")), ("by", pa.string()),
                      ("reason", pa.string())])


def _check_name(name: str) -> None:
    if name not in read_models.REGISTRY:
        raise CatalogError(f"unknown read model {name!r}; read models: {', '.join(read_models.REGISTRY)}")


def _changed_by(state: ModelState) -> str:
    s = state.switched
    if s is None:
        return "generation 1 has been current from the start"
    return f"switched {s.at:%Y-%m-%d %H:%M:%S}Z by {s.by or '?'}: {s.reason or 'no reason given'}"


def _delete_files(generation: Generation, settings: Settings) -> int:
    """Delete a dropped generation's tables (and, for a generation of its own, its checkpoint). -> the bytes of the
    folders deleted."""
    folders = [generation.table, generation.pending, generation.applied]
    if generation.late_events_shared:
        if (generation.late_events / "_delta_log").is_dir():
            delta_table(generation.late_events).delete(f"read_model = '{generation.name}'")
    else:
        folders.append(generation.late_events)
    generations_root = settings.checkpoints / GENERATIONS_FOLDER
    if generations_root in generation.checkpoint.parents:
        folders.append(generation.checkpoint)
    freed = 0
    for path in folders:
        freed += tree_bytes(path)
        remove_tree(path)
    folder = generation.table.parent
    if settings.warehouse / GENERATIONS_FOLDER in folder.parents and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
    return freed


def late_events_sources(generations: Mapping[str, Generation]) -> list[tuple[Location, list[str]]]:
    """Where the late events of the given (current) generations are: (late-events table, the read_model values to
    keep from it), one entry per table that exists. The logical ``late_events`` readers see is their union."""
    from read_models.spec import WINDOWED_SUM

    sources: dict[Location, list[str]] = {}
    for name, generation in generations.items():
        if read_models.get(name).merge_strategy != WINDOWED_SUM:
            continue
        if (generation.late_events / "_delta_log").is_dir():
            sources.setdefault(generation.late_events, []).append(name)
    return list(sources.items())
