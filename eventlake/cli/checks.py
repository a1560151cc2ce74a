"""The check verb: Great Expectations suites, reconciliation with the log, cross-model agreements."""
from __future__ import annotations

import sys

from lakehouse.settings import Settings

__all__ = ["ROLES", "add_verbs"]

# The Kafka principal each verb runs as when SASL is on (the others: admin); see eventlake.cli.roles.
ROLES = {"check": "reader"}


def _cmd_check(settings: Settings, args) -> int:
    from expectations import SUITES
    from expectations.checks import context, verdict

    unknown = [n for n in args.models if n not in SUITES]
    if unknown:
        print(f"eventlake check: no expectation suite for {', '.join(unknown)}; suites: {', '.join(SUITES)}",
              file=sys.stderr)
        return 2
    ge = context()
    verdicts = []
    for name in args.models or list(SUITES):
        verdicts.append(verdict(settings, name, reconcile=args.reconcile, ge=ge))
        print("\n".join(verdicts[-1].lines()), flush=True)
    from expectations import check_agreements

    agreements = check_agreements(settings, args.models or None)  # one line each: read models that must agree
    for agreement in agreements:
        print("\n".join(agreement.lines()), flush=True)
    counts = {"failed": sum(v.report is not None and not v.report.success for v in verdicts),
              "not created yet": sum(v.report is None for v in verdicts),
              "differ from the log": sum(v.differs for v in verdicts),
              "not reconciled": sum(v.reconciliation is not None and not v.reconciliation.compared
                                    for v in verdicts),
              "cross-model check(s) disagree": sum(a.failed for a in agreements),
              "cross-model check(s) not compared": sum(not a.compared for a in agreements)}
    problems = [f"{n} {what}" for what, n in counts.items() if n]
    print("check: " + (", ".join(problems) if problems else "all passed"))
    # "Not reconciled" (the archive is behind the table) and "not compared" (a projection batch in progress) are
    # no findings about the data: alone they exit 0.
    return 1 if any(v.failed for v in verdicts) or any(a.failed for a in agreements) else 0


def add_verbs(sub) -> None:
    """Add this group's verbs to the ``eventlake`` parser's subparsers."""
    p = sub.add_parser("check", help="check read model tables against their Great Expectations suites")
    p.add_argument("models", nargs="*", help="read models to check (default: all)")
    p.add_argument("--reconcile", action="store_true",
                   help="also compare each table with a plain-Python fold of the archived log up to the table's "
                        "position (about a minute per million events)")
    p.set_defaults(run=_cmd_check)
