"""Background processes the CLI starts and stops by a pid file (the local broker, the SQL server)."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["pid_alive", "read_pid"]


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
