"""The verbs that start, stop and set up components: demo, setup, kafka, spark-cluster, yarn, spark-submit,
airflow."""
from __future__ import annotations

import argparse
import sys

from lakehouse.settings import Settings

__all__ = ["ROLES", "add_verbs"]

# The Kafka principal each verb runs as when SASL is on (the others: admin); see eventlake.cli.roles.
ROLES: dict[str, str] = {}


def _cmd_demo(settings: Settings, args) -> int:
    from eventlake.demo import run_demo

    run_demo(settings, accounts=args.accounts, commands=args.commands, devices=args.devices, sites=args.sites)
    return 0


# Debian packages that some tests use when present (skipped, with this reason, when absent).
OPTIONAL_TOOLS = {"prometheus": "the real-Prometheus test of the metrics (sudo apt-get install prometheus)",
                  "promtool": "the alert rules' checks (in the same package)",
                  "prometheus-pushgateway": "the test of what Airflow's tasks push (sudo apt-get install "
                                            "prometheus-pushgateway)"}


def _cmd_setup(settings: Settings, args) -> int:
    import shutil

    from infra import kafka
    from spark_apps.session import SPARK_PACKAGES, build_session

    for tool, why in OPTIONAL_TOOLS.items():
        if shutil.which(tool) is None:
            print(f"setup: {tool} not found; optional, for {why}")
    if settings.uses_local_kafka:
        kafka.resolve_libs(settings)
        print(f"setup: Kafka broker jars ready in {kafka.libs_dir(settings)}")
    _fetch_data_docs_assets(settings)
    _fetch_spark_lineage(settings)
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


def _fetch_spark_lineage(settings: Settings) -> None:
    """OpenLineage's Spark listener jar (settings.spark_lineage) into the cache, once: the batch jobs' sessions then
    need no network. A fetch that fails is said; set-up goes on (the jobs then run without the listener)."""
    from spark_apps.session import spark_lineage_conf

    if spark_lineage_conf(settings, "eventlake-setup", log=lambda line: print(f"setup: {line}")):
        print("setup: OpenLineage's Spark listener ready (spark_lineage=jobs)")


def _fetch_data_docs_assets(settings: Settings) -> None:
    """Data Docs' styles and scripts from the npm registry into the cache, once (expectations.data_docs_assets):
    without them the pages load them from CDNs. A registry that cannot be reached is said; set-up goes on."""
    from expectations import data_docs_assets

    if not data_docs_assets.missing(settings.cache_dir):
        return
    try:
        data_docs_assets.fetch(settings.cache_dir)
    except Exception as e:  # the registry away or refusing: the pages keep their CDN links
        print(f"setup: Data Docs' styles and scripts not fetched from {data_docs_assets.REGISTRY} "
              f"({type(e).__name__}: {e}); the Data Docs pages load them from CDNs until `eventlake setup` "
              f"fetches them")


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


def add_verbs(sub) -> None:
    """Add this group's verbs to the ``eventlake`` parser's subparsers."""
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

    p = sub.add_parser("airflow", help="run an airflow command on eventlake's DAGs with a local metadata database",
                       description="Runs `airflow ARGS` with AIRFLOW_HOME under the eventlake home, the DAGs folder "
                                   "set to dags/ and no example DAGs (the database is migrated on first use).")
    p.add_argument("args", nargs=argparse.REMAINDER, help="e.g. standalone | dags list | dags test check_read_models")
    p.set_defaults(run=_cmd_airflow)
