"""The verbs the domains bring (``event_store.domains.VERBS``: the account's resolve-quarantine, policy,
detect-fraud): added to the parser from their declarations, run through the function each names."""
from __future__ import annotations

import importlib

from event_store import domains
from event_store.verbs import Verb
from eventlake.cli.common import require_broker
from eventlake.cli.projection import SparkApps
from lakehouse.settings import Settings

__all__ = ["roles", "add_verbs"]


def roles() -> dict[str, str]:
    """The Kafka principal each domain verb runs as (its ``Verb.role``), for the domains registered now."""
    return {verb.name: verb.role for verb in domains.verbs()}


def _runner(verb: Verb):
    def run(settings: Settings, args) -> int:
        module, _, function = verb.run.partition(":")
        target = getattr(importlib.import_module(module), function)
        if verb.needs_broker:
            require_broker(settings)
        return target(settings, args, SparkApps())
    run.verb = verb  # what the verb runs, for a reader of the parser (tests/unit/test_k8s_manifests.py)
    return run


def add_verbs(sub) -> None:
    """Add every registered domain's verbs to the ``eventlake`` parser's subparsers."""
    for verb in domains.verbs():
        p = sub.add_parser(verb.name, help=verb.help)
        for option in verb.options:
            p.add_argument(*option.flags, **option.keywords)
        p.set_defaults(run=_runner(verb))
