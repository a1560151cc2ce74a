"""Great Expectations suites of the site domain's read models (``read_models.site``), one module each, in the
shape of ``expectations``' own (``TABLE``, ``expectations(gx)``, optionally ``derived_columns(df)``).

``SUITES`` collects them; ``expectations.SUITES`` includes them (docs/DESIGN.md, "Adding a domain").
"""
from __future__ import annotations

from types import ModuleType

from expectations.site import page_minute_clicks

__all__ = ["SUITES"]

SUITES: dict[str, ModuleType] = {m.TABLE: m for m in (page_minute_clicks,)}
