"""The reference data verbs: ``eventlake load merchants`` (from outside the log into its dimension) and
``eventlake backfill`` (the read-model rows that join it, brought in line with what it knows now)."""
from __future__ import annotations

import sys

from lakehouse.errors import BadInput
from lakehouse.settings import Settings
from eventlake.cli.common import who

__all__ = ["ROLES", "add_verbs"]

# No Kafka: a load reads a file or a database and writes Delta tables.
ROLES: dict[str, str] = {}


def _cmd_load_merchants(settings: Settings, args) -> int:
    from reference_data.loads import load_merchants

    if (args.file is None) == (args.from_db is None):
        raise BadInput("eventlake load merchants: give a FILE (a path or a storage URI) or --from-db URL, not both "
                       "and not neither")
    source = args.file if args.file is not None else args.from_db
    print(f"load merchants: {source}{' (full extract)' if args.full else ''} ...", file=sys.stderr, flush=True)
    report = load_merchants(settings, source, full=args.full)
    print("\n".join(report.lines()))
    return 0


def _cmd_backfill(settings: Settings, args) -> int:
    """Backfill the read models that join reference data (a Spark session only when some windowed minute needs
    reprocessing). Exit 1 when rows wait for their minute to close."""
    from spark_apps.backfill import backfill_with_spark

    try:
        result = backfill_with_spark(settings, args.models or None, dry_run=args.dry_run, by=who(args),
                                     log=lambda line: print(line, flush=True))
    except ValueError as e:
        raise BadInput(str(e)) from None
    return 0 if result.complete else 1


def add_verbs(sub) -> None:
    """Add this group's verbs to the ``eventlake`` parser's subparsers."""
    p = sub.add_parser("load", help="load reference data (merchants) into its SCD2 dimension (dim_merchant)")
    kinds = p.add_subparsers(dest="kind", required=True, metavar="KIND")
    m = kinds.add_parser("merchants", help="load merchants from a CSV / JSON-lines file or a SQL database",
                         description="Extract merchants, stage them as Delta, check them with their Great "
                                     "Expectations suite and MERGE them into dim_merchant as SCD type 2 history. "
                                     "The same content twice loads once; a bad file is refused with a report under "
                                     "the warehouse's _quarantine/merchants and nothing is loaded.")
    m.add_argument("file", nargs="?", help="a .csv, .jsonl or .ndjson file: a local path or a storage URI")
    m.add_argument("--from-db", metavar="URL",
                   help="a SQLAlchemy URL of a database with a merchants table (sqlite:////path/ref.db, "
                        "postgresql://user@host/db)")
    m.add_argument("--full", action="store_true",
                   help="a full extract: a current merchant missing from it is closed (valid_to set)")
    m.set_defaults(run=_cmd_load_merchants)

    p = sub.add_parser("backfill", help="bring the read-model rows that join reference data (payments, "
                                        "category_minute_volume) in line with what dim_merchant knows now",
                       description="A payment projected before its merchant was loaded has null merchant columns "
                                   "(a rebuild now would give it the merchant's first version). The backfill sets "
                                   "them (one MERGE) and reprocesses the closed minutes of the windowed models they "
                                   "count in; rows of a minute still open wait for a later run (exit 1). What the "
                                   "backfill_reference DAG runs after every load.")
    p.add_argument("models", nargs="*", help="read models (default: every one that joins reference data)")
    p.add_argument("--dry-run", action="store_true", help="count the rows that differ; write nothing")
    p.add_argument("--by", help="who runs it (default: the current user)")
    p.set_defaults(run=_cmd_backfill)
