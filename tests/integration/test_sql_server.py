"""`eventlake sql-server`: Spark's Thrift server, reached with a real HiveServer2 client (PyHive over Thrift with
SASL PLAIN, as BI tools and beeline connect), gives the rows the embedded path gives; refuses every write and every
table named by path, leaving the warehouse as it was; follows a generation switch without a restart; and
`start`/`status`/`stop` behave as a service's should.

Who may connect: a login needs a user of the password file and their password (a fresh machine gets one user with
a generated password, printed once by `start`); a refused login is in the audit log with the user name, and every
statement with its user; a user granted some tables is refused the others; with TLS on, only TLS is spoken, with
the certificate of the Kafka TLS mode. One server with logins serves most tests; the TLS test starts its own,
before the shared one starts, so that two servers never run at once."""
import io
import ipaddress
import re
import socket
import ssl
import time

import pytest
from deltalake import DeltaTable, write_deltalake

from eventlake import cli, sql_server, sql_users
from eventlake.generator import GeneratorConfig
from eventlake.query import query_duckdb
from lakehouse.settings import Settings
import read_models
from read_models.catalog import Catalog
from tests.domain_helpers import events_for
from tests.integration.test_checks import write_folded
from tests.integration.test_query_read_only import payments_path, state

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PASSWORD = "analyst's password 1"


def fresh_settings(home) -> Settings:
    # The defaults of a fresh machine (logins by password, TLS off), in a home of its own.
    return Settings.load({}).replace(home=home, sql_server_port=free_port(), spark_shuffle_partitions=2)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # Spark's own metrics on (a free port for its UI): test_sparks_own_metrics_are_served_and_registered.
    settings = fresh_settings(tmp_path_factory.mktemp("sql-server-home")).replace(spark_metrics="on", spark_ui_port=0)
    write_folded(settings, events_for(GeneratorConfig(accounts=6, commands=80, seed=9, run_id="sqls")))
    said: list[str] = []
    sql_server.start(settings, log=said.append)
    sql_users.add_user(settings, "analyst", PASSWORD)
    try:
        yield settings.replace(extra={"start_output": "\n".join(said)})
    finally:
        sql_server.stop(settings, log=lambda *_: None)


def connect(settings: Settings, user: str = "analyst", password: str = PASSWORD):
    from pyhive import hive

    return hive.connect(host="127.0.0.1", port=settings.sql_server_port, username=user, auth="CUSTOM",
                        password=password)


def thrift_rows(settings: Settings, sql: str, user: str = "analyst", password: str = PASSWORD) -> list[tuple]:
    with connect(settings, user, password) as conn:
        cursor = conn.cursor()
        cursor.execute(sql)
        return [tuple(r) for r in cursor.fetchall()]


def audit_lines(settings: Settings, wanted: str) -> list[str]:
    """The audit log's lines holding ``wanted``, once there is one (statements are logged off Spark's listener
    bus, a moment after they start)."""
    audit = settings.home / "sql-server" / "audit.log"
    deadline = time.monotonic() + 30
    while True:
        lines = [line for line in (audit.read_text() if audit.exists() else "").splitlines() if wanted in line]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


def server_figures(settings: Settings) -> dict[tuple, float]:
    """The SQL server's metrics (it registers under its home as every service does): (name, labels) -> value."""
    from lakehouse import metrics

    [target] = [t for t in metrics.local_targets(settings) if t.service == "sql-server"]
    return {(n, tuple(sorted((k, v) for k, v in ls.items() if k != "service"))): v
            for n, ls, v in metrics.scrape(target.url) if n.startswith("eventlake_sql_server_")}


def figures_become(settings: Settings, wanted: dict[tuple, float]) -> dict[tuple, float]:
    """The server's figures once those of ``wanted`` hold its values (counted off Spark's listener bus, a moment
    after the statements end), or as they stand after 30 s."""
    deadline = time.monotonic() + 30
    while True:
        got = server_figures(settings)
        if all(got.get(k) == v for k, v in wanted.items()) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


QUERIES = ("eventlake_sql_server_queries_total", ())
REFUSED = ("eventlake_sql_server_query_errors_total", (("cause", "refused"),))
FAILED = ("eventlake_sql_server_query_errors_total", (("cause", "error"),))
LOGINS_REFUSED = ("eventlake_sql_server_logins_total", (("outcome", "refused"),))
LOGINS_ACCEPTED = ("eventlake_sql_server_logins_total", (("outcome", "accepted"),))


def tls_connect(settings: Settings, user: str, password: str, cafile):
    """A HiveServer2 connection over TLS (thrift's TSSLSocket under SASL PLAIN), trusting only ``cafile``."""
    import thrift_sasl
    from pyhive import hive
    from thrift.transport.TSSLSocket import TSSLSocket

    context = ssl.create_default_context(cafile=str(cafile))
    sock = TSSLSocket("127.0.0.1", settings.sql_server_port, ssl_context=context, server_hostname="127.0.0.1")
    transport = thrift_sasl.TSaslClientTransport(
        lambda: hive.get_installed_sasl(host="127.0.0.1", sasl_auth="PLAIN", username=user, password=password),
        "PLAIN", sock)
    return hive.connect(thrift_transport=transport, username=user)


def test_with_tls_on_the_thrift_port_speaks_only_tls_with_the_kafka_tls_certificate(tmp_path):
    from thrift.transport.TTransport import TTransportException

    settings = fresh_settings(tmp_path / "home").replace(sql_server_tls="on")
    sql_users.add_user(settings, "analyst", PASSWORD)
    said: list[str] = []
    sql_server.start(settings, log=said.append)
    try:
        # The JDBC URL to use is printed, with a trust store that holds the Kafka TLS mode's certificate.
        store, store_password = sql_server.trust_store(settings)
        url = (f"jdbc:hive2://127.0.0.1:{settings.sql_server_port}/default;ssl=true;sslTrustStore={store};"
               f"trustStorePassword={store_password}")
        assert url in "\n".join(said) and sql_server.jdbc_url(settings) == url
        assert settings.ssl_cafile == settings.home / "kafka" / "ca.pem"  # what `kafka up --security ..._tls` makes
        # A plain connection, even with the right password, is refused.
        with pytest.raises(TTransportException):
            connect(settings).close()
        # TLS, trusting only the Kafka TLS mode's ca.pem, with the right password: served.
        with tls_connect(settings, "analyst", PASSWORD, settings.ssl_cafile) as conn:
            cursor = conn.cursor()
            cursor.execute("SELECT current_user(), 40 + 2")
            assert cursor.fetchall() == [("analyst", 42)]
        # TLS with a wrong password: refused, and logged.
        with pytest.raises(TTransportException, match="Error validating the login"):
            tls_connect(settings, "analyst", "not the password", settings.ssl_cafile).close()
        assert audit_lines(settings, "login refused for user 'analyst': wrong password")
        # The certificate is that one: a client trusting only the system's CAs does not connect.
        with socket.create_connection(("127.0.0.1", settings.sql_server_port)) as raw:
            with pytest.raises(ssl.SSLCertVerificationError):
                ssl.create_default_context().wrap_socket(raw, server_hostname="127.0.0.1")
    finally:
        sql_server.stop(settings, log=lambda *_: None)


SAME_ROWS = [
    "SELECT account_id, status, available_minor, payments_authorized, version FROM account_summary ORDER BY account_id",
    "SELECT status, count(*) AS payments, sum(amount_minor) AS total FROM payments GROUP BY status ORDER BY status",
    "SELECT p.account_id, count(*) AS n FROM payments p JOIN account_summary a ON p.account_id = a.account_id "
    "WHERE a.status = 'open' GROUP BY p.account_id ORDER BY n DESC, p.account_id",
    "WITH big AS (SELECT * FROM payments WHERE amount_minor > 1000) SELECT count(*) FROM big",
    "SELECT rule, count(*) FROM fraud_alerts GROUP BY rule ORDER BY rule",
]


def test_the_thrift_server_gives_the_rows_the_embedded_path_gives(server):
    for sql in SAME_ROWS:
        expected = query_duckdb(server, sql)[1]
        assert thrift_rows(server, sql) == expected, sql
    assert sorted(r[1] for r in thrift_rows(server, "SHOW TABLES")) == sorted(read_models.REGISTRY)


def test_the_thrift_server_refuses_every_write_and_every_path_and_changes_nothing(server):
    from pyhive.exc import OperationalError

    before = state(server)
    counted = figures_become(server, {})
    path = payments_path(server)
    refused = {
        "INSERT INTO payments SELECT * FROM payments": "INSERT is refused",
        "DELETE FROM payments WHERE amount_minor > 0": "is refused",
        "UPDATE account_summary SET available_minor = 0": "is refused",
        "MERGE INTO payments t USING payments s ON t.payment_id = s.payment_id WHEN MATCHED THEN DELETE": "is refused",
        "DROP VIEW payments": "is refused",
        "CREATE TABLE copy USING delta AS SELECT * FROM payments": "CREATE TABLE is refused",
        "CREATE OR REPLACE TEMPORARY VIEW payments AS SELECT 1 AS x": "CREATE VIEW is refused",
        # Spark refuses this one itself, before the guard sees it.
        "ALTER TABLE payments ADD COLUMNS (x INT)": "expects a table but `payments` is a view",
        f"DELETE FROM delta.`{path}`": "never by path",
        # The table named by path is refused as it is parsed, before the check of the analyzed INSERT.
        f"INSERT INTO delta.`{path}` SELECT * FROM payments": "never by path",
        f"OPTIMIZE delta.`{path}`": "OPTIMIZE is refused",
        f"VACUUM delta.`{path}` RETAIN 0 HOURS": "VACUUM is refused",
        f"SELECT * FROM delta.`{path}`": "never by path",
        f"SELECT * FROM parquet.`{path}`": "never by path",
        f"WITH p AS (SELECT * FROM json.`{path}/_delta_log`) SELECT count(*) FROM p": "never by path",
        f"SELECT count(*) FROM payments WHERE payment_id IN (SELECT payment_id FROM parquet.`{path}`)": "never by path",
        "SET spark.sql.runSQLOnFiles = true": "SET is refused",
        "CACHE TABLE payments": "CACHE TABLE is refused",
    }
    for sql, reason in refused.items():
        with pytest.raises(OperationalError) as error:
            thrift_rows(server, sql)
        assert reason in str(error.value), (sql, str(error.value)[:500])
        assert "eventlake: read-only" in str(error.value) or sql.startswith("ALTER"), sql
    assert state(server) == before
    # Still serving reads afterwards.
    count = "SELECT count(*) FROM payments"
    assert thrift_rows(server, count) == query_duckdb(server, count)[1]
    # Its metrics: every refusal by eventlake's guard counted as refused, Spark's own refusal as an error.
    # Every statement received is counted: these, and the USE each PyHive connection sends first.
    wanted = {REFUSED: counted[REFUSED] + len(refused) - 1, FAILED: counted[FAILED] + 1,
              QUERIES: counted[QUERIES] + 2 * (len(refused) + 1)}
    got = figures_become(server, wanted)
    assert {k: got[k] for k in wanted} == wanted


def test_a_switch_to_another_generation_is_followed_without_a_restart(server):
    catalog = Catalog(server)
    rows = DeltaTable(payments_path(server)).to_pandas().sort_values("payment_id").head(4)
    g2 = catalog.create_next("payments", by="test", reason="a generation of 4 rows")
    write_deltalake(str(g2.table), rows, mode="overwrite")
    catalog.switch("payments", g2.number, expected_current=1, by="test", reason="checks passed")
    sql = "SELECT payment_id FROM payments ORDER BY payment_id"
    deadline = time.monotonic() + 60
    while thrift_rows(server, sql) != query_duckdb(server, sql)[1] and time.monotonic() < deadline:
        time.sleep(0.5)  # the server reads the catalog once a second
    assert thrift_rows(server, sql) == [(p,) for p in rows["payment_id"]] == query_duckdb(server, sql)[1]
    catalog.rollback("payments", by="test", reason="back")


def use_server_settings(server: Settings, monkeypatch) -> None:
    """The CLI, in this process, reads the settings of ``server`` from the environment."""
    for name, value in (("HOME", server.home), ("SQL_SERVER_PORT", server.sql_server_port)):
        monkeypatch.setenv(f"EVENTLAKE_{name}", str(value))
    monkeypatch.delenv("EVENTLAKE_CONFIG", raising=False)


def listening_addresses(port: int) -> set[str]:
    """The local addresses a TCP socket listens on at ``port`` (Linux's /proc/net/tcp and tcp6; an IPv4 address
    mapped into IPv6, as a JVM's sockets bind, as IPv4)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:
                continue
            raw = b"".join(bytes.fromhex(address[i:i + 8])[::-1] for i in range(0, len(address), 8))
            ip = ipaddress.ip_address(raw)
            found.add(str(getattr(ip, "ipv4_mapped", None) or ip))
    return found


def test_sparks_own_metrics_are_served_and_registered(server):
    """With spark_metrics on, the server's Spark session serves Spark's metrics system (PrometheusServlet) and
    registers it under the home beside the server's own figures: Prometheus' file_sd and `eventlake metrics` find
    both."""
    from lakehouse import metrics

    targets = {t.service: t for t in metrics.local_targets(server)}
    assert {"sql-server", "spark-eventlake-sql-server"} <= set(targets), targets
    spark = targets["spark-eventlake-sql-server"]
    assert spark.url.endswith("/metrics/prometheus")
    names = {name for name, _, _ in metrics.scrape(spark.url)}
    # The driver's memory and its block manager, named under the eventlake namespace (not each run's app id).
    assert any(n.startswith("metrics_eventlake_driver_") and "JVMHeapMemory" in n for n in names), sorted(names)[:40]
    assert any(n.startswith("metrics_eventlake_driver_BlockManager_") for n in names), sorted(names)[:40]


def test_status_start_and_stop_behave_as_a_service(server, monkeypatch, capsys):
    use_server_settings(server, monkeypatch)
    assert cli.main(["sql-server", "status"]) == 0
    out = capsys.readouterr().out
    assert "running" in out and f"jdbc:hive2://127.0.0.1:{server.sql_server_port}/default" in out
    assert "payments" in out and str(server.home / "sql-server" / "audit.log") in out
    assert cli.main(["sql-server", "start"]) == 0  # already running: says so, starts nothing
    out = capsys.readouterr().out
    assert "running" in out and "password" not in out  # the generated password was shown once, at the first start
    # Bound to loopback only, by default.
    assert listening_addresses(server.sql_server_port) == {"127.0.0.1"}
    # A second server on the same port from another home: refused with the reason.
    other = server.replace(home=server.home / "other")
    with pytest.raises(sql_server.SqlServerError, match="is taken by another process"):
        sql_server.start(other, log=lambda *_: None)


def test_a_fresh_machine_gets_one_user_whose_generated_password_start_prints_once(server):
    said = server.extra["start_output"]
    found = re.search(r"created the user eventlake with the password (\S+)", said)
    assert found, said
    password = found.group(1)
    assert thrift_rows(server, "SELECT current_user()", "eventlake", password) == [("eventlake",)]
    users = sql_users.users_file(server)
    assert password not in users.read_text() and users.stat().st_mode & 0o777 == 0o600  # stored hashed only


def test_a_login_needs_a_user_of_the_password_file_and_their_password(server):
    from pyhive import hive
    from thrift.transport.TTransport import TTransportException

    port = server.sql_server_port
    counted = figures_become(server, {})
    # No password (PyHive's default, SASL PLAIN with a placeholder), no SASL at all, a wrong password, a user not
    # in the file: each refused at login, before any statement.
    with pytest.raises(TTransportException, match="Error validating the login"):
        hive.connect(host="127.0.0.1", port=port, username="anonymous").close()
    with pytest.raises(TTransportException):
        hive.connect(host="127.0.0.1", port=port, username="analyst", auth="NOSASL").close()
    with pytest.raises(TTransportException, match="Error validating the login"):
        connect(server, "analyst", "not the password").close()
    with pytest.raises(TTransportException, match="Error validating the login"):
        connect(server, "intruder", PASSWORD).close()
    # Each refusal is in the audit log with the user name and the reason.
    assert audit_lines(server, "login refused for user 'anonymous': no such user")
    assert audit_lines(server, "login refused for user 'analyst': wrong password")
    assert audit_lines(server, "login refused for user 'intruder': no such user")
    # The right password: served, and each statement logged with its user.
    sql = "SELECT count(*) AS audited FROM payments WHERE amount_minor > 7"
    assert thrift_rows(server, sql) == query_duckdb(server, sql)[1]
    assert audit_lines(server, f"query by user 'analyst': '{sql}'")
    assert audit_lines(server, "login accepted for user 'analyst'")
    # The metrics count the three logins the password check refused (the one without SASL never reaches it).
    got = figures_become(server, {LOGINS_REFUSED: counted[LOGINS_REFUSED] + 3})
    assert got[LOGINS_REFUSED] == counted[LOGINS_REFUSED] + 3 and got[LOGINS_ACCEPTED] > counted[LOGINS_ACCEPTED]


def test_users_added_by_the_cli_log_in_and_read_only_the_tables_granted(server, monkeypatch, capsys):
    from pyhive.exc import OperationalError
    from thrift.transport.TTransport import TTransportException

    use_server_settings(server, monkeypatch)
    password = "carol's password"
    monkeypatch.setattr("sys.stdin", io.StringIO(password + "\n"))
    assert cli.main(["sql-server", "users", "add", "carol", "--tables", "account_summary", "--password-stdin"]) == 0
    said = capsys.readouterr()
    assert "carol added" in said.out and password not in said.out + said.err
    assert cli.main(["sql-server", "users", "list"]) == 0
    listing = capsys.readouterr().out
    assert "carol\taccount_summary" in listing and "analyst\tall tables" in listing
    # Served on her table (no restart: the server reads the file again when it changes) ...
    count = "SELECT count(*) FROM account_summary"
    assert thrift_rows(server, count, "carol", password) == query_duckdb(server, count)[1]
    # ... refused on any other, however it is reached, with the user and the table named.
    for sql in ("SELECT * FROM payments",
                "SELECT a.account_id FROM account_summary a JOIN payments p ON a.account_id = p.account_id",
                "SELECT count(*) FROM account_summary WHERE account_id IN (SELECT account_id FROM payments)",
                "WITH x AS (SELECT * FROM payments) SELECT count(*) FROM x",
                "SELECT count(*) FROM payments AS account_summary"):
        with pytest.raises(OperationalError) as error:
            thrift_rows(server, sql, "carol", password)
        assert "user carol may not read payments" in str(error.value), (sql, str(error.value)[:500])
    assert audit_lines(server, "query by user 'carol' failed: ")
    # Granted payments too: served from her next statement.
    monkeypatch.setattr("sys.stdin", io.StringIO(password + "\n"))
    assert cli.main(["sql-server", "users", "add", "carol", "--tables", "account_summary,payments",
                     "--password-stdin"]) == 0
    sql = "SELECT count(*) FROM payments"
    assert thrift_rows(server, sql, "carol", password) == query_duckdb(server, sql)[1]
    # Removed: her next login is refused, and so is the next statement of a session she still holds.
    with connect(server, "carol", password) as held:
        assert cli.main(["sql-server", "users", "remove", "carol"]) == 0
        with pytest.raises(OperationalError, match="user carol is no longer a user of the SQL server"):
            held.cursor().execute("SELECT count(*) FROM account_summary")
    with pytest.raises(TTransportException, match="Error validating the login"):
        connect(server, "carol", password).close()
    # A password too short, or a user not there: refused by the CLI with the reason, nothing changed.
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert cli.main(["sql-server", "users", "add", "dave", "--password-stdin"]) == 2
    assert "password for user dave is refused" in capsys.readouterr().err
    assert cli.main(["sql-server", "users", "remove", "dave"]) == 2
    assert "user dave is not a user" in capsys.readouterr().err
