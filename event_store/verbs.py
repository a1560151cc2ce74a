"""What a domain adds to the ``eventlake`` command: verbs of its own (the account's ``resolve-quarantine``,
``policy``, ``detect-fraud``) and its data generator (``eventlake generate --domain``), declared here as plain
data and registered with the domain (``event_store.domains.VERBS``, ``GENERATORS``); the CLI loops over them.

A verb names its function as ``"module:function"``, loaded only when the verb runs: the function may use the whole
write side (clients, consumers) while the registry, which every framework module imports, loads none of it. The
function is called as ``run(settings, args, host)``: ``args`` the parsed options, ``host`` what only the CLI can do
(:class:`VerbHost`). Pure: no I/O, no Kafka, no Spark.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

__all__ = ["Verb", "Option", "option", "VerbHost", "Generate"]


@dataclass(frozen=True)
class Option:
    """One ``add_argument`` call: its flags (or positional name) and keywords."""
    flags: tuple[str, ...]
    keywords: Mapping[str, Any] = field(default_factory=dict)


def option(*flags: str, **keywords: Any) -> Option:
    """An option as ``argparse`` takes it: ``option("--reason", required=True, help="why")``."""
    return Option(tuple(flags), dict(keywords))


@dataclass(frozen=True)
class Verb:
    """One subcommand of ``eventlake`` a domain contributes."""
    name: str
    help: str
    # "module:function"; the function takes (settings, args, host) and returns the exit code.
    run: str
    options: tuple[Option, ...] = ()
    # The Kafka principal it runs as when SASL is on (lakehouse.settings.Settings.for_role).
    role: str = "client"
    # The CLI checks, before ``run``, that the cluster runs and lets this principal in.
    needs_broker: bool = True


@dataclass(frozen=True)
class Generate:
    """A domain's data generator as ``eventlake generate --domain NAME`` runs it."""
    name: str
    # "module:function"; the function takes (settings, args: the options of ``eventlake generate``) and returns
    # (the (key, JSON) records to send, what they are for, e.g. "24 devices").
    run: str


class VerbHost(Protocol):
    """What the CLI offers a domain's verb beyond the write side: the Spark apps, which the write side cannot
    import (they live a layer above it)."""

    def run_spark_detector(self, app: str, settings: Any, until_caught_up: bool) -> int:
        """Run the Spark detector app ``app`` (e.g. ``fraud_detector``) and return its exit code."""
        ...
