"""The account's set of seen payment ids (DuplicatePayment) as an account's payments grow.

Prints the time to fold N payments into one account (``evolve``) and to decide one more payment on it, for
growing N, side by side: a cost per event that grows with N makes rebuilding a long-lived account quadratic.

With ``--collector``: the garbage collector's share of the handler's state updates as its accounts grow. One
partition's accounts (667, the freshness benchmark's share) each hold N payment ids; 200,000 payments are folded
into accounts picked at random, with the collector's thresholds as the services set them between their paced
collections (``event_store.collector.THRESHOLDS``), and every collection is timed. Each version of an account's
payment ids is a young object; if the collector's traversal of one visits every id it holds (pyrsistent's C
vector did), each young-generation collection grows with the accounts.

    .venv/bin/python bench/payment_ids.py [N ...]
    .venv/bin/python bench/payment_ids.py --collector [N ...]
"""
from __future__ import annotations

import gc
import random
import sys
import time

from event_store.account import AccountState, CommandRejected, decide, evolve_fields
from event_store.account.aggregate import decode_state, encode_state
from event_store.envelope import CommandEnvelope


def fold_payments(n: int) -> tuple[AccountState, float]:
    state = evolve_fields(AccountState("acc-1"), "AccountOpened", {
        "customer_id": "c", "credit_limit_minor": 10 ** 15, "currency": "USD"}, 1)
    started = time.perf_counter()
    for i in range(n):
        state = evolve_fields(state, "PaymentAuthorized", {"payment_id": f"p-{i:09d}", "amount_minor": 1}, i + 2)
    return state, time.perf_counter() - started


def collector(sizes: list[int], accounts: int = 667, payments: int = 200_000) -> int:
    from event_store.collector import THRESHOLDS

    print(f"collector thresholds {THRESHOLDS} (the services'); {accounts} accounts, {payments:,} payments "
          f"folded at random")
    print(f"{'ids/account':>11} {'fold s':>7} {'collections':>11} {'collector s':>11} {'longest s':>9} {'share':>6}")
    rng = random.Random(7)
    for n in sizes:
        opened = encode_state(evolve_fields(AccountState("a"), "AccountOpened", {
            "customer_id": "c", "credit_limit_minor": 10 ** 15, "currency": "USD"}, 1))
        states = [decode_state({**opened, "account_id": f"acct-{a}",
                                "payment_ids": [f"p-{a}-{i:09d}" for i in range(n)]}) for a in range(accounts)]
        gc.collect()
        took: list[float] = []
        started_at = [0.0]

        def timed(phase: str, info: dict) -> None:
            if phase == "start":
                started_at[0] = time.perf_counter()
            else:
                took.append(time.perf_counter() - started_at[0])

        thresholds = gc.get_threshold()
        gc.callbacks.append(timed)
        try:
            gc.set_threshold(*THRESHOLDS)
            started = time.perf_counter()
            for i in range(payments):
                a = rng.randrange(accounts)
                state = states[a]
                states[a] = evolve_fields(state, "PaymentAuthorized",
                                          {"payment_id": f"q-{i:09d}", "amount_minor": 1}, state.version + 1)
            seconds = time.perf_counter() - started
        finally:
            gc.callbacks.remove(timed)
            gc.set_threshold(*thresholds)
        print(f"{n:>11,} {seconds:>7.2f} {len(took):>11} {sum(took):>11.2f} {max(took, default=0):>9.3f} "
              f"{sum(took) / seconds:>6.0%}")
        del states
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--collector"]:
        return collector([int(a) for a in argv[1:]] or [500, 2_000, 5_000])
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
