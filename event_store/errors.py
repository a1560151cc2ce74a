"""The write side's errors that every layer of it raises or catches: the bottom of ``event_store``'s imports.

``InvalidRecord`` is raised by the schemas' validators (``event_store.schemas``) and by the envelopes built on
them (``event_store.envelope``); it lives here so that neither of those has to import the other to name it.
"""
from __future__ import annotations
from lakehouse.errors import BadInput

__all__ = ["InvalidRecord"]


class InvalidRecord(BadInput, ValueError):
    """A record that cannot be accepted: bad JSON, a missing or mistyped field, an unknown type."""
