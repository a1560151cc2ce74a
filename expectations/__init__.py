"""Great Expectations suites, one module per read model (``TABLE``, ``expectations(gx)`` and optionally
``derived_columns(df)``), and the runner that checks the Delta tables against them (``expectations.checks``).

A new read model adds one module here and one line to ``SUITES``; ``tests/unit/test_expectations.py`` fails
for a read model without a suite.
"""
from __future__ import annotations

from types import ModuleType

from expectations import account_summary, fraud_alerts, merchant_minute_volume, payments

__all__ = ["SUITES", "suite_module"]

SUITES: dict[str, ModuleType] = {m.TABLE: m for m in (account_summary, payments, merchant_minute_volume,
                                                       fraud_alerts)}


def suite_module(name: str) -> ModuleType:
    try:
        return SUITES[name]
    except KeyError:
        raise KeyError(f"no expectation suite for {name!r}; suites: {', '.join(SUITES)}") from None
