"""Reference data from outside the log (issue 46): merchants extracted from landed files (CSV, JSON lines; a local
folder or a storage URI) and SQL databases, staged as Delta, checked by their Great Expectations suite, and kept as
SCD type 2 history in ``dim_merchant`` with delta-rs and DuckDB (no JVM: Airflow workers and tests stay light).

``reference_data.loads`` runs a load (``load_merchants``) and its steps (``stage``, ``check``, ``merge``);
``extract`` reads the sources; ``scd2`` plans and applies the MERGE; ``merchants`` says what a merchant is.
docs/reference_data.md is the operator's page.
"""
from __future__ import annotations

__all__ = ["extract", "loads", "merchants", "scd2"]
