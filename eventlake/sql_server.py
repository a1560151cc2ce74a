"""``eventlake sql-server start|stop|status|serve``: Spark's Thrift (HiveServer2: JDBC/ODBC) server over the read
models, read-only, on loopback by default.

``serve`` is the service itself (``start`` runs it in the background and waits until it accepts connections): one
Spark session with Delta, in which every logical table of ``eventlake query`` (the read models, ``late_events``,
``event_archive``, ``event_dead_letters``) is a temporary view resolved through the catalog to its current
generation. The Thrift server (``HiveThriftServer2.startWithContext``) shares that one session with every JDBC
connection (``spark.sql.hive.thriftServer.singleSession``), so the views are visible by name to every client.
Once a second the service reads the catalog (delta-rs, no Spark job); when a rebuild's switch or a rollback
changed what a name resolves to, or a table appeared, it re-points the views: no restart, and a client's next
query reads the new generation. New commits to a table are visible to the next query anyway (Delta reads the
newest snapshot of a view's table at each query).

**Read-only.** A check rule (``infra/sql_guard``: ``eventlake.sql.ReadOnlyExtension``, compiled here with the
JDK's ``javac`` against pyspark's jars on first use, cached under ``.cache/sql-guard``) runs on every analyzed plan
before anything executes: a plan holding a command (INSERT, UPDATE, DELETE, MERGE, CREATE, DROP, ALTER, OPTIMIZE,
VACUUM, SET key=value, CACHE ...) is refused unless it only describes (EXPLAIN, DESCRIBE, SHOW, USE), and a table
named by path (``delta.`/path```) is refused. Only the service's own thread, registering the views, is trusted.

**Logins** (``Settings.sql_server_auth``): "password" (the default) is Hive's CUSTOM authentication with
``eventlake.sql.PasswordFileAuthenticator`` over the users file of ``eventlake.sql_users`` (salted PBKDF2 hashes;
on a fresh machine ``start`` makes the user ``eventlake`` with a generated password and prints it once); "ldap"
is Hive's own LDAP provider (``sql_server_ldap_url``, ``sql_server_ldap_base_dn``); "none" accepts any name and
is allowed on a loopback host only. A refused login is logged with the user name, and every statement with its
user (``eventlake.sql.QueryLog``), in the server's log. A user granted some tables only is refused any other
(``eventlake.sql.GrantsExtension``). The settings reach Hive as system properties of the server's JVM, not Spark
settings, so `SET` cannot show the keystore's password.

**TLS** (``sql_server_tls = "on"``): the Thrift port speaks TLS only, with the certificate of the Kafka TLS mode
(``infra.kafka.tls_material``; one ``ca.pem`` trusts both) or ``sql_server_keystore``; ``jdbc_url`` says the URL a
JDBC client uses, with a PKCS12 trust store made from that ``ca.pem``.
"""
from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from eventlake.processes import read_pid, terminate
from eventlake.sql_guard import GUARD_CLASS, GUARD_SOURCES, GuardBuildError, guard_jar
from lakehouse.settings import PROJECT_ROOT, Settings
from lakehouse.errors import Unavailable

__all__ = ["SqlServerError", "SqlServerStatus", "guard_jar", "serve", "start", "stop", "status", "jdbc_url",
           "tls_enabled", "trust_store", "figures"]

GUARD_SOURCE = GUARD_SOURCES / "ReadOnlyExtension.java"
GRANTS_CLASS = "eventlake.sql.GrantsExtension"
AUTHENTICATOR_CLASS = "eventlake.sql.PasswordFileAuthenticator"
AUTH_MODES = {"password": "CUSTOM", "ldap": "LDAP", "none": "NONE"}
THRIFT_SERVER = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"


class SqlServerError(Unavailable, RuntimeError):
    """The SQL server could not be built, started or stopped; the message says why (and where its log is)."""


@dataclass(frozen=True)
class SqlServerStatus:
    running: bool
    pid: int | None
    url: str
    log_file: Path
    views: tuple[str, ...] = ()
    audit_log: Path | None = None

    def describe(self) -> str:
        state = f"running (pid {self.pid})" if self.running else "stopped"
        views = f"\n  tables: {', '.join(self.views)}" if self.running and self.views else ""
        audit = f"\n  audit log (logins, statements by user): {self.audit_log}" if self.audit_log else ""
        return f"sql-server: {state} at {self.url}{views}\n  log: {self.log_file}{audit}"


def jdbc_url(settings: Settings) -> str:
    """The URL a JDBC client (a BI tool, beeline) connects with; with TLS on, the trust store it needs."""
    url = f"jdbc:hive2://{settings.sql_server_host}:{settings.sql_server_port}/default"
    if tls_enabled(settings):
        store, password_file = _trust_store_paths(settings)
        password = password_file.read_text().strip() if password_file.exists() else "(made by `sql-server start`)"
        url += f";ssl=true;sslTrustStore={store};trustStorePassword={password}"
    return url


def tls_enabled(settings: Settings) -> bool:
    value = settings.sql_server_tls.strip().lower()
    if value in ("on", "true", "1", "yes"):
        return True
    if value in ("off", "false", "0", "no", ""):
        return False
    raise SqlServerError(f"setting sql_server_tls={settings.sql_server_tls!r}: expected on or off")


def _check_auth(settings: Settings) -> str:
    """The Hive authentication mode of ``sql_server_auth``, refusing what would open the door to anyone."""
    if settings.sql_server_auth not in AUTH_MODES:
        raise SqlServerError(f"setting sql_server_auth={settings.sql_server_auth!r}: expected one of "
                             f"{', '.join(AUTH_MODES)}")
    if settings.sql_server_auth == "ldap" and not settings.sql_server_ldap_url:
        raise SqlServerError("sql_server_auth=ldap needs sql_server_ldap_url (EVENTLAKE_SQL_SERVER_LDAP_URL, e.g. "
                             "ldaps://ldap.example.com:636) and usually sql_server_ldap_base_dn")
    if settings.sql_server_auth == "none" and not _loopback(settings.sql_server_host):
        raise SqlServerError(f"sql_server_auth=none accepts any user without a password: it is refused on "
                             f"{settings.sql_server_host}, which is not a loopback address; use password or ldap")
    return AUTH_MODES[settings.sql_server_auth]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _keystore(settings: Settings) -> tuple[Path, str]:
    """The Thrift port's key and certificate: ``sql_server_keystore``, or the Kafka TLS mode's (made once)."""
    if settings.sql_server_keystore is not None:
        if settings.sql_server_keystore_password is None:
            raise SqlServerError("sql_server_keystore is set but sql_server_keystore_password is not "
                                 "(EVENTLAKE_SQL_SERVER_KEYSTORE_PASSWORD): give both")
        return settings.sql_server_keystore, settings.sql_server_keystore_password
    from infra.kafka import KafkaError, tls_material

    try:
        return tls_material(settings)
    except KafkaError as e:
        raise SqlServerError(f"the TLS certificate could not be made: {e}") from None


def _trust_store_paths(settings: Settings) -> tuple[Path, Path]:
    d = _paths(settings)["dir"]
    return d / "truststore.p12", d / "truststore-password"


def trust_store(settings: Settings) -> tuple[Path, str]:
    """A PKCS12 trust store holding ``Settings.ssl_cafile`` (what JDBC's ``sslTrustStore`` takes; Python and ODBC
    clients take the PEM file itself), made with keytool when missing or older than the PEM file; and its
    password (it guards the store's integrity, not a secret: the store holds only a public certificate)."""
    store, password_file = _trust_store_paths(settings)
    cafile = settings.ssl_cafile
    if store.exists() and password_file.exists() and store.stat().st_mtime >= cafile.stat().st_mtime:
        return store, password_file.read_text().strip()
    keytool = shutil.which("keytool")
    if keytool is None:
        raise SqlServerError("keytool (from the JDK) is not on PATH; it makes the JDBC trust store")
    store.parent.mkdir(parents=True, exist_ok=True)
    store.unlink(missing_ok=True)
    password = secrets.token_urlsafe(12)
    proc = subprocess.run([keytool, "-importcert", "-noprompt", "-alias", "eventlake-ca", "-file", str(cafile),
                           "-storetype", "PKCS12", "-keystore", str(store), "-storepass", password],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SqlServerError(f"keytool -importcert {cafile} failed: {proc.stdout}{proc.stderr}")
    password_file.write_text(password)
    return store, password


def _hive_properties(settings: Settings) -> dict[str, str]:
    """What the Thrift server's Hive configuration needs for logins and TLS, as JVM system properties (Hive reads
    them into every HiveConf, including the one its login providers make for themselves)."""
    from eventlake.sql_users import users_file

    props = {"hive.server2.authentication": _check_auth(settings),
             "eventlake.sql.audit.log": str(_paths(settings)["audit"])}
    if settings.sql_server_auth != "none":
        props["eventlake.sql.users.file"] = str(users_file(settings))
    if settings.sql_server_auth == "password":
        props["hive.server2.custom.authentication.class"] = AUTHENTICATOR_CLASS
    if settings.sql_server_auth == "ldap":
        props["hive.server2.authentication.ldap.url"] = settings.sql_server_ldap_url or ""
        if settings.sql_server_ldap_base_dn:
            props["hive.server2.authentication.ldap.baseDN"] = settings.sql_server_ldap_base_dn
    if tls_enabled(settings):
        keystore, password = _keystore(settings)
        props.update({"hive.server2.use.SSL": "true", "hive.server2.keystore.path": str(keystore),
                      "hive.server2.keystore.password": password})
    return props


def _paths(settings: Settings) -> dict[str, Path]:
    d = settings.home / "sql-server"
    return {"dir": d, "pid": d / "server.pid", "state": d / "state.json", "log": d / "server.log",
            "audit": d / "audit.log"}


def _guard(settings: Settings, log) -> Path:
    try:
        return guard_jar(settings, log)
    except GuardBuildError as e:
        raise SqlServerError(str(e)) from None


# -- the service ----------------------------------------------------------------------------------------------------

def serve(settings: Settings, log=print, stop_event=None) -> None:
    """Run the SQL server in this process until SIGTERM (or ``stop_event``)."""
    from lakehouse.signals import stop_requested_on_sigterm
    from spark_apps.session import JVM_OPTIONS, build_session

    stop_event = stop_event or stop_requested_on_sigterm()
    p = _paths(settings)
    p["dir"].mkdir(parents=True, exist_ok=True)
    _show_generated_password(settings, log)
    hive_properties = _hive_properties(settings)
    jar = _guard(settings, log)
    # Delta's classes on the driver's own class path: the Thrift server runs each statement with a class loader
    # that does not see jars added at run time (spark.jars.packages), and Spark's closure cleaner then cannot
    # read Delta's classes (a NullPointerException deep in a query).
    delta_jars = sorted((settings.cache_dir / "ivy" / "jars").glob("io.delta_*.jar"))
    if not delta_jars:
        raise SqlServerError(f"Delta's jars are not under {settings.cache_dir / 'ivy' / 'jars'} yet; run `make setup`")
    spark = build_session(settings, app_name="eventlake-sql-server", log=log, extra_conf={
        "spark.jars": str(jar), "spark.sql.extensions": f"{GUARD_CLASS},{GRANTS_CLASS}",
        "spark.driver.extraClassPath": os.pathsep.join(str(j) for j in [*delta_jars, jar]),
        # Each JDBC session opens Hive's session state on an in-memory Derby metastore: with a Derby system home
        # set (as other eventlake sessions do, to keep derby.log out of the working folder) its creation fails and
        # is retried for seconds on every connection.
        "spark.driver.extraJavaOptions": f"{JVM_OPTIONS} -Dderby.stream.error.file={p['dir'] / 'derby.log'}",
        "spark.sql.hive.thriftServer.singleSession": "true",
        "hive.server2.thrift.port": str(settings.sql_server_port),
        "hive.server2.thrift.bind.host": settings.sql_server_host,
        "spark.sql.warehouse.dir": str(p["dir"] / "spark-warehouse")})
    if spark.conf.get("spark.sql.extensions", "").find(GUARD_CLASS) < 0:
        raise SqlServerError("this process already had a Spark session without the read-only guard; run "
                             "`eventlake sql-server serve` in a process of its own")
    jvm = spark._jvm
    for key, value in hive_properties.items():
        jvm.java.lang.System.setProperty(key, value)
    spark.sparkContext._jsc.sc().addSparkListener(jvm.eventlake.sql.QueryLog())
    views = _Views(spark, settings, log)
    views.refresh()
    server = jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2.startWithContext(
        spark._jsparkSession.sqlContext())
    _write_state(p, views.names)
    log(f"sql-server: serving {jdbc_url(settings)} (read-only; logins: {settings.sql_server_auth}; TLS: "
        f"{'on' if tls_enabled(settings) else 'off'}): {', '.join(views.names) or 'no table yet'}")
    from lakehouse import metrics

    counts = jvm.eventlake.sql.ServerCounts
    metrics_server = metrics.serve(settings, "sql-server", lambda: figures(list(counts.counts())), log)
    try:
        while not stop_event.wait(1.0):
            if views.refresh():
                _write_state(p, views.names)
    finally:
        log("sql-server: stopping")
        if metrics_server is not None:
            metrics_server.close()
        try:
            server.stop()
        finally:
            p["state"].unlink(missing_ok=True)
            spark.stop()


def figures(counts: list[int]):
    """The SQL server's Prometheus figures (``lakehouse.metrics``) from ``eventlake.sql.ServerCounts.counts()``:
    [statements, refused by eventlake's guards, failed otherwise, logins accepted, logins refused]."""
    from lakehouse.metrics import Sample

    queries, refused, failed, accepted, logins_refused = counts
    c = "counter"
    return [Sample("sql_server_queries", c, "Statements received", queries),
            Sample("sql_server_query_errors", c, "Statements that ended in an error, by cause (refused: by the "
                   "read-only guard or the grants)", refused, {"cause": "refused"}),
            Sample("sql_server_query_errors", c, "Statements that ended in an error, by cause (refused: by the "
                   "read-only guard or the grants)", failed, {"cause": "error"}),
            Sample("sql_server_logins", c, "Logins, by outcome", accepted, {"outcome": "accepted"}),
            Sample("sql_server_logins", c, "Logins, by outcome", logins_refused, {"outcome": "refused"})]


class _Views:
    """The logical tables as temporary views of the shared session, re-pointed when the catalog changes."""

    def __init__(self, spark, settings: Settings, log):
        self.spark, self.settings, self.log = spark, settings, log
        self.resolved: dict[str, tuple] = {}
        self.guard = spark._jvm.eventlake.sql.ReadOnlyExtension

    @property
    def names(self) -> list[str]:
        return list(self.resolved)

    def refresh(self) -> bool:
        """Re-register what changed -> whether anything did."""
        from eventlake.query import logical_tables, spark_frame

        tables = logical_tables(self.settings)
        wanted = {name: tuple((str(p.path), p.read_models) for p in parts) for name, parts in tables.items()}
        if wanted == self.resolved:
            return False
        self.guard.trustThisThread(True)
        try:
            for name, parts in tables.items():
                if self.resolved.get(name) != wanted[name]:
                    spark_frame(self.spark, parts).createOrReplaceTempView(name)
                    if name in self.resolved:
                        self.log(f"sql-server: {name} now reads {', '.join(str(p.path) for p in parts)}")
            for name in set(self.resolved) - set(wanted):
                self.spark.catalog.dropTempView(name)
        finally:
            self.guard.trustThisThread(False)
        self.resolved = wanted
        return True


def _show_generated_password(settings: Settings, log) -> None:
    """On a fresh machine: the default user and its generated password, shown this once (as `airflow
    standalone` does); it is stored only hashed."""
    from eventlake.sql_users import DEFAULT_USER, ensure_default_user, users_file

    password = ensure_default_user(settings)
    if password is not None:
        log(f"sql-server: logins need a password; created the user {DEFAULT_USER} with the password {password}\n"
            f"  (shown this once, stored hashed in {users_file(settings)}; `eventlake sql-server users add NAME` "
            f"adds users or changes a password)")


def _write_state(p: dict[str, Path], names: list[str]) -> None:
    tmp = p["state"].with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "views": names}))
    tmp.replace(p["state"])


# -- start / stop / status ------------------------------------------------------------------------------------------

def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def status(settings: Settings) -> SqlServerStatus:
    p = _paths(settings)
    pid = read_pid(p["pid"])
    views: tuple[str, ...] = ()
    if pid is not None:
        try:
            views = tuple(json.loads(p["state"].read_text())["views"])
        except (OSError, ValueError, KeyError):
            views = ()
    return SqlServerStatus(pid is not None and p["state"].exists(), pid, jdbc_url(settings), p["log"], views,
                           p["audit"])


def start(settings: Settings, log=print, timeout: float = 240.0) -> SqlServerStatus:
    """Start ``serve`` in the background and wait until it accepts JDBC connections (idempotent)."""
    p = _paths(settings)
    current = status(settings)
    if current.running:
        log(current.describe())
        return current
    if current.pid is not None:
        raise SqlServerError(f"a SQL server (pid {current.pid}) is starting or stuck; see {p['log']}, or run "
                             f"`eventlake sql-server stop` first")
    if _accepts(settings.sql_server_host, settings.sql_server_port):
        raise SqlServerError(f"port {settings.sql_server_port} on {settings.sql_server_host} is taken by another "
                             f"process; choose another with EVENTLAKE_SQL_SERVER_PORT")
    _guard(settings, log)  # a compile error is said here, not in the log
    p["dir"].mkdir(parents=True, exist_ok=True)
    _show_generated_password(settings, log)
    _hive_properties(settings)  # a bad setting, or a certificate that cannot be made, is said here too
    if tls_enabled(settings):
        trust_store(settings)
    p["state"].unlink(missing_ok=True)
    # The service reads its settings from the environment: these are the caller's (whatever their source).
    env = {**os.environ, **{f"EVENTLAKE_{name.upper()}": str(getattr(settings, name)) for name in (
        "home", "cache_dir", "sql_server_host", "sql_server_port", "spark_master", "spark_driver_memory",
        "spark_shuffle_partitions", "sql_server_auth", "sql_server_users_file", "sql_server_ldap_url",
        "sql_server_ldap_base_dn", "sql_server_tls", "sql_server_keystore", "sql_server_keystore_password",
        "kafka_credentials_file", "kafka_ssl_cafile", "metrics", "metrics_host", "metrics_port", "spark_metrics",
        "spark_ui_port") if getattr(settings, name) is not None}}
    with open(p["log"], "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "eventlake.cli", "sql-server", "serve"], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=str(PROJECT_ROOT),
                                start_new_session=True)
    p["pid"].write_text(str(proc.pid))
    log(f"sql-server: starting (pid {proc.pid}; log {p['log']}) ...")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            p["pid"].unlink(missing_ok=True)
            raise SqlServerError(f"the SQL server exited with code {proc.returncode} while starting; the end of "
                                 f"{p['log']}:\n{_tail(p['log'])}")
        if p["state"].exists() and _accepts(settings.sql_server_host, settings.sql_server_port):
            started = status(settings)
            log(started.describe())
            return started
        time.sleep(0.5)
    raise SqlServerError(f"the SQL server did not accept connections within {timeout:.0f}s (pid {proc.pid} still "
                         f"running); the end of {p['log']}:\n{_tail(p['log'])}")


def stop(settings: Settings, log=print, timeout: float = 60.0) -> None:
    p = _paths(settings)
    pid = read_pid(p["pid"])
    if pid is None:
        log("sql-server: not running")
        p["pid"].unlink(missing_ok=True)
        return
    if terminate(pid, timeout, group=True):
        log(f"sql-server: pid {pid} did not stop within {timeout:.0f}s of SIGTERM; killed")
    p["pid"].unlink(missing_ok=True)
    p["state"].unlink(missing_ok=True)
    log(f"sql-server: stopped pid {pid}")


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"
