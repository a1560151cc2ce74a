"""Cross-model expectations: read models that derive the same facts from the same events must agree.

This module is what a cross-model check is (``CrossModelCheck``, its outcome ``Agreement``) and how it reads the
tables it compares at one log position (``table_snapshots``). The checks themselves are domain knowledge: each
domain's folder registers its own (``expectations.account.CROSS_MODEL_CHECKS``), and ``expectations`` collects
them with the suites (``expectations.CROSS_MODEL_CHECKS``, ``checks_for``, ``check_agreement``).

When the tables are compared: one projection batch writes the read models side by side, one Delta commit each,
then records the batch in its checkpoint. At a batch boundary they are consistent; between two commits of one
batch, one may be ahead. So each table's position is read from its Delta log (the projection and batch id in the
``userMetadata`` of its last projection commit) and from the projection's checkpoint, read *before* the tables:
a table stands at its own last batch or at the last batch the checkpoint had committed, whichever is later
(a committed batch that did not write a table left it as it was). The tables are compared only when they all
stand at the same log position; otherwise the result says "not compared" and why (a batch in progress: run
again), which is no failure. Tables no projection has written (e.g. written by hand) are compared as they stand.
Each read model is read in its current generation (read_models/catalog.py), all resolved from one catalog read.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lakehouse.settings import Settings
from lakehouse.storage import delta_table
from read_models.catalog import Catalog

__all__ = ["Agreement", "CrossModelCheck", "table_snapshots"]


@dataclass(frozen=True)
class Agreement:
    """The outcome of one cross-model check."""
    check: str
    compared: bool  # False: the tables do not stand at the same log position (``reason`` says why)
    reason: str = ""
    position: str = ""  # where the tables were compared, in words
    keys: int = 0  # keys (accounts) compared
    disagreements: int = 0
    examples: tuple[str, ...] = ()  # a line per disagreeing key (a few)
    keys_are: str = "keys"  # what a key is, in the plural ("accounts"), for the lines

    @property
    def success(self) -> bool:
        return self.compared and self.disagreements == 0

    @property
    def failed(self) -> bool:
        """A disagreement; "not compared" is no finding about the data."""
        return self.compared and self.disagreements > 0

    def lines(self) -> list[str]:
        if not self.compared:
            return [f"{self.check}: not compared: {self.reason}"]
        if self.success:
            return [f"{self.check}: agree on all {self.keys:,} {self.keys_are} ({self.position})"]
        return ([f"{self.check}: DISAGREE on {self.disagreements} of {self.keys:,} {self.keys_are} "
                 f"({self.position})"]
                + [f"  {line}" for line in self.examples])

    def summary(self) -> dict:
        return {"check": self.check, "compared": self.compared, "keys": self.keys,
                "disagreements": self.disagreements}


@dataclass(frozen=True)
class CrossModelCheck:
    name: str
    tables: tuple[str, ...]  # the read models it compares (``eventlake check NAMES`` runs it when all are named)
    run: Callable[[Settings], Agreement]


# -- where each table stands ---------------------------------------------------------------------------------
def _last_projection_write(path: Path, version: int, look_back: int = 500) -> tuple[str, int] | None:
    """(projection, batch id) of the newest commit at or below ``version`` that a projection batch made.
    Read from the commit files themselves: delta-rs' ``history()`` does not stop at a loaded version."""
    log = path / "_delta_log"
    for v in range(version, max(-1, version - look_back), -1):
        commit = log / f"{v:020d}.json"
        if not commit.exists():
            return None  # cleaned up past the log's checkpoint: unknown
        for line in commit.read_text().splitlines():
            info = json.loads(line).get("commitInfo") if line.strip() else None
            if info and info.get("userMetadata"):
                try:
                    meta = json.loads(info["userMetadata"])
                except ValueError:
                    continue
                if isinstance(meta, dict) and "projection" in meta and "batch_id" in meta:
                    return meta["projection"], int(meta["batch_id"])
    return None


def table_snapshots(settings: Settings, names: tuple[str, ...], optional: tuple[str, ...] = ()):
    """({name: DeltaTable at one version}, position in words, None) when the tables stand at the same log
    position, else ({}, "", why not). ``optional`` tables may be missing (read as empty)."""
    from projection_core.checkpoint import batch_offsets, last_committed_batch

    paths = _physical_paths(settings, (*names, *optional))
    missing = [n for n in names if not (paths[n] / "_delta_log").is_dir()]
    if missing:
        return {}, "", (f"no Delta table for {', '.join(missing)} yet; run the projection first "
                        f"(eventlake project, or eventlake demo)")
    present = [n for n in (*names, *optional) if (paths[n] / "_delta_log").is_dir()]

    def writers() -> dict[str, tuple[str, int] | None]:
        found = {}
        for n in present:
            table = delta_table(paths[n])
            found[n] = _last_projection_write(paths[n], table.version())
        return found

    before = writers()
    projections = {w[0] for w in before.values() if w is not None}
    if not projections:  # never written by a projection: nothing writes them now, compare them as they are
        tables = {n: delta_table(paths[n]) for n in present}
        return tables, "tables not written by a projection, compared as they stand", None
    # The checkpoints first, then the tables: every batch a checkpoint has committed is in the tables read after.
    committed = {p: last_committed_batch(settings.checkpoints / p) for p in projections}
    tables = {n: delta_table(paths[n]) for n in present}
    positions: dict[str, tuple[str, int]] = {}
    for n, table in tables.items():
        written = _last_projection_write(paths[n], table.version())
        if written is None:  # created empty, never written (e.g. nothing has waited yet): it stands anywhere
            continue
        projection, batch = written
        if n in optional and projection not in {positions[r][0] for r in names if r in positions}:
            # Bookkeeping left by another projection: the running one rewrites it in its first batch with rows
            # in it, so until then it holds what that projection reads, wherever it stands.
            continue
        if projection not in committed:
            return {}, "", f"a projection started writing {n} while the check ran; run the check again"
        positions[n] = (projection, max(batch, committed[projection] if committed[projection] is not None else -1))
    if not positions:  # only bookkeeping was ever written by a projection: the models stand as created
        return tables, "tables not written by a projection batch yet, compared as they stand", None
    if len(set(positions.values())) == 1:
        projection, batch = next(iter(positions.values()))
        return tables, f"each at batch {batch} of {projection}", None
    # Different projections may still stand at the same place in the log.
    offsets = {n: batch_offsets(settings.checkpoints / p, b, settings.events_topic) for n, (p, b) in positions.items()}
    if None not in offsets.values() and len({tuple(sorted(o.items())) for o in offsets.values()}) == 1:
        at = ", ".join(f"p{p}<{o}" for p, o in sorted(next(iter(offsets.values())).items()))
        return tables, f"each at offsets {at}", None
    where = ", ".join(f"{n} at batch {b} of {p}" for n, (p, b) in positions.items())
    return {}, "", (f"the tables do not stand at the same log position ({where}): a projection batch is in "
                    f"progress or the tables are written by different projections; run the check again once "
                    f"the projection is caught up")


def _physical_paths(settings: Settings, names: tuple[str, ...]) -> dict[str, Path]:
    """Logical names (read models, ``_pending/<model>``) -> their tables in the models' current generations."""
    models = {n.split("/")[-1] for n in names}
    current = Catalog(settings).current_all(sorted(models))
    return {n: current[n].table if "/" not in n else current[n.split("/")[-1]].pending for n in names}
