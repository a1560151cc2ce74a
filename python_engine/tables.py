"""A projection's tables (``projection_core.plan``) created with delta-rs: no JVM."""
from __future__ import annotations

from pathlib import Path

from projection_core.plan import ARCHIVE, ARCHIVE_STATS_COLUMNS, DEAD_LETTERS, HELD, LEDGER, ProjectionPlan
from spark_apps import sequence
from spark_apps.event_rows import event_row_schema

__all__ = ["Tables"]


class Tables:
    """A projection's tables (``ProjectionPlan``) created with delta-rs (no JVM), each the first time it is met."""

    def __init__(self, plan: ProjectionPlan):
        self.plan = plan
        self._ensured: set[tuple[str, int]] = set()  # (model, generation) whose tables exist

    def ensure_tables(self) -> None:
        from spark_apps.archive_fold import arrow_schema
        from spark_apps.spark_projection import dead_letter_schema

        rows = event_row_schema()
        schemas = {DEAD_LETTERS: (arrow_schema(dead_letter_schema()), None), ARCHIVE: (rows, ARCHIVE_STATS_COLUMNS),
                   LEDGER: (arrow_schema(sequence.ledger_schema()), ("aggregate_id",)), HELD: (rows, None)}
        for name, kind in self.plan.fixed_tables().items():
            _ensure(self.plan.settings.table_path(name), *schemas[kind])
        if self.plan.models:
            self.ensure_generation_tables(self.plan.resolve())

    def ensure_generation_tables(self, generations) -> None:
        from spark_apps.archive_fold import arrow_schema
        from spark_apps.merge import bookkeeping_tables

        for model, generation in self.plan.units(generations):
            if (model.name, generation.number) in self._ensured:
                continue
            _ensure(generation.table, arrow_schema(model.schema()), tuple(model.stats_columns or model.key))
            for path, schema in bookkeeping_tables(model, _SparkRowsSchema, generation).items():
                _ensure(path, event_row_schema() if schema is _SparkRowsSchema else arrow_schema(schema), None)
            self._ensured.add((model.name, generation.number))

    def generations_for_batch(self, batch_id: int):
        """The generations batch ``batch_id`` writes (``ProjectionPlan.generations_for_batch``), their tables
        created if missing."""
        generations = self.plan.generations_for_batch(batch_id)
        self.ensure_generation_tables(generations)
        return generations


def add_missing_columns(table, schema) -> list[str]:
    """Add to the Delta ``table`` (delta-rs) the fields of the Arrow ``schema`` it lacks, nullable -> their names."""
    import pyarrow as pa
    from deltalake.schema import Schema

    have = {f.name for f in pa.schema(table.schema().to_arrow())}
    missing = [f.with_nullable(True) for f in schema if f.name not in have]
    if missing:
        table.alter.add_columns(list(Schema.from_arrow(pa.schema(missing)).fields))
    return [f.name for f in missing]


_SparkRowsSchema = object()  # stands for the event rows' schema in merge.bookkeeping_tables


def _ensure(path, schema, stats_columns) -> None:
    """Create the table if missing; a table made by an older release gains the columns added to ``schema`` since
    (nullable, at the end: "add columns freely", docs/DESIGN.md), so the MERGEs naming them find them."""
    from deltalake import DeltaTable

    if DeltaTable.is_deltatable(str(path)):
        add_missing_columns(DeltaTable(str(path)), schema)
        return
    configuration = {"delta.dataSkippingStatsColumns": ",".join(stats_columns)} if stats_columns else None
    Path(str(path)).mkdir(parents=True, exist_ok=True)
    DeltaTable.create(str(path), schema, mode="ignore", configuration=configuration)
