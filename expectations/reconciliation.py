"""Reconciliation: a read model's table against the plain-Python fold of the log it was projected from.

The log is read from the ``event_archive`` Delta table (every valid event with its Kafka partition and
offset), so this works after Kafka retention has removed old segments. Table and archive are written by two
queries that advance separately, so the comparison is made at the log position the table stands at: the
offsets at which the projection batch that last wrote it ended (its Delta commit names the projection and the
batch; the projection's checkpoint holds each batch's end offsets). Only archived events before those offsets
are folded. When the archive has not reached that position yet, the result says so instead of comparing.

The read model's own ``python_fold`` (the test oracle) is the fold; for a windowed model the table plus the
events recorded in ``late_events`` must add up to it, except the late events a reprocess has folded into their
window (``reprocessed_at`` set, spark_apps/reprocess.py): those are counted in the table. The fold runs in plain
Python: about a minute per million events.

The table is the read model's current generation (read_models/catalog.py), or the generation given (a rebuild
checks its new generation before switching). A generation no projection batch has written yet (one a rebuild
wrote whole) stands at the log position the catalog records for it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timezone

import read_models
from event_store.envelope import EventEnvelope, built, format_time
from event_store.schemas import EVENTS
from event_store.sealing import Unsealer
from lakehouse.settings import Settings
from lakehouse.storage import delta_table
from lakehouse.tables import read_rows
from projection_core import positions
from projection_core.checkpoint import batch_offsets, last_committed_batch
from projection_core.reference import ReferenceTables
from read_models.catalog import ARCHIVE_TABLE, Catalog, Generation
from read_models.enrichment import MERCHANT_COLUMNS
from read_models.sequence import sequence
from read_models.spec import WINDOWED_SUM

__all__ = ["Reconciliation", "reconcile", "table_position", "archive_end", "last_committed_batch", "batch_offsets"]


# The columns a fold takes from reference data (read_models.enrichment): a difference in one may be a backfill's.
REFERENCE_COLUMNS = frozenset(MERCHANT_COLUMNS.values())


@dataclass(frozen=True)
class Reconciliation:
    table: str
    compared: bool  # False: the archive has not reached the table's log position yet (``reason`` says why)
    position: dict[int, int]  # partition -> end offset the table stands at
    events: int = 0  # archived events folded
    rows: int = 0
    expected_rows: int = 0
    missing: tuple = ()  # keys the fold has and the table lacks (a few)
    unexpected: tuple = ()  # keys the table has and the fold lacks (a few)
    different: tuple = ()  # (key, column, table value, fold value) (a few)
    differences: int = 0  # rows missing, unexpected or different, in all
    reason: str = ""

    @property
    def success(self) -> bool:
        return self.compared and self.differences == 0

    def lines(self) -> list[str]:
        at = ", ".join(f"p{p}<{o}" for p, o in sorted(self.position.items())) or "the start"
        if not self.compared:
            return [f"{self.table}: not reconciled: {self.reason}"]
        if self.success:
            return [f"{self.table}: reconciled with the log: {self.rows:,} rows equal the fold of "
                    f"{self.events:,} archived events (offsets {at})"]
        out = [f"{self.table}: DIFFERS from the fold of {self.events:,} archived events (offsets {at}): "
               f"{self.differences} row{'s' if self.differences != 1 else ''} ({self.rows:,} in the table, "
               f"{self.expected_rows:,} in the fold)"]
        out += [f"  missing from the table: {k}" for k in self.missing]
        out += [f"  not in the fold: {k}" for k in self.unexpected]
        out += [f"  {k}: {column} is {actual!r} in the table, {expected!r} in the fold"
                for k, column, actual, expected in self.different]
        if any(column in REFERENCE_COLUMNS for _, column, _, _ in self.different):
            out.append("  (reference data joined as of each event's time: the dimension learned something after "
                       "these rows were projected; `eventlake backfill` brings them in line)")
        return out


def table_position(settings: Settings, generation: Generation) -> tuple[dict[int, int] | None, str]:
    """The end offsets of the last batch reflected in the generation's table, or (None, why not)."""
    name = generation.name
    history = delta_table(generation.table).history()
    written = [json.loads(c["userMetadata"]) for c in history if c.get("userMetadata")]
    written = [m for m in written if "batch_id" in m and "projection" in m]
    if not written:
        # Written whole by a rebuild's fold (complete up to the recorded position: the last offset folded per
        # partition), then perhaps caught up by batches that brought none of its events: the newest of the two.
        last_batch = last_committed_batch(generation.checkpoint)
        offsets = None if last_batch is None else batch_offsets(generation.checkpoint, last_batch,
                                                                settings.events_topic)
        if offsets is not None:
            return offsets, ""
        if generation.position is not None:
            return {p: o + 1 for p, o in generation.position.items()}, ""
        return None, f"no projection batch has written {name} yet"
    last = written[0]  # newest first
    checkpoint = settings.checkpoints / last["projection"]
    # Batches after the table's last write that are committed wrote nothing to it: it stands at the newest.
    batch = max(last["batch_id"], last_committed_batch(checkpoint) or 0)
    offsets = batch_offsets(checkpoint, batch, settings.events_topic)
    if offsets is None:
        return None, f"the checkpoint {checkpoint} has no offsets for batch {batch}"
    return offsets, ""


def _archived_events(settings: Settings, position: dict[int, int]) -> list[EventEnvelope]:
    """The archived events before ``position``, as envelopes (payload fields back under ``payload``); the
    last answer is kept, as the read models of one projection usually stand at the same position."""
    key = (str(settings.table_path(ARCHIVE_TABLE)), delta_table(settings.table_path(ARCHIVE_TABLE)).version(),
           tuple(sorted(position.items())))
    if _last_archive_read[0] != key:
        _last_archive_read[:] = [key, _read_archive(settings, position)]
    return _last_archive_read[1]


_last_archive_read: list = [None, None]


def _read_archive(settings: Settings, position: dict[int, int]) -> list[EventEnvelope]:
    events = []
    # In log order: the first record at a version takes it (read_models.sequence), and a Delta table's files
    # come back in no order that can be relied on (delta-rs lists the newest first).
    rows = sorted(read_rows(settings.table_path(ARCHIVE_TABLE)),
                  key=lambda r: (r["kafka_partition"], r["kafka_offset"]))
    for row in rows:
        if row["kafka_offset"] >= position.get(row["kafka_partition"], 0):
            continue
        event_type = row["event_type"]
        payload = {f: row[f] for f in EVENTS[event_type] if row.get(f) is not None}
        events.append(built(
            EventEnvelope, event_id=row["event_id"], event_type=event_type, schema_version=row["schema_version"],
            aggregate_type=row["aggregate_type"], aggregate_id=row["aggregate_id"],
            aggregate_version=row["aggregate_version"],
            occurred_at=format_time(row["occurred_at"].replace(tzinfo=timezone.utc)),
            recorded_at=format_time(row["recorded_at"].replace(tzinfo=timezone.utc)),
            command_id=row["command_id"], correlation_id=row["correlation_id"], causation_id=row["causation_id"],
            payload=payload))
    return events


def archive_end(settings: Settings) -> dict[int, int]:
    checkpoint = settings.checkpoints / f"projection-{ARCHIVE_TABLE}"
    batch = last_committed_batch(checkpoint)
    return {} if batch is None else (batch_offsets(checkpoint, batch, settings.events_topic) or {})


def _late_not_reprocessed(generation: Generation) -> set[str]:
    """Ids of the events a windowed model recorded as late and has not folded into their windows since (a
    reprocess folds them in and marks them ``reprocessed_at``): its table does not count them."""
    if not (generation.late_events / "_delta_log").is_dir():
        return set()
    return {row["event_id"] for row in read_rows(generation.late_events, filters=[("read_model", "=", generation.name)])
            if row.get("reprocessed_at") is None}


def reconcile(settings: Settings, name: str, examples: int = 3,
              generation: Generation | None = None) -> Reconciliation:
    """Compare read model ``name`` (its current generation, or ``generation``) with the fold of the archived
    events up to the table's log position."""
    model = read_models.get(name)
    generation = generation or Catalog(settings).current(name)
    label = name if generation.number == 1 else f"{name} (generation {generation.number})"
    if not (generation.table / "_delta_log").is_dir():
        return Reconciliation(label, False, {}, reason=f"no Delta table at {generation.table} yet")
    position, why = table_position(settings, generation)
    if position is None:
        return Reconciliation(label, False, {}, reason=why)
    archived = archive_end(settings)
    behind = positions.behind(archived, position)
    if behind:  # only a transaction marker between the two? (the broker's answer; unreachable: offsets as they are)
        behind = positions.behind(archived, position, positions.record_ends_or_none(settings))
    if behind:
        return Reconciliation(label, False, position, reason=(
            f"the archive (projection-{ARCHIVE_TABLE}) has not reached the table's log position yet "
            f"(partition: archive end / table end: "
            + ", ".join(f"p{p}: {archived.get(p, 0)}/{o}" for p, o in sorted(behind.items()))
            + "); run the projection until both are caught up"))
    events = _archived_events(settings, position)
    # The archive holds every valid event as the log has it; the read models apply what the sequence rule
    # admits (duplicates once, version conflicts nowhere, nothing after a gap).
    # Personal values as the read models hold them: unsealed, null once their subject is forgotten (issue 45).
    admitted = list(Unsealer(settings).events(sequence(events).admitted))
    if model.merge_strategy == WINDOWED_SUM:
        # Whatever the model's columns (sums, minima, maxima): its table is the fold of the admitted events but
        # the late ones it recorded in late_events instead.
        late = _late_not_reprocessed(generation)
        admitted = [e for e in admitted if e.event_id not in late]
    # The reference tables its fold joins, as they are now (every version: the join is as of each event's time).
    expected = model.expected_rows(admitted, ReferenceTables(settings).rows(model.reference_tables))
    actual = {tuple(row[k] for k in model.key): row for row in read_rows(generation.table)}
    missing = [k for k in expected if k not in actual]
    unexpected = [k for k in actual if k not in expected]
    different = []
    for k, row in expected.items():
        if k in actual:
            columns = [c for c, v in row.items() if actual[k].get(c) != v]
            if columns:
                different.append((k, columns[0], actual[k].get(columns[0]), row[columns[0]]))
    return Reconciliation(label, True, position, events=len(events), rows=len(actual), expected_rows=len(expected),
                          missing=tuple(missing[:examples]), unexpected=tuple(unexpected[:examples]),
                          different=tuple(different[:examples]),
                          differences=len(missing) + len(unexpected) + len(different))
