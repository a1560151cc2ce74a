"""The one base of eventlake's errors, and its kinds: what every layer raises when a person must be told why.

An error of the platform (not a bug) subclasses one kind below; each kind carries the exit code the CLI ends
with, and the CLI prints the message alone (no traceback) for any :class:`EventlakeError`. A class keeps its
built-in base beside its kind (``class QueryError(BadInput, RuntimeError)``) so that callers catching that still
catch it. This module is at the bottom of the layers (``lakehouse``): every other one may import it.
"""
from __future__ import annotations

__all__ = ["EventlakeError", "BadInput", "NotFound", "Refused", "Unavailable", "CheckFailed"]


class EventlakeError(Exception):
    """An error the platform words for a person: its message names the input, the reason and what to do."""
    exit_code = 1


class BadInput(EventlakeError):
    """The input is wrong: a malformed record, an unknown name, an option out of range, a bad setting."""
    exit_code = 2


class NotFound(EventlakeError):
    """What the input names does not exist (yet): a table, a generation, a history."""
    exit_code = 2


class Refused(EventlakeError):
    """The input is fine but the state refuses it: a stale version, a lock held, nothing to roll back to, another
    writer won."""
    exit_code = 1


class Unavailable(EventlakeError):
    """A component the operation needs is not there or failed: the broker, a cluster, a server, storage."""
    exit_code = 1


class CheckFailed(EventlakeError):
    """The work was done but did not pass its checks (a rebuilt generation that fails its suite)."""
    exit_code = 1
