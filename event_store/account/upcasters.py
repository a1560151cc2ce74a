"""The account domain's upcasters: one per (event type, old schema version), each to the next version.

``event_store.upcasting`` chains them (with every other domain's) on read, so the log is never rewritten.
"""
from __future__ import annotations

from typing import Any

from event_store.account.schemas import country_of
from event_store.domain import Upcaster

__all__ = ["UPCASTERS", "SPARK_UPCASTERS"]


def _payment_authorized_1_to_2(payload: dict[str, Any]) -> dict[str, Any]:
    # v1 had no merchant_country; the payment's location (a region code like US-NYC) names the country.
    # A payload without a readable location gets none: validation then names the location as the problem.
    location = payload.get("location")
    return {**payload, "merchant_country": country_of(location) if isinstance(location, str) else None}


# (event_type, from_version) -> payload at from_version + 1.
UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("PaymentAuthorized", 1): _payment_authorized_1_to_2,
}

# The same steps as Spark column expressions of the flattened event row (F is pyspark.sql.functions, passed in by
# spark_apps.events); a test keeps the two in step.
SPARK_UPCASTERS = {
    ("PaymentAuthorized", 1): {"merchant_country": lambda F: F.substring_index(F.col("location"), "-", 1)},
}
