"""Expectations of a staged batch of merchants (before its SCD2 merge into ``dim_merchant``): one row per merchant
id, a name, a four-digit merchant category code (ISO 18245), an ISO 3166 alpha-2 country, a known risk level."""
from __future__ import annotations

__all__ = ["TABLE", "RISK_LEVELS", "expectations"]

TABLE = "merchants_staged"
RISK_LEVELS = ("low", "medium", "high")


def expectations(gx) -> list:
    e = gx.expectations
    return [
        e.ExpectColumnValuesToNotBeNull(column="merchant_id"),
        e.ExpectColumnValuesToBeUnique(column="merchant_id"),
        e.ExpectColumnValuesToMatchRegex(column="merchant_id", regex=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"),
        e.ExpectColumnValuesToNotBeNull(column="name"),
        e.ExpectColumnValueLengthsToBeBetween(column="name", min_value=1, max_value=200),
        e.ExpectColumnValuesToNotBeNull(column="mcc"),
        e.ExpectColumnValuesToMatchRegex(column="mcc", regex=r"^[0-9]{4}$"),
        e.ExpectColumnValuesToNotBeNull(column="country"),
        e.ExpectColumnValuesToMatchRegex(column="country", regex=r"^[A-Z]{2}$"),
        e.ExpectColumnValuesToNotBeNull(column="risk_level"),
        e.ExpectColumnValuesToBeInSet(column="risk_level", value_set=list(RISK_LEVELS)),
    ]
