"""Great Expectations suites of the card-account domain's read models (``read_models.account``), one module each
(``TABLE``, ``expectations(gx)``, optionally ``derived_columns(df)``).

``SUITES`` collects them, in the order of the domain's ``MODELS``; ``CROSS_MODEL_CHECKS`` the domain's checks that
read models derived from the same events agree (``expectations.cross_model``), one module each.
"""
from __future__ import annotations

from types import ModuleType

from expectations.account import (account_summary, category_minute_volume, fraud_alerts, merchant_minute_volume,
                                  payments, payments_match_account_summary)
from expectations.cross_model import CrossModelCheck

__all__ = ["SUITES", "CROSS_MODEL_CHECKS"]

SUITES: dict[str, ModuleType] = {m.TABLE: m for m in (account_summary, payments, merchant_minute_volume, fraud_alerts,
                                                      category_minute_volume)}
CROSS_MODEL_CHECKS: dict[str, CrossModelCheck] = {c.name: c for c in (payments_match_account_summary.CHECK,)}
