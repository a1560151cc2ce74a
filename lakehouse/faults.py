"""A fault hook for the crash tests: with ``EVENTLAKE_FAULT_KILL_IN_ERASURE`` set to a step's name, the process
SIGKILLs itself when it reaches that step (tests/integration/test_forget_kills.py). The steps of a forget, in order:

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

__all__ = ["fault_point"]

FAULT_STEP = os.environ.get("EVENTLAKE_FAULT_KILL_IN_ERASURE", "")


def fault_point(step: str) -> None:
    """Kill this process (-9) here if the crash test asked for ``step``; nothing otherwise."""
    if FAULT_STEP == step:
        os.kill(os.getpid(), signal.SIGKILL)
