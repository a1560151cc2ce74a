"""A projection's tables (``projection_core.plan``) created with delta-rs: no JVM."""
from __future__ import annotations

from lakehouse.tables import ensure_table
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
        from spark_apps.arrow_rows import arrow_schema
        from spark_apps.spark_projection import dead_letter_schema

        rows = event_row_schema()
        schemas = {DEAD_LETTERS: (arrow_schema(dead_letter_schema()), None), ARCHIVE: (rows, ARCHIVE_STATS_COLUMNS),
                   LEDGER: (arrow_schema(sequence.ledger_schema()), ("aggregate_id",)), HELD: (rows, None)}
        for name, kind in self.plan.fixed_tables().items():
            ensure_table(self.plan.settings.table_path(name), *schemas[kind])
        if self.plan.models:
            self.ensure_generation_tables(self.plan.resolve())

    def ensure_generation_tables(self, generations) -> None:
        from spark_apps.arrow_rows import arrow_schema
        from spark_apps.merge import bookkeeping_tables

        for model, generation in self.plan.units(generations):
            if (model.name, generation.number) in self._ensured:
                continue
            ensure_table(generation.table, arrow_schema(model.schema()), tuple(model.stats_columns or model.key))
            for path, schema in bookkeeping_tables(model, _SparkRowsSchema, generation).items():
                ensure_table(path, event_row_schema() if schema is _SparkRowsSchema else arrow_schema(schema), None)
            self._ensured.add((model.name, generation.number))

    def generations_for_batch(self, batch_id: int):
        """The generations batch ``batch_id`` writes (``ProjectionPlan.generations_for_batch``), their tables
        created if missing."""
        generations = self.plan.generations_for_batch(batch_id)
        self.ensure_generation_tables(generations)
        return generations


_SparkRowsSchema = object()  # stands for the event rows' schema in merge.bookkeeping_tables

