"""A merchants load, step by step: stage -> check -> merge (or quarantine), with its ledger.

- ``stage``: the source streamed into a Delta table of its own (``MERCHANT_STAGING/<load_id>``), its content hash
  known at the end. A source that cannot be read as merchants (``MerchantInputError``) stages nothing; its report
  goes to the quarantine (``MERCHANT_QUARANTINE/<load_id>/report.json``) and the error names it.
- ``check``: the staged batch against its Great Expectations suite (``expectations.reference.merchants``). A batch
  that fails is quarantined, its rows and its report together, and nothing is merged (``MerchantsRefused``).
- ``merge``: the SCD2 MERGE into ``dim_merchant`` (``reference_data.scd2``), then a ledger row (``MERCHANT_LOADS_TABLE``)
  keyed by the content hash. A content hash already in the ledger is not loaded again ("already loaded"): the same
  file twice loads once. (Were a process to die between the MERGE and its ledger row, the rerun's MERGE finds every
  row unchanged: the dimension is the same either way.)

The source file is never moved nor deleted: nothing is lost. The CLI runs the steps in one process
(``load_merchants``); the ``load_merchants`` DAG runs each as a task, passing the ``Staged`` summary along.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from urllib.parse import urlsplit

from lakehouse.errors import CheckFailed
from lakehouse.lineage import Dataset, Lineage, database, table
from lakehouse.settings import Settings
from lakehouse.storage import delta_table, remove_tree, storage_options
from read_models.catalog import DIM_MERCHANT_TABLE, MERCHANT_LOADS_TABLE, MERCHANT_QUARANTINE, MERCHANT_STAGING
from reference_data.extract import DATABASE_SCHEMES, DEFAULT_TABLE, source_for
from reference_data.merchants import MerchantInputError, staged_schema
from reference_data.scd2 import apply_plan, current_versions, plan_changes

__all__ = ["Staged", "LoadReport", "MerchantsRefused", "new_load_id", "stage", "check", "merge", "load_merchants",
           "loaded_before", "quarantine_folder", "landing_folder", "newest_landed", "LANDED_MARKER", "source_dataset"]

# The file a producer writes into the landing folder after its merchants file(s): what the load_merchants DAG's
# AssetWatcher waits for (Airflow's file triggers delete the file they find, so they watch this flag, never the data).
LANDED_MARKER = "_READY"


class MerchantsRefused(CheckFailed):
    """A staged batch failed its suite: quarantined with its report, nothing merged."""

    def __init__(self, message: str, lines: list[str]):
        super().__init__(message)
        self.lines = lines


@dataclass(frozen=True)
class Staged:
    """A staged batch: what the check and the merge steps are handed (JSON-able, for Airflow's XCom)."""
    load_id: str
    source: str
    content_hash: str
    rows: int
    bytes_read: int
    path: str
    full: bool
    as_of: str  # ISO-8601 UTC: the load's time, valid_from of what it opens and valid_to of what it closes


@dataclass
class LoadReport:
    load_id: str
    source: str
    status: str  # "loaded" | "already loaded"
    rows: int
    full: bool
    version: int | None
    counts: dict = field(default_factory=dict)
    table: str = ""
    previous_load: str = ""

    def lines(self) -> list[str]:
        if self.status == "already loaded":
            return [f"merchants: {self.source}: already loaded (load {self.previous_load}, same content); "
                    f"dim_merchant unchanged at Delta version {self.version}"]
        c = self.counts
        return [f"merchants: {self.source}: {self.rows:,} rows{' (full extract)' if self.full else ''} -> "
                f"{c.get('inserted', 0)} inserted, {c.get('changed', 0)} changed, {c.get('closed', 0)} closed, "
                f"{c.get('unchanged', 0)} unchanged; dim_merchant at Delta version {self.version} ({self.table}); "
                f"load {self.load_id}"]

    def summary(self) -> dict:
        return asdict(self)


def new_load_id(now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return f"{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


def quarantine_folder(settings: Settings, load_id: str):
    return settings.table_path(MERCHANT_QUARANTINE) / load_id


def _write_report(settings: Settings, load_id: str, report: dict) -> str:
    folder = quarantine_folder(settings, load_id)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "report.json"
    target.write_text(json.dumps(report, indent=2, default=str))
    return str(target)


def stage(settings: Settings, source_text: str, full: bool = False, load_id: str | None = None,
          as_of: datetime | None = None, source=None) -> Staged:
    """Stream the source into its staging table. ``source`` (an ``extract`` source) overrides ``source_text``
    (e.g. a DatabaseSource on an Airflow hook's connection)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    as_of = as_of or datetime.now(timezone.utc)
    load_id = load_id or new_load_id(as_of)
    path = settings.table_path(MERCHANT_STAGING) / load_id
    refused: list[MerchantInputError] = []

    def batches():
        try:
            yield from source.batches()
        except MerchantInputError as e:
            refused.append(e)  # delta-rs' writer re-raises what its reader raised as a DeltaError of its own
            raise

    try:
        source = source or source_for(source_text, settings.reference_max_bytes, settings.storage_options)
        reader = pa.RecordBatchReader.from_batches(staged_schema(), batches())
        try:
            write_deltalake(str(path), reader, mode="error", storage_options=storage_options(path))
        except Exception:
            if refused:
                raise refused[0] from None
            raise
    except MerchantInputError as e:
        remove_tree(path)
        report = _write_report(settings, load_id, {"load_id": load_id, "source": source_text, "stage": "extract",
                                                   "reason": str(e), "at": as_of.isoformat()})
        raise MerchantInputError(f"{e} (report: {report})") from None
    rows = delta_table(path).to_pyarrow_dataset().count_rows()
    return Staged(load_id, source.name, source.content_hash, rows, source.bytes_read, str(path), full,
                  as_of.isoformat())


def check(settings: Settings, staged: Staged) -> list[str]:
    """Validate the staged batch against its suite -> the failures (empty: it passed). A failing batch is
    quarantined (its rows and report.json) and ``MerchantsRefused`` raised."""
    from expectations.checks import context
    from expectations.reference import merchants as suite
    from lakehouse.tables import read_table

    frame = read_table(staged.path).to_pandas()
    gx, ge_context = context()
    data = ge_context.data_sources.add_or_update_pandas(f"eventlake-{suite.TABLE}")
    asset = data.add_dataframe_asset(name=f"{suite.TABLE}-{staged.load_id}")
    batch = asset.add_batch_definition_whole_dataframe("staged").get_batch(batch_parameters={"dataframe": frame})
    result = batch.validate(gx.ExpectationSuite(name=suite.TABLE, expectations=suite.expectations(gx)),
                            result_format={"result_format": "SUMMARY", "partial_unexpected_count": 5})
    failures = []
    for r in result.results:
        if r.success:
            continue
        details = r.result or {}
        examples = ", ".join(repr(v) for v in details.get("partial_unexpected_list") or ())
        column = r.expectation_config.kwargs.get("column", "")
        failures.append(f"{r.expectation_config.type}({column}): {details.get('unexpected_count', '?')} row(s)"
                        + (f", e.g. {examples}" if examples else ""))
    if failures:
        target = quarantine_folder(settings, staged.load_id)
        from deltalake import write_deltalake

        write_deltalake(str(target / "batch"), read_table(staged.path), mode="overwrite",
                        storage_options=storage_options(target))
        report = _write_report(settings, staged.load_id, {**asdict(staged), "stage": "check", "failures": failures,
                                                          "rows_kept": str(target / "batch")})
        remove_tree(settings.table_path(MERCHANT_STAGING) / staged.load_id)
        raise MerchantsRefused(f"merchants: {staged.source}: the batch failed {len(failures)} expectation(s) of "
                               f"suite {suite.TABLE}; quarantined with its report ({report}); nothing loaded",
                               failures)
    return failures


def loaded_before(settings: Settings, content_hash: str) -> dict | None:
    """The ledger row of an earlier load of the same content, if any."""
    from lakehouse.tables import TableNotFound, read_table

    try:
        rows = read_table(settings.table_path(MERCHANT_LOADS_TABLE), filters=[("content_hash", "=", content_hash)])
    except (TableNotFound, FileNotFoundError):
        return None
    found = rows.to_pylist()
    return found[-1] if found else None


def source_dataset(source: str) -> Dataset:
    """The lineage dataset of a merchants source (a ``Staged.source``: a file, a storage URI or a database URL)."""
    scheme = urlsplit(source).scheme.split("+")[0]
    if scheme in DATABASE_SCHEMES:
        return database(source, DEFAULT_TABLE)
    return table(source)


def merge(settings: Settings, staged: Staged) -> LoadReport:
    """The SCD2 MERGE of a checked batch and its ledger row; a content hash already loaded merges nothing. Its
    OpenLineage run (lakehouse.lineage): the source in, ``dim_merchant`` and the loads ledger out."""
    lineage = Lineage.for_settings(settings)
    with lineage.running("load_merchants", [source_dataset(staged.source)],
                         [table(settings.table_path(DIM_MERCHANT_TABLE)),
                          table(settings.table_path(MERCHANT_LOADS_TABLE))]):
        return _merge(settings, staged)


def _merge(settings: Settings, staged: Staged) -> LoadReport:
    import pyarrow as pa
    from deltalake import write_deltalake

    table_path = settings.table_path(DIM_MERCHANT_TABLE)
    earlier = loaded_before(settings, staged.content_hash)
    if earlier is not None:
        remove_tree(settings.table_path(MERCHANT_STAGING) / staged.load_id)
        _, version = current_versions(table_path)
        return LoadReport(staged.load_id, staged.source, "already loaded", staged.rows, staged.full, version,
                          table=str(table_path), previous_load=earlier["load_id"])
    from lakehouse.tables import read_table

    as_of = datetime.fromisoformat(staged.as_of)
    current, _ = current_versions(table_path)
    plan = plan_changes(current, read_table(staged.path), staged.full, as_of, staged.load_id)
    version = apply_plan(table_path, plan, as_of, staged.load_id)
    ledger = settings.table_path(MERCHANT_LOADS_TABLE)
    row = {"load_id": staged.load_id, "content_hash": staged.content_hash, "source": staged.source,
           "rows": staged.rows, "full": staged.full, "as_of": as_of, "dim_version": version,
           "at": datetime.now(timezone.utc), **plan.counts()}
    schema = pa.schema([("load_id", pa.string()), ("content_hash", pa.string()), ("source", pa.string()),
                        ("rows", pa.int64()), ("full", pa.bool_()), ("as_of", pa.timestamp("us", tz="UTC")),
                        ("dim_version", pa.int64()), ("at", pa.timestamp("us", tz="UTC")),
                        *[(k, pa.int64()) for k in plan.counts()]])
    write_deltalake(str(ledger), pa.Table.from_pylist([row], schema=schema), mode="append",
                    storage_options=storage_options(ledger))
    remove_tree(settings.table_path(MERCHANT_STAGING) / staged.load_id)
    return LoadReport(staged.load_id, staged.source, "loaded", staged.rows, staged.full, version, plan.counts(),
                      str(table_path))


def load_merchants(settings: Settings, source_text: str, full: bool = False, as_of: datetime | None = None,
                   source=None) -> LoadReport:
    """Extract, stage, check and merge one merchants source (a file, a storage URI or a database URL)."""
    staged = stage(settings, source_text, full=full, as_of=as_of, source=source)
    if loaded_before(settings, staged.content_hash) is None:
        check(settings, staged)
    return merge(settings, staged)


def landing_folder(settings: Settings):
    """Where merchants files land by default: ``<home>/landing/merchants``."""
    return settings.home / "landing" / "merchants"


def newest_landed(settings: Settings) -> str | None:
    """The newest merchants file in the landing folder (by name: producers name files by time), or None."""
    from reference_data.extract import FILE_FORMATS

    folder = landing_folder(settings)
    if not folder.is_dir():
        return None
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in FILE_FORMATS and not p.name.startswith("."))
    return str(files[-1]) if files else None
