"""One settings object for the whole platform, read from the environment or a TOML file.

Precedence: environment variable > config file (``EVENTLAKE_CONFIG``) > default; for ``kafka_brokers`` the
default is the size ``eventlake kafka up --brokers N`` recorded for the local cluster, for ``kafka_security`` (when
no KAFKA_BOOTSTRAP_SERVERS is set) the mode ``eventlake kafka up --security`` recorded. Nothing connects or creates folders here; this only describes
where things are (and, with ``for_role``, whose Kafka credentials a process uses).
"""
from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from lakehouse.storage import Location, is_remote, location
from lakehouse.errors import BadInput

__all__ = ["Settings", "SettingsError", "PROJECT_ROOT", "SECURITY_MODES", "SASL_MECHANISMS"]

SECURITY_MODES = ("none", "sasl_scram", "sasl_scram_tls")
SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")

# The checkout this package runs from (an editable install); caches and local data default to it.
PROJECT_ROOT = Path(__file__).resolve().parents[1]


class SettingsError(BadInput, ValueError):
    """A setting has a value that cannot be used."""


@dataclass(frozen=True)
class Settings:
    # Where local state lives: Kafka data, logs, locks, and the tables and checkpoints unless set below.
    home: Path = PROJECT_ROOT / ".eventlake"
    # The Delta tables and the streaming checkpoints: a local folder or a URI that Spark (Hadoop) and delta-rs
    # both reach (hdfs://namenode:8020/eventlake/warehouse, s3a://bucket/warehouse, ...). Unset: home/warehouse
    # and home/checkpoints.
    warehouse_uri: str | None = None
    checkpoints_uri: str | None = None
    # What delta-rs needs besides a URI (credentials, endpoint, region ...): a JSON object in
    # EVENTLAKE_STORAGE_OPTIONS, or a table in the config file. Spark takes the same from its Hadoop settings.
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False)
    # Where resolved artifacts (Kafka jars, Spark's Ivy cache) live; safe to delete.
    cache_dir: Path = PROJECT_ROOT / ".cache"
    # None = start and use the project's local broker. Set it to use a remote cluster (nothing is started).
    kafka_bootstrap_servers: str | None = None
    kafka_port: int = 19092
    kafka_controller_port: int = 19093
    # How many brokers `eventlake kafka up` starts (KRaft, each also a controller). Broker i (0, 1, ...) listens
    # on kafka_port + 2i and its controller on kafka_controller_port + 2i.
    kafka_brokers: int = 1
    # "none" (plaintext, no authentication), "sasl_scram" (SASL/SCRAM over plaintext) or "sasl_scram_tls" (SASL/SCRAM
    # over TLS); lakehouse.kafka_security configures each client library from the settings below.
    kafka_security: str = "none"
    kafka_sasl_mechanism: str = "SCRAM-SHA-512"
    # This process's principal. Unset: with sasl_scram, the user of the process's role in the credentials file
    # `eventlake kafka up --security sasl_scram` generated (``for_role``).
    kafka_username: str | None = None
    kafka_password: str | None = field(default=None, repr=False)
    # The generated credentials (TOML, mode 0600); default: <home>/kafka/credentials.toml.
    kafka_credentials_file: Path | None = None
    # With sasl_scram_tls: the PEM file of the certificate(s) that clients trust; default: ca.pem beside the
    # credentials file (what `eventlake kafka up --security sasl_scram_tls` generates).
    kafka_ssl_cafile: Path | None = None
    topic_prefix: str = "eventlake."
    topic_partitions: int = 3
    # 0 = as many replicas as the local cluster has brokers, up to 3; on a remote cluster, the cluster's own
    # default.replication.factor and min.insync.replicas.
    topic_replication_factor: int = 0
    handler_group_id: str = "eventlake-command-handler"
    # At most this many commands per handler transaction (one poll): bigger is faster, smaller commits sooner.
    handler_max_batch: int = 2000
    # The handler snapshots a partition's aggregate state after this many new events in it, or a quarter of the
    # events it holds if that is more (0 = never).
    snapshot_every_events: int = 10_000
    # Per account, the handler remembers the first result of this many most recent commands (idempotency).
    idempotency_window: int = 100
    # The handler's in-memory cache of decoded states, per owned partition, of its state store
    # (event_store.state_store: aggregate states, idempotency windows, log positions on disk under
    # <home>/handler-state), in MB.
    handler_state_cache_mb: int = 64
    # The fraud detector's (eventlake detect-fraud) cache of encoded account states, shared out over the topic's
    # partitions, in MB; the states themselves live on disk (LMDB under <home>/fraud-detector-state).
    fraud_state_cache_mb: int = 128
    # The Spark projection's sequence gate (spark_apps/sequence.py): "ledger" joins each batch with every event
    # ever admitted (its cost grows with the log); "heads" reads only the batch's aggregates' heads (flat in the
    # log's length, but more jobs per batch: slower while the ledger is small, bench/sequence_gate.py); "auto"
    # takes the ledger's gate until the projection's ledger holds sequence_heads_from_mb on disk, then the heads'
    # for good.
    sequence_gate: str = "auto"
    sequence_heads_from_mb: int = 1024  # ~11M events: where the heads' batch costs what the ledger's does
    # The handler rejects a command whose event time (occurred_at) lies more than this many seconds ahead of
    # its clock: one event dated far ahead would move every event-time watermark past all later events.
    max_event_time_ahead_s: int = 900
    policy_group_id: str = "eventlake-fraud-policy"
    # The consumer group of the fraud detector's instances (``eventlake detect-fraud``); "" means
    # "<topic prefix>fraud-detector".
    fraud_detector_group_id: str = ""
    spark_master: str = "local[2]"
    # The local Spark standalone cluster (`eventlake spark-cluster up`): its master listens on this port, its web UI
    # on the next, worker i's web UI on port + 1 + i.
    spark_cluster_port: int = 17077
    spark_cluster_workers: int = 2
    spark_cluster_worker_cores: int = 1
    spark_cluster_worker_memory: str = "2g"
    # The local YARN mini cluster with HDFS (`eventlake yarn up`): the NameNode's RPC port (fs.defaultFS), its web UI
    # on the next, then the ResourceManager's client, scheduler, resource-tracker, admin and web (REST) ports.
    yarn_port: int = 18020
    yarn_nodemanager_memory_mb: int = 8192
    yarn_nodemanager_vcores: int = 8
    spark_shuffle_partitions: int = 4
    spark_driver_memory: str = "2g"
    # A batch this big (~600 MB cached for 1M events) amortises the per-batch Delta commits: bench/projection.py
    max_offsets_per_trigger: int = 1_000_000
    trigger_interval: str = "5 seconds"
    # Delta auto compaction in every Spark writer of the warehouse: after a commit leaves a table with this many
    # small files (under 64 MB), Delta compacts them in the same batch (0 = off: only the maintenance DAG's
    # OPTIMIZE compacts). A streaming table of thousands of small commits stays fast to read (bench/sql.py).
    auto_compact_min_files: int = 10
    # How a rebuild folds the event archive: "duckdb" (in process, each model's fold_sql) or "spark".
    rebuild_engine: str = "duckdb"
    # "on": the command handler seals every personal field of the events it writes under its data subject's key
    # (<home>/subject-keys; issue 45, docs/forgetting.md) and refuses the commands of a forgotten subject; "off":
    # events carry personal values in clear. Readers unseal tokens whatever it says (both engines).
    personal_data_seal: str = "off"
    # "on": every key store follows the compacted keys topic (<prefix>subject-keys; event_store/keys_topic.py), the
    # truth about the subjects' keys and tombstones, so a process on another machine (a cluster's driver, a handler
    # that takes a partition) unseals and refuses as this one does; "off": the home's files alone (one machine).
    subject_keys_topic: str = "on"
    # How often a key store reads the keys topic for what other processes wrote (seconds): a subject forgotten
    # elsewhere is refused and reads as null within this. An unknown subject reads it at once.
    keys_topic_follow_s: float = 1.0
    # The keys topic's max.compaction.lag.ms: how long a forgotten subject's key may stay in the broker's log
    # segments after its tombstone (compaction then drops it).
    keys_topic_compaction_lag_ms: int = 3_600_000
    sql_server_host: str = "127.0.0.1"
    sql_server_port: int = 10000
    # How `eventlake sql-server` checks a login: "password" (the users file below, managed with `eventlake
    # sql-server users`), "ldap" (Hive's LDAP provider: sql_server_ldap_url, sql_server_ldap_base_dn) or "none"
    # (any user name, no password: only for a server no one else can reach).
    sql_server_auth: str = "password"
    # The users file (hashed passwords and per-user table grants; mode 0600); default: <home>/sql-server/users.
    sql_server_users_file: Path | None = None
    sql_server_ldap_url: str | None = None
    sql_server_ldap_base_dn: str | None = None
    # "on": the Thrift port speaks TLS only, with the certificate of the Kafka TLS mode (trusted through
    # ``ssl_cafile``) unless sql_server_keystore (PKCS12 or JKS) and its password name another.
    sql_server_tls: str = "off"
    sql_server_keystore: Path | None = None
    sql_server_keystore_password: str | None = field(default=None, repr=False)
    # Every long-running service (handler, projection) serves Prometheus metrics at http://metrics_host:port/metrics
    # (lakehouse/metrics.py): "on" or "off". metrics_port 0 takes a free port; each service then registers its
    # address under <home>/metrics/ (Prometheus' file_sd format), where `eventlake metrics` and Prometheus find
    # it. A fixed port suits one service per host or container (Kubernetes).
    metrics: str = "on"
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    # Spark's own metrics (its PrometheusServlet: the driver's and executors' memory, GC, streaming queries) at
    # http://<driver>:spark_ui_port/metrics/prometheus, with Spark's UI, in every Spark session of eventlake:
    # "on" or "off". Registered under <home>/metrics beside the services' (Prometheus' file_sd finds them).
    # spark_ui_port 0 takes a free port.
    spark_metrics: str = "off"
    spark_ui_port: int = 4040
    # Where Airflow's tasks push their outcome (checks, rebuilds, reprocessing, maintenance) for Prometheus: a
    # Pushgateway's URL (http://host:9091); empty: nothing is pushed.
    pushgateway_url: str = ""
    # OpenLineage run events of eventlake's jobs (lakehouse/lineage.py; issue 46): "on" or "off". lineage_url: an
    # OpenLineage backend's endpoint (Marquez: http://host:5000); empty: the file transport, one JSON event per
    # line appended to <home>/lineage/events.jsonl. lineage_namespace: the jobs' namespace.
    lineage: str = "on"
    lineage_url: str = ""
    lineage_namespace: str = "eventlake"
    # The run every run of this process is a child of, as OpenLineage writes a parent id: "<namespace>/<job>/<run
    # id>" (an Airflow task's run, given by its OpenLineage provider; empty: none). Set by the DAGs' tasks.
    lineage_parent: str = ""
    # OpenLineage's Spark listener (io.openlineage:openlineage-spark) in the Spark sessions of batch jobs (rebuild,
    # reprocess, maintenance, backfill): their Spark runs, each query's datasets, children of lineage_parent.
    # "jobs", "all" (the streaming apps too: the projection and the detectors, where every micro-batch is tens of
    # Spark queries, each a START and a COMPLETE event: for a backend at lineage_url rather than a file) or "off";
    # its events go to lineage_url or to <home>/lineage/spark-<app>.jsonl.
    spark_lineage: str = "jobs"
    # The largest reference-data file (merchants) a load reads, in bytes (reference_data; issue 46).
    reference_max_bytes: int = 256 * 1024 * 1024
    # Free-form extras, e.g. {"projection_id": "..."} from tests; not read from the environment.
    extra: Mapping[str, str] = field(default_factory=dict)

    # -- derived locations -------------------------------------------------------------------
    @property
    def warehouse(self) -> Location:
        """The Delta tables' root: a local ``Path`` or a ``RemoteLocation`` (``lakehouse.storage``)."""
        return location(self.warehouse_uri, self.storage_options) if self.warehouse_uri else self.home / "warehouse"

    @property
    def checkpoints(self) -> Location:
        return (location(self.checkpoints_uri, self.storage_options) if self.checkpoints_uri
                else self.home / "checkpoints")

    @property
    def kafka_dir(self) -> Path:
        return self.home / "kafka"

    @property
    def data_docs(self) -> Path:
        """The Data Docs site of the checks (expectations.checks) and the dead-letter triage's reports."""
        return self.home / "data_docs"

    @property
    def check_results(self) -> Path:
        """Great Expectations' stores (validation results, suites) the Data Docs are built from."""
        return self.home / "gx"

    @property
    def credentials_file(self) -> Path:
        return self.kafka_credentials_file or self.kafka_dir / "credentials.toml"

    @property
    def ssl_cafile(self) -> Path:
        return self.kafka_ssl_cafile or self.credentials_file.parent / "ca.pem"

    @property
    def uses_local_kafka(self) -> bool:
        return self.kafka_bootstrap_servers is None

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka_bootstrap_servers or ",".join(f"127.0.0.1:{port}" for port in self.local_broker_ports)

    @property
    def local_broker_ports(self) -> list[int]:
        """The client port of each local broker (see ``kafka_brokers``)."""
        return [self.kafka_port + 2 * i for i in range(self.kafka_brokers)]

    @property
    def local_controller_ports(self) -> list[int]:
        return [self.kafka_controller_port + 2 * i for i in range(self.kafka_brokers)]

    @property
    def replication_factor(self) -> int | None:
        """The replicas of each topic eventlake creates (``topic_replication_factor``); None = the remote
        cluster's default."""
        if self.topic_replication_factor > 0:
            return self.topic_replication_factor
        return min(3, self.kafka_brokers) if self.uses_local_kafka else None

    @property
    def min_insync_replicas(self) -> int | None:
        """A write is acknowledged once this many replicas have it: 2 of 3 (one broker may be lost), 1 of 1 or
        2; None = the remote cluster's default."""
        rf = self.replication_factor
        return None if rf is None else max(1, min(2, rf - 1))

    def topic(self, name: str) -> str:
        """Full topic name for one of: commands, events, command-results, dead-letters, handler-snapshots,
        subject-keys."""
        return f"{self.topic_prefix}{name}"

    @property
    def commands_topic(self) -> str:
        return self.topic("commands")

    @property
    def fraud_detector_group(self) -> str:
        return self.fraud_detector_group_id or f"{self.topic_prefix}fraud-detector"

    @property
    def dead_letters_watch_group(self) -> str:
        """The consumer group of Airflow's watcher of the dead-letters topic (``triage_dead_letters``)."""
        return f"{self.topic_prefix}airflow-dead-letters-watch"

    @property
    def events_topic(self) -> str:
        return self.topic("events")

    @property
    def results_topic(self) -> str:
        return self.topic("command-results")

    @property
    def dead_letters_topic(self) -> str:
        return self.topic("dead-letters")

    @property
    def snapshots_topic(self) -> str:
        return self.topic("handler-snapshots")

    @property
    def keys_topic(self) -> str:
        """The subjects' data keys and tombstones (compacted, one partition: event_store.keys_topic)."""
        return self.topic("subject-keys")

    def table_path(self, name: str) -> Location:
        """A table that is no read model's: the archive, the dead letters, the catalog, sequence ledgers. A read
        model's tables are those of its current generation: ``read_models.catalog.Catalog(settings).current(name)``."""
        return self.warehouse / name

    def replace(self, **changes) -> "Settings":
        return dataclasses.replace(self, **changes)

    def for_role(self, role: str) -> "Settings":
        """These settings as the Kafka principal of ``role`` (admin, handler, reader, client) sees them: with
        ``kafka_security`` on and no ``kafka_username`` set, the role's user and password from the credentials
        file (``credentials_file``); otherwise unchanged. An explicit username always wins: a deployment gives
        each process its own credentials in its environment."""
        if self.kafka_security == "none" or self.kafka_username is not None:
            return self
        from lakehouse.kafka_credentials import role_credentials

        found = role_credentials(self, role)
        if found is None:
            return self
        return self.replace(kafka_username=found[0], kafka_password=found[1])

    # -- loading ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, role: str | None = None) -> "Settings":
        """Settings from ``EVENTLAKE_*`` / ``KAFKA_BOOTSTRAP_SERVERS`` variables and the optional
        TOML file named by ``EVENTLAKE_CONFIG`` (keys are the field names, e.g. ``topic_partitions``); with
        ``role``, as that Kafka principal (``for_role``)."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        config_file = env.get("EVENTLAKE_CONFIG")
        if config_file:
            path = Path(config_file)
            try:
                values.update(tomllib.loads(path.read_text()))
            except FileNotFoundError:
                raise SettingsError(f"EVENTLAKE_CONFIG={config_file}: no such file") from None
            except tomllib.TOMLDecodeError as e:
                raise SettingsError(f"EVENTLAKE_CONFIG={config_file}: not valid TOML ({e})") from None
        known = {f.name: f for f in dataclasses.fields(cls) if f.name != "extra"}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise SettingsError(f"EVENTLAKE_CONFIG={config_file}: unknown setting(s) {', '.join(unknown)}; "
                                f"known: {', '.join(sorted(known))}")
        for name in known:
            var = "KAFKA_BOOTSTRAP_SERVERS" if name == "kafka_bootstrap_servers" else f"EVENTLAKE_{name.upper()}"
            if env.get(var):
                values[name] = env[var]
        settings = cls(**{name: _coerce(name, known[name].type, value) for name, value in values.items()})
        if "kafka_brokers" not in values:  # the size `eventlake kafka up --brokers N` gave the local cluster
            recorded = settings.kafka_dir / "brokers"
            if recorded.exists():
                settings = settings.replace(kafka_brokers=_coerce("kafka_brokers", "int", recorded.read_text().strip()))
        if "kafka_security" not in values and settings.uses_local_kafka:
            # What `eventlake kafka up --security MODE` gave the local cluster (a remote one says its own).
            recorded = settings.kafka_dir / "security"
            if recorded.exists():
                # The credentials belong to the cluster, not to a home: a later replace(home=...) keeps them.
                settings = settings.replace(kafka_security=recorded.read_text().strip(),
                                            kafka_credentials_file=settings.credentials_file)
        settings.check_security()
        return settings if role is None else settings.for_role(role)

    def check_security(self) -> None:
        """Raise SettingsError for a security mode or SASL mechanism eventlake does not know, or a username
        without a password (and the other way round)."""
        if self.kafka_security not in SECURITY_MODES:
            raise SettingsError(f"setting kafka_security={self.kafka_security!r}: expected one of "
                                f"{', '.join(SECURITY_MODES)}")
        if self.kafka_sasl_mechanism not in SASL_MECHANISMS:
            raise SettingsError(f"setting kafka_sasl_mechanism={self.kafka_sasl_mechanism!r}: expected one of "
                                f"{', '.join(SASL_MECHANISMS)}")
        if (self.kafka_username is None) != (self.kafka_password is None):
            given, missing = (("kafka_username", "kafka_password") if self.kafka_password is None
                              else ("kafka_password", "kafka_username"))
            raise SettingsError(f"{given} is set but {missing} is not (EVENTLAKE_{missing.upper()}): give both")


def _coerce(name: str, type_name: object, value: object) -> object:
    type_text = str(type_name)
    if "Mapping" in type_text:
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except json.JSONDecodeError as e:
                raise SettingsError(f"setting {name}: not a JSON object ({e})") from None
        if not isinstance(value, Mapping) or not all(isinstance(v, (str, int, float, bool)) for v in value.values()):
            raise SettingsError(f"setting {name}={value!r}: expected an object of names to strings")
        return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
    if "Path" in type_text and value is not None and is_remote(str(value)):
        # A URI taken as a local folder named "hdfs:" would hide where the data went.
        hint = ("; the tables and checkpoints take a URI: EVENTLAKE_WAREHOUSE_URI, EVENTLAKE_CHECKPOINTS_URI"
                if name == "home" else "")
        raise SettingsError(f"setting {name}={value!r}: a local folder is needed here, not a URI{hint}")
    try:
        if value is None:
            return None
        if "Path" in type_text:
            return Path(str(value)).expanduser().resolve()
        if type_text == "int":
            return int(value)  # type: ignore[arg-type]
        return str(value) if value is not None else None
    except (TypeError, ValueError):
        raise SettingsError(f"setting {name}={value!r}: expected {type_text}") from None
