"""Great Expectations suites, one module per read model in its domain's folder (``expectations.account``:
``TABLE``, ``expectations(gx)`` and optionally ``derived_columns(df)``), and the runner that checks the Delta
tables against them (``expectations.checks``).

A new read model adds one module to its domain's folder and to that folder's ``SUITES``; ``SUITES`` here collects
the registered domains'. ``tests/unit/test_expectations.py`` fails for a read model without a suite. Likewise each
domain registers its cross-model checks (``expectations.cross_model``: read models derived from the same events
agree) in its folder's ``CROSS_MODEL_CHECKS``, collected here.
"""
from __future__ import annotations

from types import ModuleType

from expectations import account, iot, site
from expectations.cross_model import Agreement, CrossModelCheck
from lakehouse.settings import Settings

__all__ = ["SUITES", "suite_module", "CROSS_MODEL_CHECKS", "checks_for", "check_agreement", "check_agreements"]

SUITES: dict[str, ModuleType] = {**account.SUITES, **iot.SUITES, **site.SUITES}
CROSS_MODEL_CHECKS: dict[str, CrossModelCheck] = {**account.CROSS_MODEL_CHECKS, **iot.CROSS_MODEL_CHECKS,
                                                  **site.CROSS_MODEL_CHECKS}


def suite_module(name: str) -> ModuleType:
    try:
        return SUITES[name]
    except KeyError:
        raise KeyError(f"no expectation suite for {name!r}; suites: {', '.join(SUITES)}") from None


def checks_for(names: list[str] | None) -> list[str]:
    """The cross-model checks to run for ``eventlake check NAMES``: all without names, else those whose tables
    are all named."""
    return [c.name for c in CROSS_MODEL_CHECKS.values() if not names or set(c.tables) <= set(names)]


def check_agreement(settings: Settings, name: str) -> Agreement:
    try:
        check = CROSS_MODEL_CHECKS[name]
    except KeyError:
        raise KeyError(f"no cross-model check {name!r}; checks: {', '.join(CROSS_MODEL_CHECKS)}") from None
    return check.run(settings)


def check_agreements(settings: Settings, names: list[str] | None = None) -> list[Agreement]:
    return [check_agreement(settings, name) for name in checks_for(names)]
