"""Every exception class the packages define is an ``EventlakeError`` of one kind (``lakehouse.errors``), so the
CLI prints its message and exits with its kind's code; or it is a signal that never reaches a person, named below
with the reason."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

from lakehouse.errors import BadInput, CheckFailed, EventlakeError, NotFound, Refused, Unavailable

ROOT = Path(__file__).resolve().parents[2]
# The packages of the layers (dags hold no classes of their own, and importing Airflow costs seconds).
PACKAGES = ("lakehouse", "event_store", "read_models", "expectations", "projection_core", "spark_apps",
            "python_engine", "infra", "eventlake")
# Control-flow signals, by class name (they may move between modules): raised and caught inside the platform,
# never shown to a person.
SIGNALS = {
    "_Stopping": "the handler's stop() was called while it waited: unwinds the handler's loop",
    "_PartitionsMoved": "a rebalance took a partition of the handler's open transaction: it aborts and goes on",
    "RebuildDeferred": "a partition cannot be rebuilt right now: it stays paused and is tried again",
    "HandOver": "the Python engine hands a batch off its common path to the Spark query",
}


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        if not (ROOT / package / "__init__.py").exists():
            continue
        names.append(package)
        module = importlib.import_module(package)
        # (not ``__main__``: running a package is its import)
        names += [m.name for m in pkgutil.walk_packages(module.__path__, f"{package}.")
                  if not m.name.endswith(".__main__")]
    return names


def _exception_classes() -> dict[str, type]:
    found = {}
    for name in _modules():
        module = importlib.import_module(name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == name:
                found[f"{name}.{obj.__qualname__}"] = obj
    return found


CLASSES = _exception_classes()


def test_the_walk_finds_the_errors_of_every_layer():
    for name in ("lakehouse.settings.SettingsError", "event_store.errors.InvalidRecord", "infra.kafka.KafkaError",
                 "read_models.catalog.CatalogRefused", "projection_core.rebuild_errors.RebuildFailed",
                 "eventlake.query.QueryError", "event_store.handler._Stopping"):
        assert name in CLASSES, name


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_exception_is_an_eventlake_error_or_a_named_signal(name):
    cls = CLASSES[name]
    if cls.__name__ in SIGNALS:
        assert not issubclass(cls, EventlakeError), f"{name} is an EventlakeError now: take it off SIGNALS"
        return
    assert issubclass(cls, EventlakeError), (
        f"{name} is not an EventlakeError: add its kind (lakehouse.errors: BadInput, NotFound, Refused, "
        f"Unavailable, CheckFailed) to its bases, e.g. class {cls.__name__}(BadInput, ValueError), or name it in "
        f"SIGNALS with why it never reaches a person")


def test_the_signals_named_still_exist():
    gone = set(SIGNALS) - {cls.__name__ for cls in CLASSES.values()}
    assert not gone, f"gone: take {sorted(gone)} off SIGNALS"


def test_each_kind_carries_its_exit_code_and_keeps_the_builtin_base():
    from lakehouse.settings import SettingsError
    from read_models.catalog import CatalogError, CatalogRefused
    from projection_core.rebuild_errors import RebuildError, RebuildFailed, RebuildRefused

    assert {k: k.exit_code for k in (BadInput, NotFound, Refused, Unavailable, CheckFailed)} == {
        BadInput: 2, NotFound: 2, Refused: 1, Unavailable: 1, CheckFailed: 1}
    assert issubclass(SettingsError, ValueError) and SettingsError("x").exit_code == 2
    assert issubclass(CatalogRefused, CatalogError) and CatalogRefused("x").exit_code == 1
    assert issubclass(RebuildRefused, RebuildError) and issubclass(RebuildFailed, CheckFailed)
