"""Great Expectations suites, one module per read model in its domain's folder (``expectations.account``:
``TABLE``, ``expectations(gx)`` and optionally ``derived_columns(df)``), and the runner that checks the Delta
tables against them (``expectations.checks``).

A new read model adds one module to its domain's folder and to that folder's ``SUITES``; ``SUITES`` here collects
the registered domains'. ``tests/unit/test_expectations.py`` fails for a read model without a suite.
"""
from __future__ import annotations

from types import ModuleType

from expectations import account, iot, site

__all__ = ["SUITES", "suite_module"]

SUITES: dict[str, ModuleType] = {**account.SUITES, **iot.SUITES, **site.SUITES}


def suite_module(name: str) -> ModuleType:
    try:
        return SUITES[name]
    except KeyError:
        raise KeyError(f"no expectation suite for {name!r}; suites: {', '.join(SUITES)}") from None
