"""Background processes started and stopped by a pid file (the local broker, the Spark and YARN clusters, the SQL
server): whether one is alive, its pid, stopping it. In the bottom layer because ``infra`` (what the CLI starts)
and ``eventlake`` (the SQL server) both need it."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["pid_alive", "read_pid", "signal_group", "terminate"]


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


def signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to every process of the process group ``pgid`` (0: none, only ask) -> whether any was
    left."""
    try:
        os.killpg(pgid, signum)
        return True
    except ProcessLookupError:
        return False


def terminate(pid: int, timeout: float, group: bool = False, whole_group: bool = False) -> bool:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL (the whole process group with ``group``: a service
    started in a session of its own, with its JVM) -> whether it had to be killed.

    With ``whole_group`` (the group ``pid`` led), every process of the group gets the SIGTERM (and the SIGKILL) and is
    waited for, not only its leader, which may have ended already (a supervisor's children left behind); a group with no process
    left is nothing to do."""
    import signal
    import time
    from functools import partial

    alive = partial(signal_group, pid, 0) if whole_group else partial(pid_alive, pid)
    if whole_group:
        if not signal_group(pid, signal.SIGTERM):
            return False
    else:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        time.sleep(0.2)
    if not alive():
        return False
    if whole_group:
        return signal_group(pid, signal.SIGKILL)  # False: gone meanwhile
    (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    return True
