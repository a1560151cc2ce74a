"""Expectations of ``account_summary``: one row per opened account, money that adds up, known statuses."""
from __future__ import annotations

from event_store.account.schemas import CURRENCIES

TABLE = "account_summary"


def derived_columns(df) -> None:
    """Columns the expectations compare with (added to the checked frame, never written)."""
    df["expected_available_minor"] = df["credit_limit_minor"] - df["authorized_total_minor"]


def expectations(gx) -> list:
    e = gx.expectations
    return [
        e.ExpectColumnValuesToNotBeNull(column="account_id"),
        e.ExpectColumnValuesToBeUnique(column="account_id"),
        # A row starts at the account's first event (AccountOpened), so the opening fields are always there.
        e.ExpectColumnValuesToNotBeNull(column="customer_id"),
        e.ExpectColumnValuesToBeInSet(column="status", value_set=["open", "frozen"]),
        e.ExpectColumnValuesToBeInSet(column="currency", value_set=sorted(CURRENCIES)),
        e.ExpectColumnValuesToBeBetween(column="credit_limit_minor", min_value=1),
        e.ExpectColumnValuesToBeBetween(column="version", min_value=1),
        e.ExpectColumnValuesToBeBetween(column="payments_authorized", min_value=0),
        e.ExpectColumnValuesToBeBetween(column="payments_declined", min_value=0),
        e.ExpectColumnValuesToBeBetween(column="authorized_total_minor", min_value=0),
        # A payment is authorized only within the available credit, which therefore never goes below zero.
        e.ExpectColumnValuesToBeBetween(column="available_minor", min_value=0),
        e.ExpectColumnPairValuesToBeEqual(column_A="available_minor", column_B="expected_available_minor"),
    ]
