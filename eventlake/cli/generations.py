"""The verbs of read model generations: catalog, rebuild, reprocess, maintenance, rollback."""
from __future__ import annotations

import sys

from lakehouse.settings import Settings
from eventlake.cli.common import require_broker, who

__all__ = ["ROLES", "add_verbs"]

# The Kafka principal each verb runs as when SASL is on (the others: admin); see eventlake.cli.roles.
ROLES = {"catalog": "reader", "rebuild": "reader", "reprocess": "reader", "maintenance": "reader",
         "rollback": "reader"}


def _cmd_rollback(settings: Settings, args) -> int:
    """Switch a read model back to its previous generation (one catalog commit); refused with the reason when
    there is none left."""
    from read_models.catalog import Catalog, CatalogError

    catalog = Catalog(settings)
    try:
        before = catalog.state(args.name)
        after = catalog.rollback(args.name, by=who(args), reason=args.reason or "")
    except CatalogError as e:
        print(f"eventlake rollback: {e}", file=sys.stderr)
        return 1
    print(f"rollback: {args.name} is back on generation {after.number} (was {before.current}); readers and the "
          f"running projection use {after.table} from now on")
    if before.switched is not None:
        print(f"note: the live projection kept generation {after.number} up to date beside generation "
              f"{before.current} (a rollback target is followed); `eventlake check --reconcile {args.name}` "
              f"compares it with the log")
    return 0


def _cmd_rebuild(settings: Settings, args) -> int:
    """Rebuild read models from the event archive into new generations, check them and switch (issue 9)."""
    from spark_apps.rebuild import rebuild_models

    require_broker(settings)
    return rebuild_models(settings, args.models, by=who(args), reason=args.reason or "", dry_run=args.dry_run)


def _cmd_reprocess(settings: Settings, args) -> int:
    """Recompute the closed windows of a time range from the event archive, late events included, and replace
    that range of the current generation (issue 9)."""
    from spark_apps.reprocess import ReprocessError, ReprocessRefused, reprocess, reprocess_run, validate

    try:  # bad input is told before a Spark session is started
        validate(args.name, args.start, args.end)
    except ReprocessError as e:
        print(f"eventlake reprocess: {e}", file=sys.stderr)
        return 2
    from spark_apps.session import build_session

    run = reprocess_run(settings, args.name)  # the Spark application's parent in lineage
    spark = build_session(settings, app_name="eventlake-reprocess", job=True, lineage_parent=run)
    try:
        reprocess(spark, settings, args.name, args.start, args.end, by=who(args), lineage_run_id=run.run_id)
    except ReprocessRefused as e:
        print(f"eventlake reprocess: {e}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    return 0


def _cmd_maintenance(settings: Settings, args) -> int:
    """What the maintenance DAG does, by hand: drop generations beyond the last two, OPTIMIZE and VACUUM the
    tables of those kept (spark_apps/maintenance.py). Exit 1 when a model was skipped or a step not done."""
    import read_models
    from spark_apps.maintenance import DEFAULT_RETENTION_HOURS, MaintenanceError

    names = args.models or list(read_models.REGISTRY)
    unknown = [n for n in names if n not in read_models.REGISTRY]
    if unknown:
        print(f"eventlake maintenance: unknown read model(s) {', '.join(unknown)}; known: "
              f"{', '.join(read_models.REGISTRY)}", file=sys.stderr)
        return 2
    if args.retention_hours < DEFAULT_RETENTION_HOURS:  # told before a Spark session is started
        print(f"eventlake maintenance: --retention-hours {args.retention_hours}: below Delta's default retention of "
              f"{DEFAULT_RETENTION_HOURS} hours (readers and writers in flight could lose files)", file=sys.stderr)
        return 2
    from spark_apps.maintenance import maintain
    from spark_apps.session import build_session

    spark = build_session(settings, app_name="eventlake-maintenance", job=True)
    incomplete = []
    try:
        for name in names:
            try:
                report = maintain(spark, settings, name, args.retention_hours, by=who(args), log=lambda _: None)
            except MaintenanceError as e:
                print(f"eventlake maintenance: {e}", file=sys.stderr)
                return 2
            print("\n".join(report.lines()), flush=True)
            if report.skipped or report.problems:
                incomplete.append(name)
    finally:
        spark.stop()
    if incomplete:
        print(f"eventlake maintenance: not complete for {', '.join(incomplete)} (see above); run it again later",
              file=sys.stderr)
        return 1
    return 0


def _cmd_catalog(settings: Settings, args) -> int:
    """Each read model's current generation and every change of the catalog."""
    from read_models.catalog import Catalog, CatalogError

    catalog = Catalog(settings)
    try:
        states = catalog.states(args.models or None)
    except CatalogError as e:
        print(f"eventlake catalog: {e}", file=sys.stderr)
        return 2
    print(f"catalog {catalog.path}")
    for name, state in states.items():
        print(f"{name}: generation {state.current} is current")
        for number, generation in sorted(state.generations.items()):
            tags = [t for t, on in (("current", number == state.current), ("dropped", number in state.dropped))
                    if on]
            at = "" if generation.position is None else "; complete up to offsets " + ", ".join(
                f"p{p}<{o}" for p, o in sorted(generation.position.items()))
            print(f"  generation {number}{' (' + ', '.join(tags) + ')' if tags else ''}: {generation.table}{at}")
        for e in state.entries:
            previous = f" (from generation {e.previous})" if e.previous is not None else ""
            print(f"    {e.at:%Y-%m-%d %H:%M:%S}Z  {e.action:<10} generation {e.generation}{previous}  "
                  f"by {e.by or '?'}: {e.reason or 'no reason given'}")
        if not state.entries:
            print("    (no changes yet: the tables from before generations)")
    return 0


def add_verbs(sub) -> None:
    """Add this group's verbs to the ``eventlake`` parser's subparsers."""
    p = sub.add_parser("catalog", help="each read model's current generation and the catalog's changes")
    p.add_argument("models", nargs="*", help="read models to show (default: all)")
    p.set_defaults(run=_cmd_catalog)

    p = sub.add_parser("rebuild", help="rebuild read models from the event archive into new generations, check "
                                       "them and switch readers to them (the current ones serve meanwhile)")
    p.add_argument("models", nargs="+", help="read models to rebuild")
    p.add_argument("--dry-run", action="store_true", help="build and check, but do not switch (the new "
                                                          "generation is dropped)")
    p.add_argument("--reason", help="why (kept in the catalog)")
    p.add_argument("--by", help="who asks (default: the current user)")
    p.set_defaults(run=_cmd_rebuild)

    p = sub.add_parser("reprocess", help="recompute the closed windows of a time range of a windowed read model "
                                         "from the event archive (late events included) and replace that range",
                       description="Replaces the windows FROM <= window_start < TO of the current generation in one "
                                   "Delta commit (none when nothing differs) and marks the late events folded in "
                                   "(late_events.reprocessed_at). Only closed windows (ending at or before the "
                                   "watermark). Times: ISO-8601 on minute boundaries, no zone = UTC.")
    p.add_argument("name", help="a windowed read model, e.g. merchant_minute_volume")
    p.add_argument("--from", dest="start", required=True, metavar="T1", help="first window start, e.g. 2026-01-01")
    p.add_argument("--to", dest="end", required=True, metavar="T2", help="end of the range (excluded), e.g. "
                                                                         "2026-01-02T00:00:00Z")
    p.add_argument("--by", help="who asks (default: the current user)")
    p.set_defaults(run=_cmd_reprocess)

    p = sub.add_parser("maintenance", help="drop generations beyond the last two; OPTIMIZE and VACUUM the tables "
                                           "of those kept (what the maintenance DAG runs daily)",
                       description="Per read model, under its rebuild lock (a model being rebuilt is skipped): drops "
                                   "every generation but the current one and the rollback target, compacts their "
                                   "tables (no data change) and vacuums files unreferenced for longer than the "
                                   "retention. Exit 1 when a model was skipped or a step not done (run it again).")
    p.add_argument("models", nargs="*", help="read models (default: all)")
    p.add_argument("--retention-hours", type=int, default=168,
                   help="VACUUM retention, at least Delta's default of 168 hours (default: 168)")
    p.add_argument("--by", help="who runs it (default: the current user)")
    p.set_defaults(run=_cmd_maintenance)

    p = sub.add_parser("rollback", help="switch a read model back to its previous generation (one catalog commit)")
    p.add_argument("name", help="the read model")
    p.add_argument("--reason", help="why (kept in the catalog)")
    p.add_argument("--by", help="who decides (default: the current user)")
    p.set_defaults(run=_cmd_rollback)
