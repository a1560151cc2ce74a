"""Check read model tables against their Great Expectations suites.

The table is read from its Delta log with delta-rs (no JVM) at its current version and validated in an
ephemeral GE context; the report names every failed expectation with how many rows break it and a few of
their values. ``eventlake check`` and the ``check_read_models`` DAG call ``check_tables``/``verdict``. The table
is the read model's current generation (read_models/catalog.py), or the generation given (a rebuild checks its new
generation before switching).

Every check is also published to Great Expectations **Data Docs**, a static HTML site under the eventlake home:
``<home>/data_docs/index.html`` lists every suite's recent validations (newest first, the generation and Delta
version in the run name); each links to a page with every expectation and its result. The validation results and
suites behind it are kept as JSON under ``<home>/gx`` (the last ``KEEP_VALIDATIONS`` per suite). A check's report
names the page; a failure to write the docs is reported, never a reason for the check to fail.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from deltalake.exceptions import TableNotFoundError

from expectations import SUITES, data_docs_assets, suite_module
from lakehouse.lineage import Assertion
from lakehouse.settings import Settings
from lakehouse.storage import delta_table
from lakehouse.tables import read_table
from read_models.catalog import ARCHIVE_TABLE, Catalog, Generation
from lakehouse.errors import NotFound

__all__ = ["CheckReport", "Failure", "Verdict", "check_table", "check_tables", "context", "data_docs_index", "verdict",
           "TableMissing", "KEEP_VALIDATIONS"]

KEEP_VALIDATIONS = 20  # per suite: older validation results (and their pages) are deleted when a new one comes


class TableMissing(NotFound, LookupError):
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
    data_docs: str = ""  # the Data Docs page of this validation ("" when not published)
    data_docs_index: str = ""  # the site's front page (every suite)
    data_docs_problem: str = ""
    # Every expectation evaluated, held or not (the run's data-quality facets: lakehouse.lineage.checked).
    assertions: tuple[Assertion, ...] = field(default_factory=tuple)

    @property
    def success(self) -> bool:
        return not self.failures

    def lines(self) -> list[str]:
        outcome = (f"passed all {self.evaluated} expectations" if self.success
                   else f"FAILED {len(self.failures)} of {self.evaluated} expectations")
        head = f"{self.table}: {outcome} on {self.rows:,} rows (Delta version {self.delta_version} of {self.path})"
        docs = ([f"  data docs: {self.data_docs_index} (this validation: {self.data_docs})"] if self.data_docs
                else []) + (
            [f"  data docs not written: {self.data_docs_problem}"] if self.data_docs_problem else [])
        return [head] + [f"  failed: {f.line()}" for f in self.failures] + docs


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


def check_table(settings: Settings, name: str, ge=None, generation: Generation | None = None,
                data_docs: bool = True) -> CheckReport:
    """Validate the current version of read model ``name``'s Delta table (its current generation, or
    ``generation``) against its suite; with ``data_docs``, publish the result to the Data Docs site."""
    module = suite_module(name)
    generation = generation or Catalog(settings).current(name)
    path = generation.table
    try:
        table = delta_table(path)
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
    failures, assertions = [], []
    for r in result.results:
        config = r.expectation_config
        column = config.kwargs.get("column")
        column = column if isinstance(column, str) else None
        if r.success:
            assertions.append(Assertion(config.type, True, column))
            continue
        error = (r.exception_info or {}).get("exception_message")
        details = r.result or {}
        failure = Failure(config.type, _arguments(config.kwargs) + (f"; error: {error}" if error else ""),
                          details.get("unexpected_count"),
                          tuple(_plain(v) for v in details.get("partial_unexpected_list") or ()))
        failures.append(failure)
        assertions.append(Assertion(config.type, False, column, failure.line()[len(config.type):]))
    docs, problem = "", ""
    if data_docs:
        try:
            docs = _publish_data_docs(settings, gx, name, module, result, generation, table.version())
        except Exception as e:  # noqa: BLE001 -- the check's verdict stands without its HTML page
            problem = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    return CheckReport(name, path, table.version(), len(frame), len(result.results), tuple(failures), docs,
                       str(data_docs_index(settings)) if docs else "", problem, tuple(assertions))


def data_docs_index(settings: Settings) -> Path:
    """The Data Docs site's front page: every suite's recent validations."""
    return settings.data_docs / "index.html"


def _docs_context(settings: Settings):
    """A GE context whose suites and validation results are JSON files under ``<home>/gx`` and whose one Data Docs
    site is ``<home>/data_docs``: what several processes (the DAG's tasks, a shell) add to and build from."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import DataContextConfig, InMemoryStoreBackendDefaults

    stores = settings.check_results
    config = DataContextConfig(store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False))
    filesystem = lambda folder: {"class_name": "TupleFilesystemStoreBackend",  # noqa: E731
                                 "base_directory": str(folder)}
    config.stores["validation_results_store"] = {"class_name": "ValidationResultsStore",
                                                 "store_backend": filesystem(stores / "validations")}
    config.stores["expectations_store"] = {"class_name": "ExpectationsStore",
                                           "store_backend": filesystem(stores / "expectations")}
    config.data_docs_sites = {"eventlake": {
        "class_name": "SiteBuilder", "show_how_to_buttons": False,
        "store_backend": filesystem(settings.data_docs),
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"}}}
    return gx.get_context(project_config=config)


def _publish_data_docs(settings: Settings, gx, name: str, module, result, generation: Generation,
                       version: int) -> str:
    """Store one validation result (and its suite) and rebuild its page and the index -> the page's path."""
    import datetime as dt

    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (ExpectationSuiteIdentifier,
                                                                            ValidationResultIdentifier)

    docs = _docs_context(settings)
    docs.suites.add_or_update(gx.ExpectationSuite(name=name, expectations=module.expectations(gx)))
    suite_key = ExpectationSuiteIdentifier(name)
    key = ValidationResultIdentifier(suite_key, RunIdentifier(run_name=f"{generation.label}-v{version}",
                                                              run_time=dt.datetime.now(dt.timezone.utc)),
                                     name)
    docs.validation_results_store.set(key, result)
    _prune_validations(settings, name)
    docs.build_data_docs(resource_identifiers=[key, suite_key])
    folder = settings.data_docs
    data_docs_assets.localise(folder, settings.cache_dir, log=_say_once)
    pages = sorted((folder / "validations" / name).glob(f"{generation.label}-v{version}/*/{name}.html"),
                   key=lambda p: p.stat().st_mtime)
    return str(pages[-1] if pages else data_docs_index(settings))


_said: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        print(message, flush=True)


def _prune_validations(settings: Settings, name: str) -> None:
    """Keep the newest KEEP_VALIDATIONS results of suite ``name`` (and their pages): the index stays short."""
    import shutil

    root = settings.check_results / "validations" / name
    results = sorted(root.glob("*/*/*.json"), key=lambda p: p.parent.name)  # run_time folders sort by time
    for stale in results[:-KEEP_VALIDATIONS]:
        relative = stale.parent.relative_to(root)
        shutil.rmtree(stale.parent, ignore_errors=True)
        shutil.rmtree(settings.data_docs / "validations" / name / relative, ignore_errors=True)


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


def check_tables(settings: Settings, names: list[str] | None = None, data_docs: bool = True) -> list[CheckReport]:
    """Check the named read models (all with a suite when ``names`` is empty); raises TableMissing for a
    table not created yet."""
    ge = context()
    return [check_table(settings, name, ge, data_docs=data_docs) for name in (names or list(SUITES))]


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

    def samples(self) -> list:
        """Its Prometheus figures (``lakehouse.metrics.push``, labelled by table): passed (1) or failed (0), the
        expectations that passed and failed, the rows checked, and when (Unix time)."""
        import time

        from lakehouse.metrics import Sample

        which = {"table": self.table}
        evaluated = 0 if self.report is None else self.report.evaluated
        failed = 0 if self.report is None else len(self.report.failures)
        return [Sample("check_success", "gauge", "1 when the table passed its checks, 0 when it failed", 0.0 if
                       self.failed else 1.0, which),
                Sample("check_expectations", "gauge", "Expectations of the last check, by result",
                       evaluated - failed, {**which, "result": "passed"}),
                Sample("check_expectations", "gauge", "Expectations of the last check, by result", failed,
                       {**which, "result": "failed"}),
                Sample("check_rows", "gauge", "Rows of the table checked", 0 if self.report is None
                       else self.report.rows, which),
                Sample("check_last_run_timestamp_seconds", "gauge", "When the last check ran (Unix time)",
                       time.time(), which)]

    def summary(self) -> dict:
        r = self.reconciliation
        return {"table": self.table, "rows": None if self.report is None else self.report.rows,
                "delta_version": None if self.report is None else self.report.delta_version,
                "expectations_failed": None if self.report is None else len(self.report.failures),
                "reconciled": None if r is None or not r.compared else r.success}


def verdict(settings: Settings, name: str, reconcile: bool = False, ge=None,
            generation: Generation | None = None, data_docs: bool = True) -> Verdict:
    """Check read model ``name`` (its current generation, or ``generation``) against its suite and, with
    ``reconcile``, against a fold of the log. Both look at the same generation, resolved once."""
    from lakehouse.lineage import Lineage, checked, table

    generation = generation or Catalog(settings).current(name)
    # Its OpenLineage run (lakehouse.lineage): the generation's table in (and the archive, reconciling), the Data
    # Docs site out; its COMPLETE gives the table's rows and every expectation, held or not, as OpenLineage's
    # data-quality facets. A check that finds bad rows still completes: the verdict is its result, not an error.
    inputs = [table(generation.table)] + ([table(settings.table_path(ARCHIVE_TABLE))] if reconcile else [])
    outputs = [table(data_docs_index(settings).parent)] if data_docs else []
    lineage = Lineage.for_settings(settings)
    run = lineage.start(f"check.{name}", inputs, outputs, job_type="JOB")
    try:
        try:
            report = check_table(settings, name, ge, generation, data_docs)
        except TableMissing as e:
            result = Verdict(name, None, missing=str(e))
        else:
            from expectations.reconciliation import reconcile as reconcile_table

            result = Verdict(name, report, reconcile_table(settings, name, generation=generation) if reconcile
                             else None)
            inputs[0] = checked(inputs[0], report.rows, report.assertions)
    except BaseException as e:
        lineage.fail(run, e)
        raise
    lineage.complete(run, inputs)
    return result
