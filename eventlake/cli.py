"""``eventlake``: the one console entry point. Run ``eventlake --help`` for the subcommands."""
from __future__ import annotations

import argparse
import sys

from lakehouse.settings import Settings, SettingsError

__all__ = ["main"]


def _cmd_setup(settings: Settings, args) -> int:
    from infra import kafka
    from spark_apps.session import SPARK_PACKAGES, build_session

    if settings.uses_local_kafka:
        kafka.resolve_libs(settings)
        print(f"setup: Kafka broker jars ready in {kafka.libs_dir(settings)}")
    marker = settings.cache_dir / "spark-packages.resolved"
    if marker.exists() and marker.read_text() == ",".join(SPARK_PACKAGES):
        print(f"setup: Spark packages already in {settings.cache_dir / 'ivy'}")
        return 0
    spark = build_session(settings, app_name="eventlake-setup")
    spark.range(1).count()
    spark.stop()
    marker.write_text(",".join(SPARK_PACKAGES))
    print(f"setup: Spark {spark.version} with Delta and the Kafka source ready (Ivy cache {settings.cache_dir / 'ivy'})")
    return 0


def _cmd_kafka(settings: Settings, args) -> int:
    from infra import kafka

    if args.brokers is not None:
        settings = settings.replace(kafka_brokers=args.brokers)
    if args.security is not None:
        settings = settings.replace(kafka_security=args.security)
    if args.action == "up":
        state = kafka.up(settings)
        print(state.describe())
        if settings.kafka_security != "none":
            from event_store import kafka_log
            from event_store.kafka_access import grant_acls

            admin = settings.for_role("admin")
            kafka_log.ensure_topics(admin)
            grant_acls(admin)
            tls = f" over TLS (clients trust {settings.ssl_cafile})" if settings.kafka_security.endswith("_tls") else ""
            print(f"kafka: SASL/SCRAM ({settings.kafka_sasl_mechanism}){tls}; users and passwords of each role in "
                  f"{settings.credentials_file} (mode 0600)")
    elif args.action == "down":
        kafka.down(settings)
    else:
        if not settings.uses_local_kafka:
            print(f"kafka: using the cluster at {settings.kafka_bootstrap_servers} (KAFKA_BOOTSTRAP_SERVERS); "
                  "no local broker is managed")
        else:
            print(kafka.status(settings).describe())
    return 0


def _cmd_spark_cluster(settings: Settings, args) -> int:
    from infra import spark_standalone

    if args.workers is not None:
        settings = settings.replace(spark_cluster_workers=args.workers)
    if args.action == "up":
        print(spark_standalone.up(settings).describe())
    elif args.action == "down":
        spark_standalone.down(settings)
    else:
        state = spark_standalone.status(settings)
        print(state.describe())
        return 0 if state.running else 3
    return 0


def _cmd_yarn(settings: Settings, args) -> int:
    from infra import yarn

    try:
        if args.action == "up":
            print(yarn.up(settings).describe())
        elif args.action == "down":
            yarn.down(settings)
        else:
            state = yarn.status(settings)
            print(state.describe())
            return 0 if state.running else 3
    except yarn.YarnError as e:
        print(f"eventlake yarn: {e}", file=sys.stderr)
        return 1
    return 0


def _spark_submit_options(add_help: bool = False) -> argparse.ArgumentParser:
    """The options of ``eventlake spark-submit`` (before ``--``; what follows ``--`` is the app's)."""
    p = argparse.ArgumentParser(add_help=add_help, prog="eventlake spark-submit APP")
    p.add_argument("--master", help="Spark master URL (default: EVENTLAKE_SPARK_MASTER)")
    p.add_argument("--deploy-mode", default="client", choices=["client", "cluster"],
                   help="cluster: the driver runs in the cluster (YARN, Kubernetes); EVENTLAKE_* and "
                        "KAFKA_BOOTSTRAP_SERVERS are forwarded to it")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="more Spark settings")
    p.add_argument("--dry-run", action="store_true", help="print the line, do not run it")
    return p


def _cmd_spark_submit(settings: Settings, args) -> int:
    """Package the apps and print, then run, the spark-submit line of one (issue 12)."""
    from infra import spark_submit

    # Options may come before or after the app; the app's own arguments only after "--".
    rest = list(args.rest)
    own, app_args = (rest[:rest.index("--")], rest[rest.index("--") + 1:]) if "--" in rest else (rest, [])
    options, unknown = _spark_submit_options().parse_known_args(own, namespace=argparse.Namespace(
        master=args.master, deploy_mode=args.deploy_mode, conf=list(args.conf), dry_run=args.dry_run))
    if unknown:
        print(f"eventlake spark-submit: unknown option(s) {' '.join(unknown)}; the app's own arguments go after "
              f"--, e.g. eventlake spark-submit {args.app} -- {' '.join(unknown)}", file=sys.stderr)
        return 2
    conf = {}
    for item in options.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"eventlake spark-submit: --conf {item!r}: expected KEY=VALUE", file=sys.stderr)
            return 2
        conf[key] = value
    try:
        built = spark_submit.package(settings)
        line = spark_submit.submit_command(settings, args.app, app_args, master=options.master,
                                           deploy_mode=options.deploy_mode, conf=conf, built=built)
    except spark_submit.SubmitError as e:
        print(f"eventlake spark-submit: {e}", file=sys.stderr)
        return 2
    print(f"spark-submit: {args.app}: code {built.zip_path} ({built.modules} modules), launcher "
          f"{built.launchers[args.app]}, jars from {settings.cache_dir}", flush=True)
    print(spark_submit.shown(line), flush=True)
    if options.dry_run:
        return 0
    code = spark_submit.run(line)
    print(f"spark-submit: {args.app} exited with {code}", flush=True)
    return code


def _require_broker(settings: Settings) -> None:
    """The cluster runs and lets this process's principal in (else one line saying why not)."""
    from event_store.kafka_access import check_access
    from infra import kafka

    if settings.uses_local_kafka and not kafka.status(settings).running:
        raise SystemExit(f"eventlake: the local Kafka broker is not running at {settings.bootstrap_servers}; "
                         "start it with `eventlake kafka up` (or set KAFKA_BOOTSTRAP_SERVERS)")
    # Refused (no or wrong credentials): stop here with the reason. No answer: the services wait for the cluster.
    check_access(settings, timeout_s=5.0, require_answer=False)


def _cmd_topics(settings: Settings, args) -> int:
    from event_store import kafka_log

    _require_broker(settings)
    kafka_log.ensure_topics(settings)
    if settings.kafka_security != "none":
        from event_store.kafka_access import grant_acls

        grant_acls(settings)
    for name, cfg in kafka_log.topic_configs(settings).items():
        print(f"{name}: {settings.topic_partitions} partitions, "
              + ", ".join(f"{k}={v}" for k, v in sorted(cfg.items())))
    return 0


def _cmd_generate(settings: Settings, args) -> int:
    import json
    from collections import Counter

    from event_store.client import EventStore
    from eventlake.generator import GeneratorConfig, dated, generate_commands

    _require_broker(settings)
    if args.domain == "iot":
        from datetime import datetime, timedelta, timezone

        from eventlake.generator import IotGeneratorConfig, generate_iot_commands

        # Event times end at about now: readings the handler would date in the future are not made.
        start = datetime.now(timezone.utc) - timedelta(minutes=args.minutes + 10)
        records = list(generate_iot_commands(IotGeneratorConfig(devices=args.devices, minutes=args.minutes,
                                                                seed=args.seed, run_id=args.run_id, start=start)))
        what = f"{args.devices} devices"
    elif args.domain == "site":
        from datetime import datetime, timedelta, timezone

        from eventlake.generator import SiteGeneratorConfig, generate_site_commands

        start = datetime.now(timezone.utc) - timedelta(minutes=args.minutes + 10)
        records = list(generate_site_commands(SiteGeneratorConfig(sites=args.sites, views=args.views,
                                                                  minutes=args.minutes, seed=args.seed,
                                                                  run_id=args.run_id, start=start)))
        what = f"{args.sites} sites"
    else:
        # Dated from now (after the log's newest event): a second run is on time, not late against the first.
        cfg = dated(GeneratorConfig(accounts=args.accounts, commands=args.commands, seed=args.seed,
                                    run_id=args.run_id, invalid_rate=args.invalid_rate,
                                    malformed_rate=args.malformed_rate), settings)
        records = list(generate_commands(cfg))
        what = f"{args.accounts} accounts"
    with EventStore(settings) as store:
        sent = store.send_raw(records)
        print(f"generate: sent {sent} commands for {what} to {settings.commands_topic}")
        if args.wait:
            ids = []
            for _, value in records:
                try:
                    obj = json.loads(value)
                    ids.append(obj["command_id"]) if isinstance(obj, dict) and obj.get("command_id") else None
                except ValueError:
                    pass  # a malformed record: dead-lettered, no result to wait for
            try:
                results = store.wait_for(ids, timeout_s=args.timeout)
            except TimeoutError as e:
                print(f"generate: {e}", file=sys.stderr)
                return 1
            counts = Counter(r.status for r in results.values())
            print(f"generate: {len(results)} results on {settings.results_topic}: "
                  + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    return 0


def _read_commands(text: str, source: str) -> list:
    """Commands from one JSON object, a JSON array, or JSON lines."""
    import json

    text = text.strip()
    if not text:
        return []
    try:
        obj = json.loads(text)
        return obj if isinstance(obj, list) else [obj]
    except json.JSONDecodeError:
        pass
    commands = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                commands.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"eventlake submit: {source} line {number} is not JSON ({e}); expected one JSON "
                                 f"object, a JSON array or JSON lines")
    return commands


def _cmd_submit(settings: Settings, args) -> int:
    from event_store.client import EventStore, as_command
    from event_store.errors import InvalidRecord

    _require_broker(settings)
    source = "stdin" if args.file == "-" else args.file
    try:
        text = sys.stdin.read() if args.file == "-" else open(args.file, encoding="utf-8").read()
    except OSError as e:
        raise SystemExit(f"eventlake submit: cannot read {source}: {e.strerror}")
    commands, failed = [], 0
    for i, obj in enumerate(_read_commands(text, source), 1):
        try:
            commands.append(as_command(obj))
        except InvalidRecord as e:
            failed += 1
            print(f"not sent: command #{i} in {source}: {e}", file=sys.stderr)
    with EventStore(settings) as store:
        sent = store.submit_many(commands)
        print(f"submit: sent {len(sent)} command(s) to {settings.commands_topic}", file=sys.stderr)
        if args.no_wait:
            return 1 if failed else 0
        try:
            results = store.wait_for(sent, timeout_s=args.timeout, what={c.command_id: c for c in commands})
        except TimeoutError as e:
            print(f"eventlake submit: {e}", file=sys.stderr)
            return 1
    for command in commands:
        r = results[command.command_id]
        if args.json:
            print(r.to_json().decode())
        elif r.accepted:
            print(f"accepted {r.command_id} {command.command_type} {r.aggregate_id}: version {r.version}, "
                  f"{len(r.event_ids)} event(s){' (duplicate: first result repeated)' if r.duplicate else ''}")
        else:
            print(f"rejected {r.command_id} {command.command_type} {r.aggregate_id}: {r.error_type}: {r.reason}"
                  f"{' (duplicate: first result repeated)' if r.duplicate else ''}")
    return 1 if failed else 0


def _cmd_resolve_quarantine(settings: Settings, args) -> int:
    """Send ResolveQuarantine for one account and print its result: the operator's decision on the record
    that quarantined it, recorded as a QuarantineResolved event (the audit trail)."""
    import getpass

    from event_store.client import EventStore
    from event_store.envelope import CommandEnvelope
    from event_store.errors import InvalidRecord

    _require_broker(settings)
    try:
        resolved_by = args.by or getpass.getuser()
    except (KeyError, OSError):
        resolved_by = "operator"
    try:
        command = CommandEnvelope.create("ResolveQuarantine", args.account,
                                         {"record": args.record, "reason": args.reason, "resolved_by": resolved_by})
    except InvalidRecord as e:
        raise SystemExit(f"eventlake resolve-quarantine: {e}")
    with EventStore(settings) as store:
        sent = store.submit_many([command])
        try:
            results = store.wait_for(sent, timeout_s=args.timeout, what={command.command_id: command})
        except TimeoutError as e:
            print(f"eventlake resolve-quarantine: {e}", file=sys.stderr)
            return 1
    r = results[command.command_id]
    if r.accepted:
        print(f"resolved: account {args.account} takes commands again (QuarantineResolved at version {r.version}, "
              f"record {args.record}, by {resolved_by})")
        return 0
    print(f"not resolved: account {args.account}: {r.error_type}: {r.reason}", file=sys.stderr)
    return 1


def _cmd_policy(settings: Settings, args) -> int:
    from event_store.account.policy import FraudPolicy
    from lakehouse.signals import stop_requested_on_sigterm

    _require_broker(settings)
    policy = FraudPolicy(settings)
    stop_requested_on_sigterm(policy.stop)  # ends run() within seconds, whatever it waits for
    try:
        stats = policy.run(until_caught_up=args.until_caught_up)
    except KeyboardInterrupt:
        stats = policy.stats
    print(f"policy: {stats.line()} to {settings.commands_topic}")
    return 0


def _cmd_handler(settings: Settings, args) -> int:
    from event_store.handler import CommandHandler

    _require_broker(settings)
    log = lambda message: print(message, flush=True)  # noqa: E731 -- a service's log, seen even if it is killed
    with CommandHandler(settings, instance_id=args.instance_id, use_snapshots=not args.no_snapshots,
                        log=log) as handler:
        from lakehouse.signals import stop_requested_on_sigterm

        # SIGTERM (e.g. from Kubernetes) stops after the current batch; closing then writes the snapshots.
        stop_requested_on_sigterm(handler.stop)
        try:
            stats = handler.run(until_caught_up=args.until_caught_up)
        except KeyboardInterrupt:
            stats = handler.stats
    print(f"handler: {stats.line()}")
    return 0


def _cmd_project(settings: Settings, args) -> int:
    from spark_apps import projection

    _require_broker(settings)
    engine = args.engine
    if engine == "auto":
        from spark_apps.python_projection import default_engine

        engine, why = default_engine(settings)
        print(f"projection: engine {engine}: {why}", flush=True)
    return projection.main([*args.models, *(["--until-caught-up"] if args.until_caught_up else []),
                            "--engine", engine])


def _cmd_detect_fraud(settings: Settings, args) -> int:
    _require_broker(settings)
    if args.engine == "spark":
        from spark_apps import fraud_detector

        return fraud_detector.main(["--until-caught-up"] if args.until_caught_up else [])
    from event_store.account.fraud_consumer import FraudConsumer
    from event_store.kafka_access import check_access
    from lakehouse.signals import stop_requested_on_sigterm

    check_access(settings, timeout_s=5.0, require_answer=False)
    detector = FraudConsumer(settings, log=lambda message: print(message, flush=True))
    stop_requested_on_sigterm(detector.stop)  # ends run() within seconds, whatever it waits for
    try:
        stats = detector.run(until_caught_up=args.until_caught_up)
    except KeyboardInterrupt:
        stats = detector.stats
    print(f"fraud detector: {stats.line()}; findings are FlagFraud commands on {settings.commands_topic}")
    return 0


def _cmd_detect_anomalies(settings: Settings, args) -> int:
    from spark_apps import telemetry_detector

    _require_broker(settings)
    return telemetry_detector.main(["--until-caught-up"] if args.until_caught_up else [])


def _cmd_status(settings: Settings, args) -> int:
    from event_store.account.fraud_consumer import status_line
    from spark_apps.status import log_end, render

    print(render(settings))
    detector = status_line(settings, log_end(settings))
    if detector:
        print(detector)
    return 0


def _who(args) -> str:
    import getpass

    try:
        return args.by or getpass.getuser()
    except (KeyError, OSError):
        return "operator"


def _cmd_rollback(settings: Settings, args) -> int:
    """Switch a read model back to its previous generation (one catalog commit); refused with the reason when
    there is none left."""
    from read_models.catalog import Catalog, CatalogError

    catalog = Catalog(settings)
    try:
        before = catalog.state(args.name)
        after = catalog.rollback(args.name, by=_who(args), reason=args.reason or "")
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
    from spark_apps import rebuild

    _require_broker(settings)
    return rebuild.main([*args.models, *(["--dry-run"] if args.dry_run else []), f"--reason={args.reason or ''}",
                         f"--by={_who(args)}"])


def _cmd_reprocess(settings: Settings, args) -> int:
    """Recompute the closed windows of a time range from the event archive, late events included, and replace
    that range of the current generation (issue 9)."""
    from spark_apps.reprocess import ReprocessError, ReprocessRefused, reprocess, validate

    try:  # bad input is told before a Spark session is started
        validate(args.name, args.start, args.end)
    except ReprocessError as e:
        print(f"eventlake reprocess: {e}", file=sys.stderr)
        return 2
    from spark_apps.session import build_session

    spark = build_session(settings, app_name="eventlake-reprocess")
    try:
        reprocess(spark, settings, args.name, args.start, args.end, by=_who(args))
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

    spark = build_session(settings, app_name="eventlake-maintenance")
    incomplete = []
    try:
        for name in names:
            try:
                report = maintain(spark, settings, name, args.retention_hours, by=_who(args), log=lambda _: None)
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
    from expectations.cross_model import check_agreements

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


def _cmd_airflow(settings: Settings, args) -> int:
    from infra import airflow

    if not args.args:
        print("eventlake airflow: give an airflow command, e.g. `eventlake airflow standalone` (the UI on "
              "http://localhost:8080) or `eventlake airflow dags test check_read_models`", file=sys.stderr)
        return 2
    try:
        return airflow.run(settings, args.args)
    except airflow.AirflowError as e:
        print(f"eventlake airflow: {e}", file=sys.stderr)
        return 1


def _cmd_query(settings: Settings, args) -> int:
    from eventlake.query import (QueryError, describe_as_of, format_csv, format_json_lines, format_table,
                                 logical_tables, parse_as_of, query_duckdb, query_spark)

    run = query_spark if args.engine == "spark" else query_duckdb
    try:
        as_of = None if args.as_of is None else parse_as_of(args.as_of)
        travelled = {} if as_of is None else logical_tables(settings, as_of)
        if travelled:
            print(f"eventlake query: {describe_as_of(travelled, as_of)}", file=sys.stderr)
        columns, rows = run(settings, args.sql, as_of)
    except QueryError as e:
        print(f"eventlake query: {e}", file=sys.stderr)
        return 2
    if args.format == "csv":
        text = format_csv(columns, rows)
    elif args.format == "json":
        text = format_json_lines(columns, rows)
    else:
        text = format_table(columns, rows, max_rows=args.max_rows)
    if text:
        print(text)
    return 0


def _cmd_history(settings: Settings, args) -> int:
    from eventlake.history import HistoryError, format_history, history

    try:
        what, lines = history(settings, args.name, args.generation, args.limit)
    except HistoryError as e:
        print(f"eventlake history: {e}", file=sys.stderr)
        return 2
    print(format_history(what, lines))
    return 0


def _read_new_password(name: str, from_stdin: bool) -> str:
    """A password from one line of stdin, or typed twice at a prompt that does not echo it."""
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    import getpass

    password = getpass.getpass(f"password for {name}: ")
    if getpass.getpass(f"password for {name} (again): ") != password:
        raise ValueError(f"the two passwords typed for user {name} differ; nothing changed")
    return password


def _cmd_sql_users(settings: Settings, args) -> int:
    from eventlake import sql_users

    try:
        if args.users_action == "list":
            users = sql_users.list_users(settings)
            for user in users:
                print(user.describe())
            if not users:
                print(f"no users yet ({sql_users.users_file(settings)}); `eventlake sql-server start` makes one")
        elif args.users_action == "add":
            tables = None if args.tables is None else args.tables.split(",")
            password = _read_new_password(args.name, args.password_stdin)
            existed = sql_users.add_user(settings, args.name, password, tables)
            grant = "every table" if tables is None else ", ".join(t.strip() for t in tables if t.strip())
            print(f"sql-server: user {args.name} {'changed' if existed else 'added'} (may read {grant}); "
                  f"takes effect at their next login")
        else:
            sql_users.remove_user(settings, args.name)
            print(f"sql-server: user {args.name} removed; new logins as {args.name} are refused")
    except ValueError as e:  # SqlUsersError, or passwords typed differently
        print(f"eventlake sql-server users: {e}", file=sys.stderr)
        return 2
    return 0


def _cmd_sql_server(settings: Settings, args) -> int:
    from eventlake import sql_server

    if args.action == "users":
        return _cmd_sql_users(settings, args)
    try:
        if args.action == "start":
            sql_server.start(settings)
        elif args.action == "stop":
            sql_server.stop(settings)
        elif args.action == "serve":
            sql_server.serve(settings)
        else:
            state = sql_server.status(settings)
            print(state.describe())
            return 0 if state.running else 3
    except sql_server.SqlServerError as e:
        print(f"eventlake sql-server: {e}", file=sys.stderr)
        return 1
    return 0


def _cmd_demo(settings: Settings, args) -> int:
    from eventlake.demo import run_demo

    run_demo(settings, accounts=args.accounts, commands=args.commands, devices=args.devices, sites=args.sites)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eventlake",
        description="Event-sourced CQRS data platform: Kafka log -> Spark projections -> Delta read models -> SQL. "
                    "Settings come from EVENTLAKE_* variables, KAFKA_BOOTSTRAP_SERVERS or the TOML file in "
                    "EVENTLAKE_CONFIG.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="run the whole path on local defaults and print a summary")
    p.add_argument("--accounts", type=int, default=300)
    p.add_argument("--commands", type=int, default=3000, help="account commands in all")
    p.add_argument("--devices", type=int, default=24, help="IoT devices (at least 8: the generator's cases)")
    p.add_argument("--sites", type=int, default=3, help="sites of the page views (100 views per device)")
    p.set_defaults(run=_cmd_demo)

    p = sub.add_parser("setup", help="fetch the Kafka broker jars and Spark packages once (offline afterwards)")
    p.set_defaults(run=_cmd_setup)

    p = sub.add_parser("kafka", help="the local Kafka cluster (KRaft, 1 broker or more): up | down | status")
    p.add_argument("action", choices=("up", "down", "status"))
    p.add_argument("--security", choices=("none", "sasl_scram", "sasl_scram_tls"), default=None,
                   help="up: sasl_scram = clients log in with SASL/SCRAM (users and random passwords per role "
                        "generated into $EVENTLAKE_HOME/kafka/credentials.toml) and ACLs let only the command handler "
                        "write events; sasl_scram_tls = the same over TLS (a self-signed certificate, trusted through "
                        "$EVENTLAKE_HOME/kafka/ca.pem); remembered for every later command (default: "
                        "EVENTLAKE_KAFKA_SECURITY, else none)")
    p.add_argument("--brokers", type=int, default=None,
                   help="up: how many brokers (3: every topic on 3 of them, a write acknowledged by 2, so one may be "
                        "lost); remembered for every later command (default: EVENTLAKE_KAFKA_BROKERS, else 1)")
    p.set_defaults(run=_cmd_kafka)

    p = sub.add_parser("spark-cluster", help="a local Spark standalone cluster (a master and workers, each a JVM): "
                                             "up | down | status; run the apps on it with EVENTLAKE_SPARK_MASTER")
    p.add_argument("action", choices=("up", "down", "status"))
    p.add_argument("--workers", type=int, default=None, help="up: how many workers (default 2, 1 core each)")
    p.set_defaults(run=_cmd_spark_cluster)

    p = sub.add_parser("yarn", help="a local YARN cluster with HDFS (Hadoop's mini cluster, one JVM): up | down | "
                                    "status; run the apps on it with HADOOP_CONF_DIR and spark-submit --master yarn")
    p.add_argument("action", choices=("up", "down", "status"))
    p.set_defaults(run=_cmd_yarn)

    from infra.spark_submit import APPS

    p = sub.add_parser("spark-submit", parents=[_spark_submit_options()],
                       help="package the code and run one Spark app with spark-submit (any master: local, "
                            "spark://, yarn, k8s://)",
                       usage="eventlake spark-submit APP [--master URL] [--deploy-mode client|cluster] "
                             "[--conf KEY=VALUE ...] [--dry-run] [-- APP ARGS ...]",
                       description="Zips the apps' code for --py-files, hands over the jars `eventlake setup` "
                                   "resolved with --jars, prints the spark-submit line and runs it. The app's own "
                                   "arguments go after --, e.g. `eventlake spark-submit projection --master yarn "
                                   "--deploy-mode cluster -- --until-caught-up`.")
    p.add_argument("app", choices=list(APPS))
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(run=_cmd_spark_submit)

    p = sub.add_parser("topics", help="create the topics if missing and print their configuration")
    p.set_defaults(run=_cmd_topics)

    p = sub.add_parser("generate", help="send generated commands to the commands topic")
    p.add_argument("--domain", choices=("accounts", "iot", "site"), default="accounts",
                   help="accounts (card payments), iot (device telemetry) or site (page views)")
    p.add_argument("--accounts", type=int, default=300, help="accounts: how many")
    p.add_argument("--commands", type=int, default=3000, help="accounts: commands in all")
    p.add_argument("--devices", type=int, default=24, help="iot: how many devices")
    p.add_argument("--minutes", type=int, default=30, help="iot, site: minutes of event time the readings or views span")
    p.add_argument("--sites", type=int, default=3, help="site: how many sites")
    p.add_argument("--views", type=int, default=600, help="site: page views in all")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--run-id", default="gen", help="prefix of the account, device or site ids (acc-RUNID-00001)")
    p.add_argument("--invalid-rate", type=float, default=0.0, help="share of commands with a bad field")
    p.add_argument("--malformed-rate", type=float, default=0.0, help="share of records that are not commands")
    p.add_argument("--wait", action="store_true", help="wait for every command's result and count them")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for results (with --wait)")
    p.set_defaults(run=_cmd_generate)

    p = sub.add_parser("submit", help="send JSON commands (an object, an array or JSON lines) and print results")
    p.add_argument("file", help="a file, or - for stdin")
    p.add_argument("--no-wait", action="store_true", help="send only; do not wait for the results")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the results")
    p.add_argument("--json", action="store_true", help="print each result as a JSON line")
    p.set_defaults(run=_cmd_submit)

    p = sub.add_parser("resolve-quarantine", help="an operator's decision on a quarantined account (a record of "
                                                  "it in the events topic cannot be read): it takes commands again")
    p.add_argument("account", help="the quarantined account id (eventlake status lists them)")
    p.add_argument("--record", required=True, help="the record that quarantined it, as topic/partition/offset "
                                                   "(in the rejection of its commands and in eventlake status)")
    p.add_argument("--reason", required=True, help="what was decided and why (kept in the QuarantineResolved event)")
    p.add_argument("--by", help="who decides (default: the current user)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the result")
    p.set_defaults(run=_cmd_resolve_quarantine)

    p = sub.add_parser("policy", help="run the fraud policy (FraudSuspected -> FreezeAccount)")
    p.add_argument("--until-caught-up", action="store_true", help="stop once every event so far is read")
    p.set_defaults(run=_cmd_policy)

    p = sub.add_parser("handler", help="run the command handler (commands -> events)")
    p.add_argument("--until-caught-up", action="store_true", help="stop once every command sent so far is handled")
    p.add_argument("--instance-id", default="0",
                   help="distinguishes handler instances; keep it stable per instance (transactional id)")
    p.add_argument("--no-snapshots", action="store_true", help="rebuild state from the whole log on start")
    p.set_defaults(run=_cmd_handler)

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

    p = sub.add_parser("detect-fraud", help="run the fraud detector (events -> FlagFraud commands)")
    p.add_argument("--until-caught-up", action="store_true", help="process what the log holds now, then stop")
    p.add_argument("--engine", choices=("python", "spark"), default="python",
                   help="python (default): a Kafka consumer, findings within a second, state snapshots in the "
                        "checkpoints folder; spark: the Structured Streaming app (what spark-submit runs on a "
                        "cluster), seconds per micro-batch")
    p.set_defaults(run=_cmd_detect_fraud)

    p = sub.add_parser("detect-anomalies", help="run the telemetry detector (device events -> FlagTelemetryAnomaly "
                                                "commands)")
    p.add_argument("--until-caught-up", action="store_true", help="process what the log holds now, then stop")
    p.set_defaults(run=_cmd_detect_anomalies)

    p = sub.add_parser("status", help="per projection: lag, last batch and rate; per table: rows and Delta version")
    p.set_defaults(run=_cmd_status)

    p = sub.add_parser("check", help="check read model tables against their Great Expectations suites")
    p.add_argument("models", nargs="*", help="read models to check (default: all)")
    p.add_argument("--reconcile", action="store_true",
                   help="also compare each table with a plain-Python fold of the archived log up to the table's "
                        "position (about a minute per million events)")
    p.set_defaults(run=_cmd_check)

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

    p = sub.add_parser("airflow", help="run an airflow command on eventlake's DAGs with a local metadata database",
                       description="Runs `airflow ARGS` with AIRFLOW_HOME under the eventlake home, the DAGs folder "
                                   "set to dags/ and no example DAGs (the database is migrated on first use).")
    p.add_argument("args", nargs=argparse.REMAINDER, help="e.g. standalone | dags list | dags test check_read_models")
    p.set_defaults(run=_cmd_airflow)

    p = sub.add_parser("query", help="run SQL over the read models and print the rows (read-only)",
                       description="Runs one read (SELECT, WITH ..., DESCRIBE, SHOW, EXPLAIN) over the read models, "
                                   "each resolved through the catalog to its current generation; a statement that "
                                   "would change a table, or names a table folder by path, is refused.")
    p.add_argument("sql")
    p.add_argument("--engine", choices=("duckdb", "spark"), default="duckdb",
                   help="duckdb: embedded and fast (default); spark: Spark SQL")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="table: aligned columns, the first --max-rows rows (default); csv: every row, with a "
                        "header; json: every row as one JSON object per line")
    p.add_argument("--max-rows", type=int, default=50, help="rows shown by --format table (default 50)")
    p.add_argument("--as-of", metavar="VERSION|TIME",
                   help="time travel: every table at this Delta version, or as it was at this UTC time (the "
                        "generations current then, e.g. 2026-11-24T06:00:00Z); `eventlake history NAME` lists them")
    p.set_defaults(run=_cmd_query)

    p = sub.add_parser("sql-server", help="Spark's Thrift (JDBC/ODBC) server over the read models, read-only",
                       description="start: runs the server in the background and waits until it accepts JDBC "
                                   "connections at jdbc:hive2://HOST:PORT/default (EVENTLAKE_SQL_SERVER_HOST, default "
                                   "127.0.0.1; EVENTLAKE_SQL_SERVER_PORT, default 10000); stop: SIGTERM; status: "
                                   "exit 0 when running, 3 when not; serve: the server in the foreground (what start "
                                   "runs). Every read model, late_events, event_archive and event_dead_letters is a "
                                   "table of that name, following the catalog's switches without a restart. "
                                   "Logins need a user and password (users: manage them; the first start makes "
                                   "the user eventlake and prints its password once); docs/sql-security.md says "
                                   "how a BI tool connects, with TLS (EVENTLAKE_SQL_SERVER_TLS=on).")
    actions = p.add_subparsers(dest="action", required=True, metavar="{start,stop,status,serve,users}")
    for action in ("start", "stop", "status", "serve"):
        actions.add_parser(action)
    users = actions.add_parser("users", help="who may log in, and which tables each may read",
                               description="Users of the SQL server, their hashed passwords and grants, in the "
                                           "users file (EVENTLAKE_SQL_SERVER_USERS_FILE, default "
                                           "<home>/sql-server/users). Changes count from the next login, without "
                                           "a restart.")
    user_actions = users.add_subparsers(dest="users_action", required=True)
    add = user_actions.add_parser("add", help="add a user, or change their password and grant",
                                  description="Prompts for the password twice (not echoed), or reads one line of "
                                              "stdin with --password-stdin.")
    add.add_argument("name")
    add.add_argument("--tables", metavar="A,B", help="the only tables (read models) this user may read; "
                                                     "default: every table")
    add.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    user_actions.add_parser("remove", help="remove a user").add_argument("name")
    user_actions.add_parser("list", help="the users and what each may read")
    p.set_defaults(run=_cmd_sql_server)

    p = sub.add_parser("history", help="a table's commits (version, time, operation, rows, by whom), newest first",
                       description="A read model's current generation (or --generation N): its Delta commits with the "
                                   "projection batch, rebuild or reprocess that made each, and the catalog's changes "
                                   "of the name (created, switched, dropped); also event_archive, "
                                   "event_dead_letters. A version is what `eventlake query --as-of VERSION` reads.")
    p.add_argument("name")
    p.add_argument("--generation", type=int, help="a generation other than the current one")
    p.add_argument("--limit", type=int, default=30, help="the newest commits shown (default 30)")
    p.set_defaults(run=_cmd_history)
    return parser


# The Kafka principal each command runs as when SASL is on and the environment names no user (Settings.for_role):
# the least that command needs (event_store.kafka_access); every other command runs as the admin.
_ROLES = {"handler": "handler",
          "submit": "client", "generate": "client", "resolve-quarantine": "client", "policy": "client",
          "detect-fraud": "client", "detect-anomalies": "client",
          "project": "reader", "status": "reader", "check": "reader", "catalog": "reader", "rebuild": "reader",
          "reprocess": "reader", "maintenance": "reader", "rollback": "reader", "query": "reader",
          "sql-server": "reader", "history": "reader"}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.load(role=_ROLES.get(args.command, "admin"))
    except SettingsError as e:
        print(f"eventlake: {e}", file=sys.stderr)
        return 2
    from event_store.kafka_access import explain_refusal
    from infra.kafka import KafkaError
    from lakehouse.kafka_security import KafkaAccessError

    try:
        return args.run(settings, args)
    except (KafkaError, KafkaAccessError) as e:
        print(f"eventlake: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # errors the platform words for a person (not bugs) end with their message only
        if type(e).__name__ in ("ProjectionError", "HandlerError"):
            print(f"eventlake: {e}", file=sys.stderr)
            return 1
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


if __name__ == "__main__":
    entry()
