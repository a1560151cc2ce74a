"""What stops a projection, and what a run did, whichever engine runs it."""
from __future__ import annotations

from dataclasses import dataclass, field

from lakehouse.errors import Unavailable

__all__ = ["ProjectionError", "ProjectionRun"]


class ProjectionError(Unavailable, RuntimeError):
    """The projection cannot go on without a person deciding (e.g. a gap in the log)."""


@dataclass
class ProjectionRun:
    batches: int = 0
    input_rows: int = 0
    seconds: float = 0.0
    batch_ms: list = field(default_factory=list)  # each batch's time in foreachBatch (its addBatch duration)
    step_seconds: dict = field(default_factory=dict)  # summed over the batches: where the time went

    @property
    def rows_per_second(self) -> float:
        return self.input_rows / self.seconds if self.seconds else 0.0
