"""Fault hooks for the crash tests: the process SIGKILLs itself at a point a test names.

``store_write_point()``: with ``EVENTLAKE_FAULT_KILL_AT_STORE_WRITE`` set to N, inside the process's N-th write
transaction to an on-disk store, after its puts and before its commit (the handler's state store,
tests/integration/test_handler_store_kills.py; the Python engine's key indexes,
tests/integration/test_python_projection.py).

``fault_point(step)``: with ``EVENTLAKE_FAULT_KILL_IN_ERASURE`` set to a step's name, when the process reaches that
step (tests/integration/test_forget_kills.py). The steps of a forget, in order:

- "after-topic-tombstone" (event_store.personal_data: the tombstone is on the keys topic, this home's key files
  still hold the key),
- "after-key" (projection_core.forget_subject: the key deleted),
- "after-update" (lakehouse.erasure: the UPDATE committed),
- "after-checkpoint" (the log's checkpoint written, nothing deleted),
- "after-first-delete" (one old commit or data file deleted).
"""
from __future__ import annotations

import os
import signal

__all__ = ["fault_point", "store_write_point"]

FAULT_STEP = os.environ.get("EVENTLAKE_FAULT_KILL_IN_ERASURE", "")
KILL_AT_STORE_WRITE = int(os.environ.get("EVENTLAKE_FAULT_KILL_AT_STORE_WRITE") or 0)
_store_writes = [0]


def fault_point(step: str) -> None:
    """Kill this process (-9) here if the crash test asked for ``step``; nothing otherwise."""
    if FAULT_STEP == step:
        os.kill(os.getpid(), signal.SIGKILL)


def store_write_point() -> None:
    """Called inside every write transaction to an on-disk store, before its commit: kill this process (-9) in its
    N-th one if the crash test asked for N; nothing otherwise."""
    if KILL_AT_STORE_WRITE:
        _store_writes[0] += 1
        if _store_writes[0] >= KILL_AT_STORE_WRITE:
            os.kill(os.getpid(), signal.SIGKILL)
