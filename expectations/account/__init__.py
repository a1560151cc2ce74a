"""Great Expectations suites of the card-account domain's read models (``read_models.account``), one module each
(``TABLE``, ``expectations(gx)``, optionally ``derived_columns(df)``).

``SUITES`` collects them, in the order of the domain's ``MODELS``.
"""
from __future__ import annotations

from types import ModuleType

from expectations.account import (account_summary, category_minute_volume, fraud_alerts, merchant_minute_volume,
                                  payments)

__all__ = ["SUITES"]

SUITES: dict[str, ModuleType] = {m.TABLE: m for m in (account_summary, payments, merchant_minute_volume, fraud_alerts,
                                                      category_minute_volume)}
