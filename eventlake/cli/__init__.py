"""``eventlake``: the one console entry point. Run ``eventlake --help`` for the subcommands.

One module per group of verbs, each adding its verbs to the parser (``add_verbs``) and naming the Kafka principal
each runs as (``ROLES``, gathered by :func:`roles`); a verb calls functions of the packages, never another module's ``main``. The domains
bring verbs of their own through the registry (``event_store.domains.VERBS``, added by
``eventlake.cli.domain_verbs``). An error of the platform (``lakehouse.errors.EventlakeError``) ends the command
with its message and its kind's exit code; anything else is a bug and shows its traceback.
"""
from __future__ import annotations

import argparse
import sys

from eventlake.cli import (checks, cluster, domain_verbs, forgetting, generations, projection, reference, sql,
                           write_side)
from lakehouse.errors import EventlakeError
from lakehouse.settings import Settings, SettingsError

__all__ = ["main", "entry", "build_parser", "roles"]

# In the order of ``eventlake --help``.
GROUPS = (cluster, write_side, domain_verbs, projection, checks, generations, reference, sql, forgetting)


def roles() -> dict[str, str]:
    """The Kafka principal each command runs as when SASL is on and the environment names no user
    (Settings.for_role): the least that command needs (event_store.kafka_access); every other one runs as the
    admin."""
    found = {name: role for group in GROUPS if group is not domain_verbs for name, role in group.ROLES.items()}
    return {**found, **domain_verbs.roles()}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eventlake",
        description="Event-sourced CQRS data platform: Kafka log -> Spark projections -> Delta read models -> SQL. "
                    "Settings come from EVENTLAKE_* variables, KAFKA_BOOTSTRAP_SERVERS or the TOML file in "
                    "EVENTLAKE_CONFIG.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.add_verbs(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.load(role=roles().get(args.command, "admin"))
    except SettingsError as e:
        print(f"eventlake: {e}", file=sys.stderr)
        return e.exit_code
    from event_store.kafka_access import explain_refusal

    try:
        return args.run(settings, args)
    except EventlakeError as e:  # errors the platform words for a person (not bugs) end with their message only
        print(f"eventlake: {e}", file=sys.stderr)
        for line in getattr(e, "lines", ()):
            print(f"  {line}", file=sys.stderr)
        return e.exit_code
    except Exception as e:
        refusal = explain_refusal(settings, e)  # the cluster refused this principal something (SASL, ACLs)
        if refusal is not None:
            print(f"eventlake: {refusal}", file=sys.stderr)
            return 1
        raise


def entry() -> None:
    """The ``eventlake`` command: ``main``, then an exit that skips the interpreter's final teardown.

    Python's own exit runs the C++ destructors of the native libraries loaded (pyarrow, delta-rs); their worker
    threads, still running then, sometimes abort the process ("terminate called without an active exception",
    status -6) after the command printed its result: a passed check ended as a crash. So the command waits for
    its own threads and runs its exit handlers (pyspark's among them) as usual, flushes its output, and ends the
    process there (``os._exit``), before any native destructor runs."""
    import atexit
    import os
    import threading

    try:
        status = main()
    except SystemExit as e:  # argparse, --help
        status = e.code
    except KeyboardInterrupt:
        status = 130
    code = status if isinstance(status, int) else (0 if status is None else 1)
    if status is not None and not isinstance(status, int):
        print(status, file=sys.stderr)
    threading._shutdown()  # what the interpreter would do first: wait for the non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)

