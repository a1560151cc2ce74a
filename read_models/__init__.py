"""Read models: one module per table in its domain's folder (``read_models.account``, ``.iot``, ``.site``), each
exposing one ``MODEL`` spec; each domain's ``MODELS`` collects its own, and ``REGISTRY`` collects the registered
domains'."""
from __future__ import annotations

from read_models import account, iot, site
from read_models.spec import ReadModel

__all__ = ["REGISTRY", "ReadModel", "get", "select"]

REGISTRY: dict[str, ReadModel] = {**account.MODELS, **iot.MODELS, **site.MODELS}


def get(name: str) -> ReadModel:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown read model {name!r}; known: {', '.join(REGISTRY)}") from None


def select(names: list[str] | None) -> list[ReadModel]:
    """The named read models (all when names is empty)."""
    return [get(n) for n in names] if names else list(REGISTRY.values())
