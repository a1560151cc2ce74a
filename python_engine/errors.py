"""Why the Python engine gives a batch to the Spark engine."""
from __future__ import annotations

__all__ = ["HandOver"]


class HandOver(Exception):
    """This batch is not on the common path: the Spark query runs it (the message says why)."""
