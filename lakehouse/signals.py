"""SIGTERM for the long-running services (`eventlake handler`, `project`, `detect-fraud`, `detect-anomalies`,
`policy`).

Kubernetes, systemd and `kill` stop a service with SIGTERM. The signal only asks: its handler sets a flag that
the service's loop checks at least every second or so, whatever it waits for (the broker may be away), so the
service finishes or abandons its current step, stops cleanly and exits 0. Nothing is lost by abandoning a step:
each service resumes from its committed position (consumer offsets, streaming checkpoints).
"""
from __future__ import annotations

import signal
import threading
from typing import Callable

__all__ = ["stop_requested_on_sigterm"]


def stop_requested_on_sigterm(on_stop: Callable[[], None] | None = None) -> threading.Event:
    """An event set when SIGTERM arrives (``on_stop`` is called too). Signal handlers can only be installed
    from the main thread: elsewhere (e.g. a test running a service in a thread) the event is returned, unwired."""
    requested = threading.Event()

    def handle(signum, frame) -> None:
        requested.set()
        if on_stop is not None:
            on_stop()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handle)
    return requested
