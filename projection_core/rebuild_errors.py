"""What a rebuild raises. A module of its own, below the engines, so that the rebuild lock
(``projection_core.rebuild_lock``), the fold engines (``spark_apps.rebuild_fold``, ``spark_apps.archive_fold``) and
the rebuild's steps (``spark_apps.rebuild``) all import it, and none imports another for it."""
from __future__ import annotations
from lakehouse.errors import BadInput, CheckFailed, Refused

__all__ = ["RebuildError", "RebuildRefused", "RebuildFailed"]


class RebuildError(BadInput, ValueError):
    """A rebuild cannot be done as asked (e.g. a position the archive has not reached)."""


class RebuildRefused(Refused, RebuildError):
    """A rebuild that must not start (another one of the same read model is running)."""


class RebuildFailed(CheckFailed, RebuildError):
    """The new generation failed its checks: readers stay on the current one. ``lines`` say why."""

    def __init__(self, message: str, lines: list[str]):
        super().__init__(message)
        self.lines = lines
