"""Expectations of ``payments``: one row per payment of an account, a positive amount, a decline reason exactly when declined."""
from __future__ import annotations

from event_store.account import DECLINE_REASONS
from event_store.account.schemas import CURRENCIES

TABLE = "payments"


def expectations(gx) -> list:
    from great_expectations.expectations.row_conditions import Column

    e = gx.expectations
    return [
        e.ExpectColumnValuesToNotBeNull(column="payment_id"),
        e.ExpectCompoundColumnsToBeUnique(column_list=["account_id", "payment_id"]),
        e.ExpectColumnValuesToNotBeNull(column="account_id"),
        e.ExpectColumnValuesToNotBeNull(column="merchant_id"),
        e.ExpectColumnValuesToNotBeNull(column="event_id"),
        e.ExpectColumnValuesToBeBetween(column="amount_minor", min_value=1),
        e.ExpectColumnValuesToBeInSet(column="currency", value_set=sorted(CURRENCIES)),
        e.ExpectColumnValuesToMatchRegex(column="location", regex=r"^[A-Z]{2}-[A-Z0-9]{2,6}$"),
        e.ExpectColumnValuesToBeInSet(column="status", value_set=["authorized", "declined"]),
        e.ExpectColumnValuesToBeNull(column="decline_reason", row_condition=Column("status") == "authorized"),
        e.ExpectColumnValuesToBeInSet(column="decline_reason", value_set=list(DECLINE_REASONS),
                                      row_condition=Column("status") == "declined"),
        e.ExpectColumnValuesToNotBeNull(column="decline_reason", row_condition=Column("status") == "declined"),
        e.ExpectColumnValuesToNotBeNull(column="occurred_at"),
    ]
