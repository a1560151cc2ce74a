"""Background processes the CLI starts and stops by a pid file: ``lakehouse.processes``, named here too for the
modules of the top that import it from here."""
from __future__ import annotations

from lakehouse.processes import pid_alive, read_pid, terminate

__all__ = ["pid_alive", "read_pid", "terminate"]
