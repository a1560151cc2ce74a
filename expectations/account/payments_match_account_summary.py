"""Cross-model check of the card-account domain: ``payments`` and ``account_summary`` count the same payments.

``payments_match_account_summary``: per account, ``account_summary``'s ``payments_authorized``,
``payments_declined`` and ``authorized_total_minor`` equal the count of the account's authorized and declined
``payments`` rows and the sum of its authorized ``amount_minor``. Payment events that ``account_summary`` holds
back in ``_pending/account_summary`` (waiting for an earlier version of their account) are not counted on the
``payments`` side: the two tables differ by exactly those until the gap is filled. When the tables are compared
(at one log position, or "not compared"): ``expectations.cross_model``.
"""
from __future__ import annotations

from expectations.cross_model import Agreement, CrossModelCheck, table_snapshots
from lakehouse.settings import Settings

__all__ = ["CHECK", "compare_payments_with_summary", "payments_match_account_summary"]

_PENDING = "_pending/account_summary"


def payments_match_account_summary(settings: Settings, examples: int = 5) -> Agreement:
    """Per account: account_summary's payment counts and authorized total equal what the payments rows say."""
    import pyarrow.compute as pc

    from lakehouse.tables import read_table

    check = "payments_match_account_summary"
    tables, position, why = table_snapshots(settings, ("account_summary", "payments"), optional=(_PENDING,))
    if why:
        return Agreement(check, False, reason=why, keys_are="accounts")
    summary = read_table(tables["account_summary"], columns=["account_id", "payments_authorized",
                                                             "payments_declined", "authorized_total_minor"])
    payments = read_table(tables["payments"], columns=["account_id", "status", "amount_minor", "event_id"])
    held_back = 0
    if _PENDING in tables:
        waiting = read_table(tables[_PENDING], columns=["event_id"]).column("event_id")
        if len(waiting):
            ahead = pc.is_in(payments.column("event_id"), value_set=pc.unique(waiting))
            held_back = pc.sum(ahead).as_py() or 0
            payments = payments.filter(pc.invert(pc.fill_null(ahead, False)))

    keys, differing, lines = compare_payments_with_summary(summary, payments, examples)
    if held_back:
        position += f"; {held_back} payments rows not counted: their events wait in {_PENDING}"
    return Agreement(check, True, position=position, keys=keys, disagreements=differing, examples=tuple(lines),
                     keys_are="accounts")


def compare_payments_with_summary(summary, payments, examples: int = 5) -> tuple[int, int, list[str]]:
    """(accounts compared, accounts that disagree, a line for each of the first ``examples`` of them) for
    ``account_summary`` rows (account_id, payments_authorized, payments_declined, authorized_total_minor) and
    ``payments`` rows (account_id, status, amount_minor), both ``pyarrow.Table``s. Pure: no I/O."""
    from_payments: dict[str, list[int]] = {}  # account -> [authorized, declined, authorized total]
    grouped = payments.group_by(["account_id", "status"]).aggregate([("amount_minor", "sum"),
                                                                     ("account_id", "count")])
    for row in grouped.to_pylist():
        counts = from_payments.setdefault(row["account_id"], [0, 0, 0])
        if row["status"] == "authorized":
            counts[0] += row["account_id_count"]
            counts[2] += row["amount_minor_sum"] or 0
        elif row["status"] == "declined":
            counts[1] += row["account_id_count"]
    from_summary = {r["account_id"]: [r["payments_authorized"] or 0, r["payments_declined"] or 0,
                                      r["authorized_total_minor"] or 0] for r in summary.to_pylist()}
    accounts = sorted(from_summary.keys() | from_payments.keys(), key=str)
    differing = [a for a in accounts if from_summary.get(a, [0, 0, 0]) != from_payments.get(a, [0, 0, 0])]
    lines = []
    for account in differing[:examples]:
        s_auth, s_decl, s_total = from_summary.get(account, [0, 0, 0])
        p_auth, p_decl, p_total = from_payments.get(account, [0, 0, 0])
        absent = "" if account in from_summary else " (no account_summary row)"
        lines.append(f"{account}: account_summary has payments_authorized={s_auth}, payments_declined={s_decl}, "
                     f"authorized_total_minor={s_total}{absent}; payments has {p_auth} authorized rows, "
                     f"{p_decl} declined rows, authorized amount_minor sum {p_total}")
    if len(differing) > examples:
        lines.append(f"... and {len(differing) - examples} more accounts")
    return len(accounts), len(differing), lines


CHECK = CrossModelCheck("payments_match_account_summary", ("account_summary", "payments"),
                        payments_match_account_summary)
