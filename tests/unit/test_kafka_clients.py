"""``kafka_clients.close_all_within``: several consumers closed side by side, the call bounded however long a close
hangs (a close on an absent broker). Stand-in consumers: only their ``close`` is called, no broker is needed."""
from __future__ import annotations

import threading
import time

from event_store import kafka_clients


class Closing:
    """A consumer whose ``close`` returns once ``release`` is set (never, unless the test sets it)."""

    def __init__(self, release: threading.Event):
        self.release = release
        self.started = threading.Event()
        self.closed = False

    def close(self) -> None:
        self.started.set()
        self.release.wait(60)
        self.closed = True


def test_every_consumer_is_closed_side_by_side_and_the_call_returns_while_closes_hang():
    release = threading.Event()
    consumers = [Closing(release) for _ in range(3)]
    try:
        began = time.monotonic()
        kafka_clients.close_all_within(consumers, 0.5, "test")
        took = time.monotonic() - began
        assert all(c.started.is_set() for c in consumers)  # each close began, none waited for another
        assert not any(c.closed for c in consumers)  # still hanging: left behind
        assert took < 10  # the bound is for all of them, not each (generous: a loaded host)
    finally:
        release.set()


def test_closes_that_return_are_waited_for():
    release = threading.Event()
    release.set()
    consumers = [Closing(release) for _ in range(3)]
    kafka_clients.close_all_within(consumers, 30.0, "test")
    assert all(c.closed for c in consumers)
    one = Closing(release)
    kafka_clients.close_within(one, 30.0, "test")
    assert one.closed


def test_no_consumer_is_nothing_to_do():
    kafka_clients.close_all_within([], 30.0, "test")
