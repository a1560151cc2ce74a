"""``eventlake history NAME``: a table's commits, newest first, with who made each, beside the catalog's changes.

Each commit: its Delta version (what ``eventlake query --as-of VERSION`` reads), when, the operation, the rows it
wrote, and who: the projection and its batch (from the commit's ``userMetadata``), a rebuild, a reprocess,
maintenance or delta-rs. A read model's name shows its current generation's table (or ``generation``'s) and,
between the commits, the catalog's changes of that name: generations created, switched to, rolled back, dropped.
Read with delta-rs: no JVM.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone

import read_models
from lakehouse.settings import Settings
from lakehouse.storage import delta_table
from read_models.catalog import ARCHIVE_TABLE, DEAD_LETTER_TABLE, Catalog, CatalogError
from lakehouse.errors import NotFound

__all__ = ["HistoryError", "HistoryLine", "history", "format_history"]

NON_MODEL_TABLES = {"event_archive": ARCHIVE_TABLE, "event_dead_letters": DEAD_LETTER_TABLE}


class HistoryError(NotFound, LookupError):
    """No such table, or no such generation."""


@dataclass(frozen=True)
class HistoryLine:
    at: datetime
    version: int | None  # None: a catalog change
    operation: str
    rows: int | None
    by: str


def history(settings: Settings, name: str, generation: int | None = None, limit: int = 30) \
        -> tuple[str, list[HistoryLine]]:
    """(what was read, lines newest first): the last ``limit`` commits of the table and the catalog's changes of
    ``name`` since the oldest of them."""
    from deltalake.exceptions import TableNotFoundError

    catalog_lines: list[HistoryLine] = []
    if name in read_models.REGISTRY:
        catalog = Catalog(settings)
        try:
            target = catalog.generation(name, generation) if generation is not None else catalog.current(name)
        except CatalogError as e:
            raise HistoryError(str(e)) from None
        path, what = target.table, f"{name} generation {target.number}: {target.table}"
        catalog_lines = [HistoryLine(e.at, None, f"catalog: generation {e.generation} {e.action}", None,
                                     _catalog_by(e)) for e in catalog.history(name)]
    elif name in NON_MODEL_TABLES:
        if generation is not None:
            raise HistoryError(f"{name} has no generations (only read models have)")
        path = settings.table_path(NON_MODEL_TABLES[name])
        what = f"{name}: {path}"
    else:
        raise HistoryError(f"no table named {name!r}; the names: "
                           f"{', '.join([*read_models.REGISTRY, *NON_MODEL_TABLES])}")
    try:
        commits = delta_table(path).history(limit)
    except TableNotFoundError:
        raise HistoryError(f"{what}: no Delta table there yet (nothing written to it); run `eventlake demo` or "
                           f"`eventlake project --until-caught-up` first") from None
    lines = [_commit_line(c) for c in commits]
    if lines and len(commits) >= limit:
        oldest = min(line.at for line in lines)
        catalog_lines = [line for line in catalog_lines if line.at >= oldest]
    merged = sorted(lines + catalog_lines, key=lambda line: (line.at, line.version if line.version is not None
                                                              else -1), reverse=True)
    return what, merged


def _commit_line(commit: dict) -> HistoryLine:
    at = datetime.fromtimestamp(int(commit.get("timestamp", 0)) / 1000, tz=timezone.utc)
    operation = str(commit.get("operation", "?"))
    metrics = commit.get("operationMetrics") or {}
    return HistoryLine(at, int(commit["version"]), operation, _rows(operation, metrics), _by(commit))


def _rows(operation: str, metrics: dict) -> int | None:
    """Rows the commit wrote: inserted + updated (+ deleted) by a MERGE, the rows written otherwise."""
    def number(key):
        value = metrics.get(key)
        return int(value) if value not in (None, "") else None

    if operation == "MERGE":
        parts = [number(k) for k in ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")]
        return sum(p for p in parts if p is not None) if any(p is not None for p in parts) else None
    for key in ("numOutputRows", "num_added_rows", "numDeletedRows", "num_deleted_rows"):
        if number(key) is not None:
            return number(key)
    return None


def _by(commit: dict) -> str:
    """Who made the commit: from its userMetadata (projection + batch, rebuild, reprocess), else the engine."""
    raw = commit.get("userMetadata")
    meta = None
    if raw:
        try:
            meta = json.loads(raw)
        except (TypeError, ValueError):
            return str(raw)[:80]
    if isinstance(meta, dict):
        projection = meta.get("projection")
        if projection == "rebuild":
            position = meta.get("position") or {}
            return "rebuild, up to " + (", ".join(f"p{p}@{o}" for p, o in sorted(position.items())) or "nothing")
        if "batch_id" in meta:
            return f"{projection} batch {meta['batch_id']}"
        return ", ".join(f"{k}={v}" for k, v in meta.items())[:80]
    engine = str(commit.get("engineInfo") or commit.get("clientVersion") or "")
    return engine.split()[0] if engine else ""


def _catalog_by(entry) -> str:
    text = entry.by or ""
    if entry.action == "switched" and entry.previous is not None:
        text += f" (from generation {entry.previous})"
    if entry.reason:
        text += f": {entry.reason}"
    return text[:100]


def format_history(what: str, lines: list[HistoryLine]) -> str:
    from eventlake.query import format_table

    rows = [(line.at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3], "" if line.version is None else line.version,
             line.operation, "" if line.rows is None else line.rows, line.by) for line in lines]
    table = format_table(["committed (UTC)", "version", "operation", "rows", "by"], rows, max_rows=len(rows) or 1)
    return f"{what}\n{table}"
