"""The read side's running services: project, detect-anomalies, status; and the Spark detectors a domain's
verb may run (:class:`SparkApps`). The one place the CLI imports the projection's engines."""
from __future__ import annotations

from eventlake.cli.common import require_broker
from lakehouse.settings import Settings

__all__ = ["ROLES", "add_verbs", "SparkApps"]

# The Kafka principal each verb runs as when SASL is on (the others: admin); see eventlake.cli.roles.
ROLES = {"detect-anomalies": "client", "project": "reader", "status": "reader", "metrics": "reader",
         "lag-exporter": "reader"}


def _cmd_project(settings: Settings, args) -> int:
    from spark_apps.projection import project
    from spark_apps.projection import default_engine

    require_broker(settings)
    engine = args.engine
    if engine == "auto":
        engine, why = default_engine(settings)
        print(f"projection: engine {engine}: {why}", flush=True)
    return project(settings, args.models, until_caught_up=args.until_caught_up, engine=engine)


class SparkApps:
    """The Spark detector apps a domain's verb may run (``event_store.verbs.VerbHost``)."""

    def run_spark_detector(self, app: str, settings: Settings, until_caught_up: bool) -> int:
        if app == "fraud_detector":
            from spark_apps.fraud_detector import run_detection
        elif app == "telemetry_detector":
            from spark_apps.telemetry_detector import run_detection
        else:
            raise ValueError(f"no Spark detector app {app!r}; known: fraud_detector, telemetry_detector")
        return run_detection(settings, until_caught_up=until_caught_up)


def _cmd_detect_anomalies(settings: Settings, args) -> int:
    from lakehouse.lineage import detector_run, parent_id

    require_broker(settings)
    with detector_run(settings, "detect-anomalies", args.until_caught_up) as run:
        # With spark_lineage=all, the Spark application's run is this run's child.
        return SparkApps().run_spark_detector("telemetry_detector", settings.replace(
            lineage_parent=parent_id(settings, run)), args.until_caught_up)


def _cmd_status(settings: Settings, args) -> int:
    from event_store.account.fraud_state import status_line
    from spark_apps.status import log_end, render

    print(render(settings))
    from event_store.state_store import status_lines  # the handler's state store per partition (issue 42)
    from python_engine import key_index  # the Python engine's table indexes (issue 42)
    for line in [*status_lines(settings.home, settings.events_topic), *key_index.status_lines(settings.checkpoints)]:
        print(line)
    detector = status_line(settings, log_end(settings))
    if detector:
        print(detector)
    return 0


def _cmd_metrics(settings: Settings, args) -> int:
    from lakehouse import metrics

    for line in metrics.table(settings):
        print(line)
    return 0


def _cmd_lag_exporter(settings: Settings, args) -> int:
    from eventlake.lag_exporter import LagExporter, lines
    from lakehouse import metrics
    from lakehouse.signals import stop_requested_on_sigterm

    log = lambda message: print(message, flush=True)  # noqa: E731 -- a service's log, seen even if it is killed
    projections = [[n for n in value.replace(",", " ").split() if n] for value in args.projection]
    exporter = LagExporter(settings, projections, args.every, log)
    if args.once:
        exporter.run(once=True)
        for line in lines(exporter.snapshot):
            print(line)
        return 0 if exporter.snapshot.refreshed_at is not None else 1
    stop_requested_on_sigterm(exporter.stop)
    server = metrics.serve(settings, "lag-exporter", exporter.figures, log)
    try:
        exporter.run()
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            server.close()
    return 0


def add_verbs(sub) -> None:
    """Add this group's verbs to the ``eventlake`` parser's subparsers."""
    p = sub.add_parser("project", help="run the projection into the Delta read models and the event archive")
    p.add_argument("models", nargs="*", help="read model names and/or event_archive (default: all read models, "
                                             "plus event_archive as a query of its own)")
    p.add_argument("--until-caught-up", action="store_true", help="project what the log holds now, then stop")
    p.add_argument("--engine", choices=("auto", "python", "spark"), default="auto",
                   help="python: the queries run in this process by DuckDB and delta-rs, a live batch in tenths of a "
                        "second, handing any batch off its common path (records that are not events, replays, "
                        "version gaps) to the Spark query on the same checkpoint; spark: the Structured Streaming "
                        "queries, seconds per batch; auto (default): python where it runs (local tables and "
                        "checkpoints, no Spark cluster named), else spark")
    p.set_defaults(run=_cmd_project)

    p = sub.add_parser("detect-anomalies", help="run the telemetry detector (device events -> FlagTelemetryAnomaly "
                                                "commands)")
    p.add_argument("--until-caught-up", action="store_true", help="process what the log holds now, then stop")
    p.set_defaults(run=_cmd_detect_anomalies)

    p = sub.add_parser("status", help="per projection: lag, last batch and rate; per table: rows and Delta version")
    p.set_defaults(run=_cmd_status)

    p = sub.add_parser("lag-exporter", help="serve how far each projection and each service's consumer group is "
                                            "behind the log, from their committed positions (while they are stopped "
                                            "too) as Prometheus metrics")
    p.add_argument("--projection", action="append", default=[], metavar="NAMES",
                   help="a projection to watch, named as `eventlake project NAMES` names it (comma- or space-separated"
                        "); repeat for each; default: the default projection (every read model, and event_archive)")
    p.add_argument("--every", type=float, default=10.0, metavar="SECONDS", help="how often to read the positions")
    p.add_argument("--once", action="store_true", help="read the positions once, print them and stop")
    p.set_defaults(run=_cmd_lag_exporter)

    p = sub.add_parser("metrics", help="the Prometheus metrics of the services running from this home (handler, "
                                       "projection), read from their /metrics endpoints")
    p.set_defaults(run=_cmd_metrics)
