"""``eventlake forget``: a data subject forgotten (issue 45, docs/forgetting.md)."""
from __future__ import annotations

from lakehouse.settings import Settings

__all__ = ["ROLES", "add_verbs"]

ROLES: dict[str, str] = {}
EXIT_INCOMPLETE = 4  # done as far as it could: run again after the grace period


def _cmd_forget(settings: Settings, args) -> int:
    from projection_core.forget_subject import forget_subject

    report = forget_subject(settings, args.subject, args.reason, dry_run=args.dry_run,
                            grace_s=args.grace_minutes * 60.0, wait_s=args.wait_seconds,
                            record=not args.no_log_event)
    for line in report.lines():
        print(line)
    return 0 if report.complete or report.dry_run else EXIT_INCOMPLETE


def add_verbs(sub) -> None:
    p = sub.add_parser("forget", help="forget a data subject: delete their key, null their values in every read "
                                      "model and purge them from the tables' history (docs/forgetting.md)")
    p.add_argument("subject", help="the data subject's id (the account domain's customer_id)")
    p.add_argument("--reason", required=True, help="why (recorded in each table's history)")
    p.add_argument("--dry-run", action="store_true", help="say what would be done; change nothing")
    p.add_argument("--grace-minutes", type=float, default=15.0,
                   help="old files written this recently are left for the next run (a writer's open transaction "
                        "may hold them); default 15")
    p.add_argument("--wait-seconds", type=float, default=120.0,
                   help="how long to wait for the projections' batches planned before the key went (they may have "
                        "read the subject's values) to commit; default 120")
    p.add_argument("--no-log-event", action="store_true",
                   help="do not send the forget commands that append SubjectForgotten to each of the subject's "
                        "aggregates, nor delete the handled commands from the commands topic (a home whose broker "
                        "is gone: the tables are erased all the same)")
    p.set_defaults(run=_cmd_forget)
