"""Expectations of ``fraud_alerts``: one row per payment and rule that fired."""
from __future__ import annotations

TABLE = "fraud_alerts"


def expectations(gx) -> list:
    e = gx.expectations
    return [
        e.ExpectColumnValuesToNotBeNull(column="payment_id"),
        e.ExpectColumnValuesToNotBeNull(column="account_id"),
        e.ExpectCompoundColumnsToBeUnique(column_list=["payment_id", "rule"]),
        # Not only the detector's rules (event_store.account.fraud_rules.RULES): a person may flag a payment too.
        e.ExpectColumnValuesToNotBeNull(column="rule"),
        e.ExpectColumnValuesToMatchRegex(column="rule", regex=r"\S"),
        e.ExpectColumnValuesToNotBeNull(column="occurred_at"),
    ]
