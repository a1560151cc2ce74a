"""The account's set of seen payment ids (DuplicatePayment) as an account's payments grow.

Prints the time to fold N payments into one account (``evolve``) and to decide one more payment on it, for
growing N, side by side: a cost per event that grows with N makes rebuilding a long-lived account quadratic.

    .venv/bin/python bench/payment_ids.py [N ...]
"""
from __future__ import annotations

import sys
import time

from event_store.account import AccountState, CommandRejected, decide, evolve_fields
from event_store.envelope import CommandEnvelope


def fold_payments(n: int) -> tuple[AccountState, float]:
    state = evolve_fields(AccountState("acc-1"), "AccountOpened", {
        "customer_id": "c", "credit_limit_minor": 10 ** 15, "currency": "USD"}, 1)
    started = time.perf_counter()
    for i in range(n):
        state = evolve_fields(state, "PaymentAuthorized", {"payment_id": f"p-{i:09d}", "amount_minor": 1}, i + 2)
    return state, time.perf_counter() - started


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [1_000, 10_000, 50_000]
    print(f"{'payments':>10} {'fold s':>8} {'µs/event':>9} {'decide µs':>10}")
    base = None
    for n in sizes:
        state, seconds = fold_payments(n)
        repeat = CommandEnvelope.create("AuthorizePayment", "acc-1", {
            "payment_id": "p-000000000", "amount_minor": 1, "currency": "USD", "merchant_id": "m",
            "location": "US-NYC", "occurred_at": "2026-01-01T00:00:00Z"})
        started = time.perf_counter()
        try:
            decide(state, repeat)
            raise SystemExit("a repeated payment id was accepted")
        except CommandRejected:
            pass
        decide_us = (time.perf_counter() - started) * 1e6
        per_event = seconds / n * 1e6
        base = base or per_event
        print(f"{n:>10,} {seconds:>8.2f} {per_event:>9.1f} {decide_us:>10.1f}   ({per_event / base:.1f}x the first "
              f"size's cost per event)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
