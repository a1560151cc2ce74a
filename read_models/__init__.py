"""Read models: one module per table, each exposing one ``MODEL`` spec; ``REGISTRY`` collects them."""
from __future__ import annotations

from read_models.account_summary import MODEL as ACCOUNT_SUMMARY
from read_models.fraud_alerts import MODEL as FRAUD_ALERTS
from read_models.merchant_minute_volume import MODEL as MERCHANT_MINUTE_VOLUME
from read_models.payments import MODEL as PAYMENTS
from read_models.spec import ReadModel

__all__ = ["REGISTRY", "ReadModel", "get", "select"]

REGISTRY: dict[str, ReadModel] = {m.name: m for m in (ACCOUNT_SUMMARY, PAYMENTS, MERCHANT_MINUTE_VOLUME, FRAUD_ALERTS)}


def get(name: str) -> ReadModel:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown read model {name!r}; known: {', '.join(REGISTRY)}") from None


def select(names: list[str] | None) -> list[ReadModel]:
    """The named read models (all when names is empty)."""
    return [get(n) for n in names] if names else list(REGISTRY.values())
