"""``eventlake status``: how far each projection is, and what the tables hold. No JVM needed.

Lag is the log end (read_committed) minus the offsets of the projection's last committed batch, read
from its checkpoint; the rate is the events between its last two batches over the time between them.
Table figures come from the Delta logs through delta-rs. For each windowed read model it also says where its
watermark stands: the end of the minute of the newest event time on the clock (capped by its recording and
projection), minus the delay (``spark_apps.merge.windowed_watermark``), the newest event time applied, and how
many applied events lie ahead of the clock (counted in their windows; they move the watermark only as far as the
time they were recorded). Read models are shown in their current generation (read_models/catalog.py), with
when, by whom and why it became current.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

import read_models
from lakehouse.settings import Settings
from lakehouse.storage import delta_table
from projection_core import checkpoint as checkpoint_log, positions
from read_models.catalog import ARCHIVE_TABLE, DEAD_LETTER_TABLE, REPROCESSED_AT, SHARED_LATE_EVENTS_TABLE, Catalog, \
    Generation, held_table, late_events_sources

__all__ = ["ProjectionStatus", "TableStatus", "WatermarkStatus", "projection_statuses", "table_statuses",
           "watermark_statuses", "render"]


@dataclass(frozen=True)
class ProjectionStatus:
    name: str
    last_batch: int | None
    committed_at: datetime | None
    committed_offsets: int
    log_end: int | None
    events_per_s: float | None
    behind: int | None = None  # records past the committed offsets, partition by partition (projection_core.positions)

    @property
    def lag(self) -> int | None:
        if self.behind is not None:
            return self.behind
        return None if self.log_end is None else max(self.log_end - self.committed_offsets, 0)


@dataclass(frozen=True)
class TableStatus:
    name: str
    rows: int | None
    version: int | None
    path: Path


@dataclass(frozen=True)
class WatermarkStatus:
    """Where a windowed read model's watermark stands (``spark_apps.merge.windowed_watermark``)."""
    name: str
    watermark: datetime | None          # what the next batch uses; None: no event on the clock yet, nothing late
    newest_on_clock: datetime | None    # the newest event time on the clock, which set the watermark
    newest_event_time: datetime | None  # the newest event time applied to a window (late ones excluded)
    ahead_of_clock: int                 # events applied with an event time after ``clock``
    late: int                           # events recorded in late_events instead of their window
    clock: datetime
    delay: str
    reprocessed: int = 0                # of the late ones: folded back into their windows by `eventlake reprocess`


def watermark_statuses(settings: Settings, now: datetime | None = None) -> list[WatermarkStatus]:
    """One per windowed read model whose table exists (delta-rs and pyarrow: no JVM)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    from lakehouse.tables import dataset
    from read_models.spec import WINDOWED_SUM
    from spark_apps.merge import newest_event_time_on_clock, watermark_delay, windowed_watermark

    clock = now or datetime.now(timezone.utc)
    out = []
    current = Catalog(settings).current_all()
    for model in read_models.REGISTRY.values():
        path, ledger_path = current[model.name].table, current[model.name].applied
        if model.merge_strategy != WINDOWED_SUM or not (path / "_delta_log").is_dir():
            continue
        table = delta_table(path)
        metadata = [json.loads(c["userMetadata"]) for c in table.history(5) if c.get("userMetadata")]
        found, newest_on_clock = newest_event_time_on_clock(metadata)
        if not found:  # a table written before the newest event time on the clock was recorded
            start = pc.max(dataset(table).to_table(columns=["window_start"])["window_start"]).as_py()
            newest_on_clock = None if start is None else min(_utc(start), clock)
        newest_event = None
        ahead = late = 0
        if (ledger_path / "_delta_log").is_dir():
            ledger = dataset(ledger_path)
            on_time = ledger.to_table(columns=["event_time"], filter=~ds.field("_late"))["event_time"]
            newest_event = _utc(pc.max(on_time).as_py())
            ahead = ledger.count_rows(filter=ds.field("event_time") > clock)
            late = ledger.count_rows(filter=ds.field("_late"))
        out.append(WatermarkStatus(model.name, windowed_watermark(newest_on_clock, watermark_delay(model)),
                                   newest_on_clock, newest_event, ahead, late, clock, model.watermark_delay,
                                   _reprocessed(current[model.name], model.name) if late else 0))
    return out


def _reprocessed(generation: Generation, name: str) -> int:
    """How many of the model's late events a reprocess has folded back in (``late_events.reprocessed_at`` set)."""
    import pyarrow.dataset as ds

    from lakehouse.tables import dataset

    path = generation.late_events
    if not (path / "_delta_log").is_dir():
        return 0
    late = dataset(path)
    if REPROCESSED_AT not in late.schema.names:  # no reprocess has run on it yet
        return 0
    return late.count_rows(filter=(ds.field("read_model") == name) & ds.field(REPROCESSED_AT).is_valid())


def generation_lines(settings: Settings) -> list[str]:
    """One line per read model: its current generation, and when, by whom and why it became current."""
    out = []
    for name, state in Catalog(settings).states().items():
        s = state.switched
        if s is None:
            since = "(the original tables)" if not state.entries else "(never switched)"
        else:
            since = f"(switched {s.at:%Y-%m-%d %H:%M:%S}Z by {s.by or '?'}: {s.reason or 'no reason given'})"
        others = sorted(n for n in state.generations if n != state.current and n not in state.dropped)
        kept = f"; also kept: {', '.join(map(str, others))}" if others else ""
        out.append(f"  {name:<24} generation {state.current} {since}{kept}")
    return out


def _late_events_status(current: dict[str, Generation], settings: Settings) -> "TableStatus":
    """The logical late_events: the rows of the current generations' late-events tables."""
    import pyarrow.dataset as ds
    from lakehouse.tables import dataset

    sources = late_events_sources(current)
    if not sources:
        return TableStatus(SHARED_LATE_EVENTS_TABLE, None, None, settings.table_path(SHARED_LATE_EVENTS_TABLE))
    rows, version = 0, None
    for path, names in sources:
        table = delta_table(path)
        rows += dataset(table).count_rows(filter=ds.field("read_model").isin(names))
        version = table.version() if len(sources) == 1 else None
    return TableStatus("late_events", rows, version, sources[0][0])


def _utc(t: datetime | None) -> datetime | None:
    return None if t is None else (t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t)


def _iso(t: datetime | None) -> str:
    return "none" if t is None else t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def projection_statuses(settings: Settings, log_end: int | None,
                        ends: dict[int, int] | None = None) -> list[ProjectionStatus]:
    """Each projection query's last committed batch; its lag against ``ends`` (partition -> the offset after the
    log's last record, ``projection_core.positions.record_ends``) when given, else against the total ``log_end``."""
    out = []
    for checkpoint in sorted(settings.checkpoints.glob("projection-*")):
        commits = checkpoint_log.committed_batches(checkpoint)
        if not commits:
            out.append(ProjectionStatus(checkpoint.name, None, None, 0, log_end, None))
            continue
        last = commits[-1]
        committed_at = checkpoint_log.committed_at(checkpoint, last)
        offsets = checkpoint_log.offsets_total(checkpoint, last, settings.events_topic)
        rate = None
        if len(commits) > 1:
            before = commits[-2]
            seconds = committed_at.timestamp() - checkpoint_log.committed_at(checkpoint, before).timestamp()
            if seconds > 0:
                rate = (offsets - checkpoint_log.offsets_total(checkpoint, before, settings.events_topic)) / seconds
        behind = None
        if ends is not None:
            behind = positions.lag(checkpoint_log.batch_offsets(checkpoint, last, settings.events_topic) or {}, ends)
        out.append(ProjectionStatus(checkpoint.name, last, committed_at, offsets, log_end, rate, behind))
    return out


def table_statuses(settings: Settings) -> list[TableStatus]:
    from lakehouse.tables import dataset

    current = Catalog(settings).current_all()  # read models: their current generation's table
    paths = {name: generation.table for name, generation in current.items()}
    paths.update({name: settings.table_path(name) for name in (ARCHIVE_TABLE, SHARED_LATE_EVENTS_TABLE, DEAD_LETTER_TABLE)})
    out = []
    for name, path in paths.items():
        if name == SHARED_LATE_EVENTS_TABLE:
            out.append(_late_events_status(current, settings))
            continue
        if not (path / "_delta_log").is_dir():
            out.append(TableStatus(name, None, None, path))
            continue
        table = delta_table(path)
        out.append(TableStatus(name, dataset(table).count_rows(), table.version(), path))
    return out


def log_end(settings: Settings) -> int | None:
    """The offsets up to the log's last record, summed over the partitions (a transaction marker after it is not
    counted); None when the broker cannot be reached."""
    ends = positions.record_ends_or_none(settings)
    return None if ends is None else sum(ends.values())


def render(settings: Settings) -> str:
    ends = positions.record_ends_or_none(settings)
    end = None if ends is None else sum(ends.values())
    lines = [f"events topic {settings.events_topic} at {settings.bootstrap_servers}: "
             + (f"{end} offsets" if end is not None else "unreachable (lag unknown)")]
    projections = projection_statuses(settings, end, ends)
    if not projections:
        lines.append("no projection has run yet (eventlake project --until-caught-up)")
    for p in projections:
        if p.last_batch is None:
            lines.append(f"{p.name}: started, no batch committed yet")
            continue
        lag = "unknown" if p.lag is None else f"{p.lag}"
        rate = "" if p.events_per_s is None else f", last batch {p.events_per_s:,.0f} events/s"
        lines.append(f"{p.name}: lag {lag} events; batch {p.last_batch} committed "
                     f"{p.committed_at:%Y-%m-%d %H:%M:%S}Z{rate}")
    for w in watermark_statuses(settings):
        if w.watermark is None:
            lines.append(f"{w.name}: no watermark yet (no event on the clock applied): nothing is late")
            continue
        ahead = f"{w.ahead_of_clock:,} event{'s' if w.ahead_of_clock != 1 else ''}"
        lines.append(f"{w.name}: watermark {_iso(w.watermark)} (newest event time on the clock "
                     f"{_iso(w.newest_on_clock)}, its minute's end - {w.delay}); newest event time applied "
                     f"{_iso(w.newest_event_time)}; {ahead} ahead of the clock ({_iso(w.clock)}: counted in their "
                     f"windows, they move the watermark only to their recording time); {w.late:,} late (in "
                     f"{SHARED_LATE_EVENTS_TABLE}" + (f"; {w.reprocessed:,} of them since folded back in by eventlake "
                                               f"reprocess" if w.reprocessed else "") + ")")
    lines.extend(quarantine_lines(settings))
    lines.extend(reference_lines(settings))
    lines.append("read models (eventlake catalog lists every generation; eventlake rollback NAME goes one back):")
    lines.extend(generation_lines(settings))
    lines.append(f"tables (under {settings.warehouse}):")
    for t in table_statuses(settings):
        if t.rows is None:
            lines.append(f"  {t.name:<24} (not created yet)")
        else:
            version = "" if t.version is None else f"  Delta version {t.version}"
            lines.append(f"  {t.name:<24} {t.rows:>10,} rows{version}")
    return "\n".join(lines)


class Quarantined(NamedTuple):
    account_id: str
    record: str  # topic/partition/offset
    reason: str


def quarantined_accounts(settings: Settings) -> list[Quarantined]:
    """Accounts with an events record that cannot be read and is not resolved yet, as the read side sees them:
    the event dead letters (version conflicts aside: the first event at a version counts, nothing stops) minus
    the records a domain's quarantine_resolved_event (the account's QuarantineResolved) in the archive names. The command handler applies the same rule, so these
    are the accounts whose commands it rejects (AccountQuarantined)."""
    from event_store.domains import DOMAINS
    from lakehouse.tables import TableNotFound, read_table
    from spark_apps.sequence import VERSION_CONFLICT

    try:
        dead = read_table(settings.table_path(DEAD_LETTER_TABLE)).to_pylist()
    except (TableNotFound, FileNotFoundError):
        return []
    resolved: set[str] = set()
    try:
        resolving = sorted({d.quarantine_resolved_event for d in DOMAINS.values() if d.quarantine_resolved_event})
        archive = read_table(settings.table_path(ARCHIVE_TABLE), filters=[("event_type", "in", resolving)],
                             columns=["record"])
        resolved = {r for r in archive.column("record").to_pylist() if r}
    except Exception:  # noqa: BLE001 -- no archive yet, or one written before the column existed: none resolved
        pass
    out, seen = [], set()
    for row in sorted(dead, key=lambda r: (r.get("kafka_partition") or 0, r.get("kafka_offset") or 0)):
        account = row.get("kafka_key")
        record = f"{row['kafka_topic']}/{row['kafka_partition']}/{row['kafka_offset']}"
        if (not account or row["kafka_topic"] != settings.events_topic or account in seen or record in resolved
                or (row.get("reason") or "").startswith(VERSION_CONFLICT)):
            continue
        seen.add(account)
        out.append(Quarantined(account, record, row.get("reason") or ""))
    return out


def waiting_events(settings: Settings) -> dict[str, int]:
    """Per account, the events the read models hold back because an earlier version is missing."""
    from lakehouse.tables import TableNotFound, read_table

    counts: dict[str, int] = {}
    for path in sorted(settings.table_path(held_table("x")).parent.glob("*")):
        try:
            ids = read_table(path, columns=["aggregate_id"]).column("aggregate_id").to_pylist()
        except (TableNotFound, FileNotFoundError):
            continue
        for account in ids:
            counts[account] = counts.get(account, 0) + 1
    return counts


def quarantine_lines(settings: Settings) -> list[str]:
    quarantined = quarantined_accounts(settings)
    waiting = waiting_events(settings)
    if not quarantined and not waiting:
        return ["quarantine: none (every account's events are readable and in sequence)"]
    lines = [f"quarantine: {len(quarantined)} account(s) with an unreadable events record (their commands are "
             f"rejected until resolved: eventlake resolve-quarantine ACCOUNT --record RECORD --reason ...)"]
    for q in quarantined:
        reason = q.reason if len(q.reason) <= 160 else q.reason[:157] + "..."
        held = f"; {waiting[q.account_id]} later event(s) wait" if q.account_id in waiting else ""
        lines.append(f"  {q.account_id}  {q.record}: {reason}{held}")
    others = {a: n for a, n in waiting.items() if a not in {q.account_id for q in quarantined}}
    if others:
        lines.append("  events waiting after a gap in their account's versions: "
                     + ", ".join(f"{a} ({n})" for a, n in sorted(others.items())[:20])
                     + (" ..." if len(others) > 20 else ""))
    return lines


def reference_lines(settings: Settings) -> list[str]:
    """Per read model that joins reference data and keeps a row per event (``payments``): the rows without their
    merchant (the dimension did not know it at their time, or when they were projected), and those that differ from
    the dimension now (what ``eventlake backfill`` would set)."""
    import pyarrow.dataset as ds

    from lakehouse.tables import dataset
    from projection_core.reference import ReferenceTables
    from read_models.enrichment import MERCHANT_COLUMNS
    from read_models.spec import INSERT_ONCE
    from reference_data.backfill import stale_rows

    reference = ReferenceTables(settings)
    lines = []
    for model in read_models.select(None):
        if not model.reference_tables or model.merge_strategy != INSERT_ONCE:
            continue
        path = Catalog(settings).current(model.name).table
        if not (path / "_delta_log").is_dir():
            continue
        table = delta_table(path)
        present = set(table.schema().to_arrow().names)
        unknown = None
        for column in (c for c in MERCHANT_COLUMNS.values() if c in present):
            unknown = ds.field(column).is_null() if unknown is None else unknown & ds.field(column).is_null()
        # A table of an older release has no merchant columns until the projection's next batch adds them.
        without = dataset(table).count_rows(filter=unknown) if unknown is not None else dataset(table).count_rows()
        stale = stale_rows(table, model, reference).num_rows
        versions = ", ".join(f"{name} version {v}" if v is not None else f"no {name} yet"
                             for name, v in reference.versions(model.reference_tables).items())
        lines.append(f"{model.name}: {without:,} row(s) without their merchant; {stale:,} differ from the reference "
                     f"data now ({versions})" + ("; eventlake backfill sets them" if stale else ""))
    return lines
