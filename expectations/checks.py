"""Check read model tables against their Great Expectations suites.

The table is read from its Delta log with delta-rs (no JVM) at its current version and validated in an
ephemeral GE context; the report names every failed expectation with how many rows break it and a few of
their values. ``eventlake check`` and the ``check_read_models`` DAG call ``check_tables``/``verdict``. The table
is the read model's current generation (eventlake/catalog.py), or the generation given (a rebuild checks its new
generation before switching).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from deltalake.exceptions import TableNotFoundError

from eventlake.catalog import Catalog, Generation
from eventlake.settings import Settings
from eventlake.tables import read_table
from expectations import SUITES, suite_module

__all__ = ["CheckReport", "Failure", "Verdict", "check_table", "check_tables", "context", "verdict", "TableMissing"]


class TableMissing(LookupError):
    """The read model's table has not been created yet (no projection has written it)."""


@dataclass(frozen=True)
class Failure:
    expectation: str
    arguments: str
    unexpected: int | None
    examples: tuple

    def line(self) -> str:
        count = "" if self.unexpected is None else f": {self.unexpected} row{'s' if self.unexpected != 1 else ''}"
        examples = f", e.g. {', '.join(map(repr, self.examples))}" if self.examples else ""
        return f"{self.expectation}({self.arguments}){count}{examples}"


@dataclass(frozen=True)
class CheckReport:
    table: str
    path: Path
    delta_version: int
    rows: int
    evaluated: int
    failures: tuple[Failure, ...] = field(default_factory=tuple)

    @property
    def success(self) -> bool:
        return not self.failures

    def lines(self) -> list[str]:
        outcome = (f"passed all {self.evaluated} expectations" if self.success
                   else f"FAILED {len(self.failures)} of {self.evaluated} expectations")
        head = f"{self.table}: {outcome} on {self.rows:,} rows (Delta version {self.delta_version} of {self.path})"
        return [head] + [f"  failed: {f.line()}" for f in self.failures]


def context():
    """(the great_expectations module, an ephemeral GE context): made once, used for several tables."""
    # GE logs its own progress and usage reporting; the report below says what matters.
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ge_context = gx.get_context(mode="ephemeral")
    ge_context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return gx, ge_context


def check_table(settings: Settings, name: str, ge=None, generation: Generation | None = None) -> CheckReport:
    """Validate the current version of read model ``name``'s Delta table (its current generation, or
    ``generation``) against its suite."""
    from deltalake import DeltaTable

    module = suite_module(name)
    generation = generation or Catalog(settings).current(name)
    path = generation.table
    try:
        table = DeltaTable(str(path))
    except TableNotFoundError:
        raise TableMissing(f"read model {name}: no Delta table at {path} yet; run the projection first "
                           f"(eventlake project, or eventlake demo)") from None
    frame = read_table(table).to_pandas()
    if hasattr(module, "derived_columns"):
        module.derived_columns(frame)
    gx, ge_context = ge or context()
    source = ge_context.data_sources.add_or_update_pandas(f"eventlake-{name}")
    asset = source.add_dataframe_asset(name=name)
    batch = asset.add_batch_definition_whole_dataframe("current").get_batch(batch_parameters={"dataframe": frame})
    suite = gx.ExpectationSuite(name=name, expectations=module.expectations(gx))
    result = batch.validate(suite, result_format={"result_format": "SUMMARY", "partial_unexpected_count": 3})
    failures = []
    for r in result.results:
        if r.success:
            continue
        config = r.expectation_config
        error = (r.exception_info or {}).get("exception_message")
        details = r.result or {}
        failures.append(Failure(config.type, _arguments(config.kwargs) + (f"; error: {error}" if error else ""),
                                details.get("unexpected_count"),
                                tuple(_plain(v) for v in details.get("partial_unexpected_list") or ())))
    return CheckReport(name, path, table.version(), len(frame), len(result.results), tuple(failures))


def _arguments(kwargs: dict) -> str:
    """An expectation's arguments, short: long value lists cut, the row condition as its expression."""
    parts = []
    for name, value in kwargs.items():
        if name in ("batch_id", "result_format", "condition_parser") or value is None:
            continue
        if name == "row_condition":
            if isinstance(value, dict) and {"column", "operator", "parameter"} <= value.keys():
                value = f"{value['column'].get('name')} {value['operator']} {value['parameter']!r}"
            parts.append(f"where {value}")
            continue
        if isinstance(value, (list, tuple)) and len(value) > 6:
            value = f"[{', '.join(map(repr, value[:5]))}, ... {len(value)} values]"
        else:
            value = repr(value)
        parts.append(f"{name}={value}")
    return ", ".join(parts)


def _plain(value):
    """numpy scalars (and tuples/dicts of them) as plain Python values, for a readable report."""
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def check_tables(settings: Settings, names: list[str] | None = None) -> list[CheckReport]:
    """Check the named read models (all with a suite when ``names`` is empty); raises TableMissing for a
    table not created yet."""
    ge = context()
    return [check_table(settings, name, ge) for name in (names or list(SUITES))]


@dataclass(frozen=True)
class Verdict:
    """All that is known of one read model's table: its suite's report (None when the table does not exist
    yet) and, when asked for, its reconciliation with the log."""
    table: str
    report: CheckReport | None
    reconciliation: object | None = None  # expectations.reconciliation.Reconciliation
    missing: str = ""

    @property
    def differs(self) -> bool:
        r = self.reconciliation
        return r is not None and r.compared and not r.success

    @property
    def failed(self) -> bool:
        """The table is missing, breaks an expectation or differs from the log (a reconciliation that could
        not compare yet is no failure)."""
        return self.report is None or not self.report.success or self.differs

    def lines(self) -> list[str]:
        out = [f"{self.table}: not checked: {self.missing}"] if self.report is None else self.report.lines()
        return out + (self.reconciliation.lines() if self.reconciliation is not None else [])

    def summary(self) -> dict:
        r = self.reconciliation
        return {"table": self.table, "rows": None if self.report is None else self.report.rows,
                "delta_version": None if self.report is None else self.report.delta_version,
                "expectations_failed": None if self.report is None else len(self.report.failures),
                "reconciled": None if r is None or not r.compared else r.success}


def verdict(settings: Settings, name: str, reconcile: bool = False, ge=None,
            generation: Generation | None = None) -> Verdict:
    """Check read model ``name`` (its current generation, or ``generation``) against its suite and, with
    ``reconcile``, against a fold of the log. Both look at the same generation, resolved once."""
    generation = generation or Catalog(settings).current(name)
    try:
        report = check_table(settings, name, ge, generation)
    except TableMissing as e:
        return Verdict(name, None, missing=str(e))
    if not reconcile:
        return Verdict(name, report)
    from expectations.reconciliation import reconcile as reconcile_table

    return Verdict(name, report, reconcile_table(settings, name, generation=generation))
