"""Read models of the card-account domain (the ``account`` aggregate, ``event_store.account``), one module per table.

``MODELS`` collects them, in the order ``read_models.REGISTRY`` lists them (the order the live projection's
checkpoint name and every runner follow).
"""
from __future__ import annotations

from read_models.account.account_summary import MODEL as ACCOUNT_SUMMARY
from read_models.account.category_minute_volume import MODEL as CATEGORY_MINUTE_VOLUME
from read_models.account.fraud_alerts import MODEL as FRAUD_ALERTS
from read_models.account.merchant_minute_volume import MODEL as MERCHANT_MINUTE_VOLUME
from read_models.account.payments import MODEL as PAYMENTS
from read_models.spec import ReadModel

__all__ = ["MODELS", "ACCOUNT_SUMMARY", "PAYMENTS", "MERCHANT_MINUTE_VOLUME", "FRAUD_ALERTS",
           "CATEGORY_MINUTE_VOLUME"]

MODELS: dict[str, ReadModel] = {m.name: m for m in (ACCOUNT_SUMMARY, PAYMENTS, MERCHANT_MINUTE_VOLUME, FRAUD_ALERTS,
                                                    CATEGORY_MINUTE_VOLUME)}
