"""Background processes started and stopped by a pid file (the local broker, the Spark and YARN clusters, the SQL
server): whether one is alive, its pid, stopping it. In the bottom layer because ``infra`` (what the CLI starts)
and ``eventlake`` (the SQL server) both need it."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["pid_alive", "read_pid", "terminate"]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our own exited child) is not alive.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True


def read_pid(pid_file: Path) -> int | None:
    """The pid in ``pid_file`` when that process is alive, else None."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def terminate(pid: int, timeout: float, group: bool = False) -> bool:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL (the whole process group with ``group``: a service
    started in a session of its own, with its JVM) -> whether it had to be killed."""
    import signal
    import time

    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.2)
    if not pid_alive(pid):
        return False
    (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    return True
