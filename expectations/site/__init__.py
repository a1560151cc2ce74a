"""Great Expectations suites of the site domain's read models (``read_models.site``), one module each, in the
shape of ``expectations``' own (``TABLE``, ``expectations(gx)``, optionally ``derived_columns(df)``).

``SUITES`` collects them; ``expectations.SUITES`` includes them (docs/DESIGN.md, "Adding a domain"). The domain
has no cross-model check (``CROSS_MODEL_CHECKS``: see ``expectations.account``).
"""
from __future__ import annotations

from types import ModuleType

from expectations.cross_model import CrossModelCheck
from expectations.site import page_minute_clicks

__all__ = ["SUITES", "CROSS_MODEL_CHECKS"]

SUITES: dict[str, ModuleType] = {m.TABLE: m for m in (page_minute_clicks,)}
CROSS_MODEL_CHECKS: dict[str, CrossModelCheck] = {}
