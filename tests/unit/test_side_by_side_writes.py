"""The Python engine's models' writes, side by side (``side_by_side``): a failure is raised only once every other
write has ended, so the hand-over that follows never finds one still committing; pure (threads, no tables)."""
from __future__ import annotations

import threading
import time

import pytest

from python_engine.delta_writes import side_by_side


def test_every_write_runs_and_they_overlap():
    ended = []
    both = threading.Barrier(2, timeout=10)  # each waits for the other: run one after the other, this fails

    def write(name):
        def run():
            both.wait()
            ended.append(name)
        return run

    side_by_side([write("account_summary"), write("payments")])

    assert sorted(ended) == ["account_summary", "payments"]


def test_a_failing_write_is_raised_after_the_slower_ones_have_ended():
    ended = []

    def fails():
        raise RuntimeError("commit lost a race")

    def slow():
        time.sleep(0.3)
        ended.append("slow")

    with pytest.raises(RuntimeError, match="lost a race"):
        side_by_side([fails, slow])
    assert ended == ["slow"]  # ended before the failure reached the caller


def test_the_first_failure_in_the_writes_order_is_raised():
    def first():
        time.sleep(0.1)
        raise ValueError("first")

    def second():
        raise KeyError("second")

    with pytest.raises(ValueError, match="first"):
        side_by_side([first, second])
