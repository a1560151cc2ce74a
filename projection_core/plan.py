"""The plan of a projection, whichever engine runs it: its name and checkpoints, the tables it writes, the
generations of its read models batch by batch, and the ids of its idempotent Delta writes.

A projection is two Structured Streaming queries: the read models' (checkpoint ``projection-<names>``) and the
archive's (``projection-event_archive``). Every table's identity comes from ``read_models.catalog``; an engine only
says how it creates a table of each ``TableKind`` (Spark's ``ensure_table``, delta-rs's ``DeltaTable.create``).
"""
from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Callable, Mapping

import read_models
from lakehouse.settings import Settings
from read_models.catalog import ARCHIVE_TABLE, DEAD_LETTER_TABLE, Catalog, Generation, held_table, ledger_table
from read_models.spec import ReadModel

__all__ = ["ProjectionPlan", "ARCHIVE_STATS_COLUMNS", "ARCHIVE_QUERY", "DEAD_LETTERS", "ARCHIVE", "LEDGER", "HELD",
           "GENERATIONS_FOLDER", "APP_ID_MARKER"]

# The archive's columns with statistics in its Delta log (the checks and the rebuild's fold filter on them).
ARCHIVE_STATS_COLUMNS = ("event_type", "aggregate_id", "occurred_at", "kafka_partition", "kafka_offset")
ARCHIVE_QUERY = f"projection-{ARCHIVE_TABLE}"  # the archive's query: its name and its checkpoint's folder
# The kinds of table a projection writes besides its read models' generations (their schemas are the engine's).
DEAD_LETTERS, ARCHIVE, LEDGER, HELD = "dead letters", "archive", "sequence ledger", "held events"
GENERATIONS_FOLDER = "eventlake-generations"  # in the read models' checkpoint: the generations each batch wrote
APP_ID_MARKER = "eventlake-app-id"  # in a query's checkpoint: what its Delta transaction app id derives from


class ProjectionPlan:
    """What a projection of ``models`` (all of the registry when None) is: ``archive`` (default: when no models
    are named) adds the archive's query; ``generations`` (name -> Generation) pins the generations to write (a
    rebuild's catch-up), else each batch writes the current ones and those the catalog says are followed;
    ``checkpoint`` (under the checkpoints folder: the projection's name is its path there) is the read models'
    query's checkpoint."""

    def __init__(self, settings: Settings, models: list[ReadModel] | None = None, archive: bool | None = None,
                 generations: Mapping[str, Generation] | None = None, checkpoint: Path | None = None,
                 log: Callable[[str], None] = print):
        self.settings, self.log = settings, log
        self.archive = models is None if archive is None else archive
        self.models = read_models.select(None) if models is None else models
        names = "+".join(m.name for m in self.models)
        self.name = f"projection-{names}" if checkpoint is None else str(checkpoint.relative_to(settings.checkpoints))
        self.checkpoint = settings.checkpoints / self.name
        self.archive_checkpoint = settings.checkpoints / ARCHIVE_QUERY
        self.catalog = Catalog(settings)
        self.pinned = dict(generations) if generations is not None else None
        self._written: dict[str, tuple[int, ...]] = {}  # model -> the generations the last batch wrote

    def fixed_tables(self) -> dict[str, str]:
        """The tables besides the read models' generations, by name (``settings.table_path``) -> kind."""
        tables = {DEAD_LETTER_TABLE: DEAD_LETTERS}
        if self.archive:
            tables[ARCHIVE_TABLE] = ARCHIVE
        if self.models:
            tables[ledger_table(self.name)] = LEDGER
            tables[held_table(self.name)] = HELD
        return tables

    def resolve(self) -> dict[str, list[Generation]]:
        """The generations to write, per model: the pinned one, or the current one followed by those the catalog
        says the live projection follows (a rebuild's ready generation, the rollback target). One small read."""
        if self.pinned is not None:
            return {m.name: [self.pinned.get(m.name) or self.catalog.current(m.name)] for m in self.models}
        states = self.catalog.states([m.name for m in self.models])
        return {name: [s.generations[n] for n in (s.current, *s.followed)] for name, s in states.items()}

    def units(self, generations: Mapping[str, list[Generation]]) -> list[tuple[ReadModel, Generation]]:
        """(model, generation) pairs a batch writes, the current generations first."""
        return [(m, g) for m in self.models for g in generations[m.name]]

    def generations_for_batch(self, batch_id: int) -> dict[str, list[Generation]]:
        """The generations batch ``batch_id`` writes, resolved once: a re-run of the batch (after a crash, by
        either engine) reads back what its first run resolved from the checkpoint, so it completes the same
        generations."""
        folder = self.checkpoint / GENERATIONS_FOLDER
        marker = folder / str(batch_id)
        if marker.exists():
            numbers = json.loads(marker.read_text())
            generations = {name: [self.catalog.generation(name, n) for n in (ns if isinstance(ns, list) else [ns])]
                           for name, ns in numbers.items()}
        else:
            generations = self.resolve()
            folder.mkdir(parents=True, exist_ok=True)
            partial = folder / f".{batch_id}.tmp"
            partial.write_text(json.dumps({name: [g.number for g in gs] for name, gs in generations.items()}))
            partial.replace(marker)  # atomic: a crash leaves no half-written marker
            for old in folder.iterdir():  # keep the last few
                if old.name.isdigit() and int(old.name) < batch_id - 10:
                    old.unlink(missing_ok=True)
        for name, gs in generations.items():
            numbers = tuple(g.number for g in gs)
            if self._written.get(name, numbers) != numbers:
                also = f" (and follows {', '.join(map(str, numbers[1:]))})" if len(numbers) > 1 else ""
                self.log(f"projection: batch {batch_id}: {name} now writes generation {numbers[0]}{also} "
                         f"({gs[0].table})")
            self._written[name] = numbers
        return generations

    @staticmethod
    def app_id(checkpoint: Path, name: str) -> str:
        """An id for Delta's idempotent writes, new whenever the checkpoint is new (so a replay into a
        fresh checkpoint is never mistaken for batches already written)."""
        checkpoint.mkdir(parents=True, exist_ok=True)
        marker = checkpoint / APP_ID_MARKER
        if not marker.exists():
            marker.write_text(f"{name}-{uuid.uuid4()}")
        return hashlib.sha1(marker.read_text().encode()).hexdigest()[:16]
