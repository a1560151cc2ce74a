"""The load verb: reference data from outside the log into its dimension (``eventlake load merchants``)."""
from __future__ import annotations

import sys

from lakehouse.errors import BadInput
from lakehouse.settings import Settings

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
