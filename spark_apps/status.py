"""``eventlake status``: how far each projection is, and what the tables hold. No JVM needed.

Lag is the log end (read_committed) minus the offsets of the projection's last committed batch, read
from its checkpoint; the rate is the events between its last two batches over the time between them.
Table figures come from the Delta logs through delta-rs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import read_models
from eventlake.settings import Settings

__all__ = ["ProjectionStatus", "TableStatus", "projection_statuses", "table_statuses", "render"]


@dataclass(frozen=True)
class ProjectionStatus:
    name: str
    last_batch: int | None
    committed_at: datetime | None
    committed_offsets: int
    log_end: int | None
    events_per_s: float | None

    @property
    def lag(self) -> int | None:
        return None if self.log_end is None else max(self.log_end - self.committed_offsets, 0)


@dataclass(frozen=True)
class TableStatus:
    name: str
    rows: int | None
    version: int | None
    path: Path


def _offsets(checkpoint: Path, batch: int, topic: str) -> int:
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    total = 0
    for line in lines[2:]:  # "v1", batch metadata, then one JSON line per source
        source = json.loads(line)
        if isinstance(source, dict) and topic in source:
            total += sum(int(v) for v in source[topic].values())
    return total


def _batches(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.glob("*") if p.name.isdigit()) if folder.is_dir() else []


def projection_statuses(settings: Settings, log_end: int | None) -> list[ProjectionStatus]:
    out = []
    for checkpoint in sorted(settings.checkpoints.glob("projection-*")):
        commits = _batches(checkpoint / "commits")
        if not commits:
            out.append(ProjectionStatus(checkpoint.name, None, None, 0, log_end, None))
            continue
        last = commits[-1]
        committed_at = datetime.fromtimestamp((checkpoint / "commits" / str(last)).stat().st_mtime, timezone.utc)
        offsets = _offsets(checkpoint, last, settings.events_topic)
        rate = None
        if len(commits) > 1:
            before = commits[-2]
            seconds = committed_at.timestamp() - (checkpoint / "commits" / str(before)).stat().st_mtime
            if seconds > 0:
                rate = (offsets - _offsets(checkpoint, before, settings.events_topic)) / seconds
        out.append(ProjectionStatus(checkpoint.name, last, committed_at, offsets, log_end, rate))
    return out


def table_statuses(settings: Settings) -> list[TableStatus]:
    from deltalake import DeltaTable

    from eventlake.tables import dataset

    names = [*read_models.REGISTRY, "event_archive", "late_events", "_dead_letters/events"]
    out = []
    for name in names:
        path = settings.table_path(name)
        if not (path / "_delta_log").is_dir():
            out.append(TableStatus(name, None, None, path))
            continue
        table = DeltaTable(str(path))
        out.append(TableStatus(name, dataset(table).count_rows(), table.version(), path))
    return out


def log_end(settings: Settings) -> int | None:
    from event_store import kafka_log

    try:
        return sum(kafka_log.end_offsets(settings, settings.events_topic).values())
    except Exception:  # the broker is down: show what the files say, and say the lag is unknown
        return None


def render(settings: Settings) -> str:
    end = log_end(settings)
    lines = [f"events topic {settings.events_topic} at {settings.bootstrap_servers}: "
             + (f"{end} offsets" if end is not None else "unreachable (lag unknown)")]
    projections = projection_statuses(settings, end)
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
    lines.append("tables:")
    for t in table_statuses(settings):
        if t.rows is None:
            lines.append(f"  {t.name:<24} (not created yet)")
        else:
            lines.append(f"  {t.name:<24} {t.rows:>10,} rows  Delta version {t.version}")
    return "\n".join(lines)
