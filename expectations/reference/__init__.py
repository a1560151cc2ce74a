"""Great Expectations suites of reference data (``reference_data``): each checks a *staged batch* before it is
merged into its dimension, not a read model, so they are not in ``expectations.SUITES`` (what ``eventlake check``
and the ``check_read_models`` DAG run over). Same shape as the read models' suites: ``TABLE``,
``expectations(gx)``.
"""
from __future__ import annotations

from types import ModuleType

from expectations.reference import merchants

__all__ = ["REFERENCE_SUITES"]

REFERENCE_SUITES: dict[str, ModuleType] = {merchants.TABLE: merchants}
