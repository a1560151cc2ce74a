"""The local Apache Kafka cluster in KRaft mode on loopback, from Kafka's own Maven Central artifacts: one broker
by default, or ``Settings.kafka_brokers`` of them (each also a controller of the KRaft quorum).

``resolve_libs`` copies the broker jars (``infra/kafka/pom.xml``) into the cache once; ``up`` formats each
node's data folder on first use and starts ``kafka.Kafka`` for every node not running; ``down`` stops them all.
Everything is idempotent: ``up`` on a running cluster only reports it, and on a cluster that lost a broker (a
kill -9) starts that one again. With 3 brokers every topic has 3 replicas and a write is acknowledged by 2
(``min.insync.replicas``), so one broker may be lost without losing an acknowledged record.

With ``Settings.kafka_security = "sasl_scram"`` (``eventlake kafka up --security sasl_scram``) clients must log in
with SASL/SCRAM on the client listener (over TLS with ``sasl_scram_tls``: a self-signed certificate made with
keytool, trusted by the clients through ``Settings.ssl_cafile``), and Kafka's StandardAuthorizer allows only
what the ACLs grant (``event_store.kafka_access``). The users, one per role, get random passwords in ``Settings.credentials_file``
(mode 0600) and their SCRAM credentials at format time; the admin is the super user the brokers themselves log in
as (SCRAM between brokers, PLAIN on the controllers' listener, where SCRAM cannot serve: KRaft keeps the SCRAM
credentials in the metadata log the controllers serve). The mode is recorded in ``kafka_dir/security``; a data
folder formatted for one mode refuses the other.
"""
from __future__ import annotations

import base64
import os
import secrets
import stat
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from infra.maven import copy_dependencies
from lakehouse.kafka_security import kafka_python_config, write_credentials
from lakehouse.processes import pid_alive, read_pid, terminate
from lakehouse.settings import SASL_MECHANISMS, Settings
from lakehouse.errors import Unavailable

__all__ = ["BrokerStatus", "NodeStatus", "KafkaError", "resolve_libs", "up", "down", "status", "tls_material"]

POM = Path(__file__).resolve().parent / "kafka" / "pom.xml"


class KafkaError(Unavailable, RuntimeError):
    """The local broker could not be set up, started or stopped."""


@dataclass(frozen=True)
class NodeStatus:
    node_id: int
    pid: int | None
    address: str
    data_dir: Path
    log_file: Path

    @property
    def running(self) -> bool:
        return self.pid is not None


@dataclass(frozen=True)
class BrokerStatus:
    """The local cluster: one node (broker and KRaft controller) per ``Settings.kafka_brokers``."""
    nodes: tuple[NodeStatus, ...]
    bootstrap_servers: str

    @property
    def running(self) -> bool:
        """Every node runs."""
        return all(n.running for n in self.nodes)

    @property
    def pid(self) -> int | None:
        return self.nodes[0].pid

    @property
    def data_dir(self) -> Path:
        return self.nodes[0].data_dir

    @property
    def log_file(self) -> Path:
        return self.nodes[0].log_file

    def describe(self) -> str:
        if len(self.nodes) == 1:
            n = self.nodes[0]
            state = f"running (pid {n.pid})" if n.running else "stopped"
            return f"kafka: {state} at {self.bootstrap_servers}\n  data: {n.data_dir}\n  log:  {n.log_file}"
        up_count = sum(n.running for n in self.nodes)
        lines = [f"kafka: {up_count} of {len(self.nodes)} brokers running at {self.bootstrap_servers}"]
        for n in self.nodes:
            state = f"running (pid {n.pid})" if n.running else "stopped"
            lines.append(f"  broker {n.node_id} at {n.address}: {state}; data {n.data_dir}; log {n.log_file}")
        return "\n".join(lines)


def libs_dir(settings: Settings) -> Path:
    return settings.cache_dir / "kafka-libs"


def resolve_libs(settings: Settings, log=print) -> Path:
    """Copy the broker's jars from Maven Central (through ~/.m2) into the cache; no-op when present."""
    return copy_dependencies(POM, libs_dir(settings), "Apache Kafka's broker jars", KafkaError, "kafka", log)


def _paths(settings: Settings, node_id: int = 1) -> dict[str, Path]:
    """Node 1 keeps the single broker's layout (``kafka_dir``); node k > 1 lives in ``kafka_dir/node-k``."""
    d = settings.kafka_dir if node_id == 1 else settings.kafka_dir / f"node-{node_id}"
    return {"dir": d, "data": d / "data", "config": d / "server.properties", "log4j": d / "log4j2.properties",
            "pid": d / "broker.pid", "log": d / "server.log", "stdout": d / "stdout.log"}


def _node_ids(settings: Settings) -> list[int]:
    if settings.kafka_brokers < 1:
        raise KafkaError(f"EVENTLAKE_KAFKA_BROKERS={settings.kafka_brokers}: at least 1 broker is needed")
    return list(range(1, settings.kafka_brokers + 1))


def _write_config(settings: Settings, node_id: int, p: dict[str, Path]) -> None:
    n = settings.kafka_brokers
    port = settings.local_broker_ports[node_id - 1]
    cport = settings.local_controller_ports[node_id - 1]
    voters = ",".join(f"{i}@127.0.0.1:{c}" for i, c in zip(_node_ids(settings), settings.local_controller_ports))
    # Kafka's own topics (group offsets, transactions) as durable as eventlake's: 3 replicas where there are 3
    # brokers, a write acknowledged by 2 of them.
    replicas, min_isr = min(3, n), max(1, min(2, min(3, n) - 1))
    # The file may hold the admin's password (SASL): readable by its owner only, from its creation on.
    fd = os.open(p["config"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w") as out:
        out.write(f"""# written by eventlake (infra/kafka.py); edits are overwritten on `eventlake kafka up`
process.roles=broker,controller
node.id={node_id}
controller.quorum.voters={voters}
{_listeners(settings, port, cport)}
log.dirs={p['data']}
num.partitions={settings.topic_partitions}
default.replication.factor={replicas}
min.insync.replicas={min_isr}
offsets.topic.replication.factor={replicas}
offsets.topic.num.partitions=5
transaction.state.log.replication.factor={replicas}
transaction.state.log.min.isr={min_isr}
transaction.state.log.num.partitions=5
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.retention.hours=-1
# How often the broker deletes the segments a topic's retention or a DeleteRecords put behind its log start: the
# handled commands `eventlake forget` deletes leave the disk within this (Kafka's default: 5 minutes).
log.retention.check.interval.ms=10000
""")
    p["log4j"].write_text(f"""status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {p['log']}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = info
logger.state.name = state.change.logger
logger.state.level = warn
""")


def _listeners(settings: Settings, port: int, cport: int) -> str:
    """The listeners' part of a node's config: plaintext, or SASL with the authorizer (see the module doc)."""
    if settings.kafka_security == "none":
        return f"""listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"""
    admin, password = write_credentials(settings.credentials_file)["admin"]
    scram = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{admin}" '
             f'password="{password}";')
    plain = (f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{admin}" '
             f'password="{password}" user_{admin}="{password}";')
    protocol = "SASL_SSL" if settings.kafka_security == "sasl_scram_tls" else "SASL_PLAINTEXT"
    lines = [f"listeners={protocol}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
             f"advertised.listeners={protocol}://127.0.0.1:{port}",
             "controller.listener.names=CONTROLLER",
             f"inter.broker.listener.name={protocol}",
             f"listener.security.protocol.map=CONTROLLER:SASL_PLAINTEXT,{protocol}:{protocol}",
             f"sasl.enabled.mechanisms={','.join(SASL_MECHANISMS)}",
             f"sasl.mechanism.inter.broker.protocol={settings.kafka_sasl_mechanism}",
             *(f"listener.name.{protocol.lower()}.{m.lower()}.sasl.jaas.config={scram}" for m in SASL_MECHANISMS),
             "sasl.mechanism.controller.protocol=PLAIN",
             "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
             f"listener.name.controller.plain.sasl.jaas.config={plain}",
             "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
             f"super.users=User:{admin}",
             "allow.everyone.if.no.acl.found=false"]
    if protocol == "SASL_SSL":
        keystore, keystore_password = _tls_material(settings)
        lines += ["ssl.keystore.type=PKCS12", f"ssl.keystore.location={keystore}",
                  f"ssl.keystore.password={keystore_password}", f"ssl.key.password={keystore_password}",
                  # What a broker trusts as a client of the others: the same certificate the clients trust.
                  "ssl.truststore.type=PEM", f"ssl.truststore.location={settings.ssl_cafile}"]
    return "\n".join(lines)


def _tls_material(settings: Settings) -> tuple[Path, str]:
    """The brokers' key and self-signed certificate (for 127.0.0.1 and localhost) in a PKCS12 keystore, and the
    certificate alone in PEM for clients to trust (``Settings.ssl_cafile``); made once with the JDK's keytool.
    Returns the keystore and its password (kept in a 0600 file beside it)."""
    tls = settings.kafka_dir / "tls"
    keystore, password_file, cafile = tls / "broker.p12", tls / "keystore-password", settings.ssl_cafile
    if keystore.exists() and password_file.exists() and cafile.exists():
        return keystore, password_file.read_text().strip()
    keytool = shutil.which("keytool")
    if keytool is None:
        raise KafkaError("keytool (from the JDK) is not on PATH; it makes the brokers' TLS certificate")
    tls.mkdir(parents=True, exist_ok=True)
    keystore.unlink(missing_ok=True)
    password = secrets.token_urlsafe(24)
    fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(password)
    for args in (["-genkeypair", "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048", "-validity", "3650",
                  "-dname", "CN=localhost, O=eventlake local cluster", "-ext", "SAN=ip:127.0.0.1,dns:localhost",
                  "-storetype", "PKCS12", "-keystore", str(keystore), "-storepass", password, "-keypass", password],
                 ["-exportcert", "-rfc", "-alias", "broker", "-keystore", str(keystore), "-storepass", password,
                  "-file", str(cafile)]):
        proc = subprocess.run([keytool, *args], capture_output=True, text=True)
        if proc.returncode != 0:
            raise KafkaError(f"keytool {args[0]} failed: {(proc.stdout + proc.stderr).replace(password, '***')}")
    os.chmod(keystore, 0o600)
    return keystore, password


def tls_material(settings: Settings) -> tuple[Path, str]:
    """The local cluster's TLS keystore (PKCS12) and its password, made once (``_tls_material``); clients trust
    it through ``Settings.ssl_cafile``. `eventlake sql-server` serves its Thrift port with it too, so one ca.pem
    trusts both."""
    return _tls_material(settings)


def _scram_arguments(settings: Settings) -> list[str]:
    """``kafka-storage format`` arguments that create every role's SCRAM credentials (both mechanisms)."""
    if settings.kafka_security == "none":
        return []
    args = []
    for username, password in write_credentials(settings.credentials_file).values():
        for mechanism in SASL_MECHANISMS:
            args += ["--add-scram", f"{mechanism}=[name={username},password={password}]"]
    return args


def _java(settings: Settings, p: dict[str, Path], main: str, *args: str, heap: str = "256m") -> list[str]:
    java = shutil.which("java")
    if java is None:
        raise KafkaError("java is not on PATH; the Kafka broker needs a JDK 17+")
    return [java, f"-Xmx{heap}", "-XX:+UseG1GC", "-cp", f"{libs_dir(settings)}/*",
            f"-Dlog4j2.configurationFile={p['log4j']}", main, *args]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def status(settings: Settings) -> BrokerStatus:
    nodes = []
    for node_id, port in zip(_node_ids(settings), settings.local_broker_ports):
        p = _paths(settings, node_id)
        nodes.append(NodeStatus(node_id, read_pid(p["pid"]), f"127.0.0.1:{port}", p["data"], p["log"]))
    return BrokerStatus(tuple(nodes), settings.bootstrap_servers)


def _brokers_file(settings: Settings) -> Path:
    return settings.kafka_dir / "brokers"


def _security_file(settings: Settings) -> Path:
    return settings.kafka_dir / "security"


def _check_security(settings: Settings) -> None:
    """A data folder formatted with SCRAM users serves SASL clients only, and one formatted without has none."""
    if not (_paths(settings)["data"] / "meta.properties").exists():
        return
    recorded = _security_file(settings)
    mode = recorded.read_text().strip() if recorded.exists() else "none"
    if mode != settings.kafka_security:
        raise KafkaError(f"{settings.kafka_dir} holds a cluster with security {mode}, not the "
                         f"{settings.kafka_security} asked for (--security, EVENTLAKE_KAFKA_SECURITY): stop it "
                         f"(`eventlake kafka down`) and "
                         f"delete {settings.kafka_dir}, or use another EVENTLAKE_HOME")


def _check_cluster_size(settings: Settings) -> None:
    """A data folder formatted for one cluster size does not serve another (the controllers' quorum differs)."""
    if not (_paths(settings)["data"] / "meta.properties").exists():
        return
    recorded = _brokers_file(settings)
    size = int(recorded.read_text()) if recorded.exists() else 1
    if size != settings.kafka_brokers:
        raise KafkaError(f"{settings.kafka_dir} holds a {size}-broker cluster, not the {settings.kafka_brokers} asked "
                         f"for (--brokers, EVENTLAKE_KAFKA_BROKERS): stop it (`eventlake kafka down`) and delete "
                         f"{settings.kafka_dir}, or use another EVENTLAKE_HOME")


def _cluster_id(settings: Settings) -> str:
    """The id of the cluster already formatted on one of the nodes, else a new one."""
    for node_id in _node_ids(settings):
        meta = _paths(settings, node_id)["data"] / "meta.properties"
        if meta.exists():
            for line in meta.read_text().splitlines():
                if line.startswith("cluster.id="):
                    return line.split("=", 1)[1].strip()
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def up(settings: Settings, log=print, timeout: float | None = None) -> BrokerStatus:
    """Start every local broker that is not running (all of them, or the one a kill -9 took away), then wait
    until the cluster serves with all of them. Refuses when KAFKA_BOOTSTRAP_SERVERS is set."""
    if not settings.uses_local_kafka:
        raise KafkaError(f"KAFKA_BOOTSTRAP_SERVERS={settings.kafka_bootstrap_servers} is set: "
                         "eventlake uses that cluster and starts no local broker")
    _check_cluster_size(settings)
    _check_security(settings)
    current = status(settings)
    if current.running:
        return current
    stopped = [n for n in current.nodes if not n.running]
    for node in stopped:
        ports = (settings.local_broker_ports[node.node_id - 1], settings.local_controller_ports[node.node_id - 1])
        for port in ports:
            if _port_open(port):
                raise KafkaError(f"port {port} (broker {node.node_id}) is taken by another process; set "
                                 "EVENTLAKE_KAFKA_PORT and EVENTLAKE_KAFKA_CONTROLLER_PORT to free ports (broker i "
                                 "uses each plus 2i)")
    resolve_libs(settings, log=log)
    cluster_id = _cluster_id(settings)
    started = {}
    for node in stopped:
        p = _paths(settings, node.node_id)
        p["dir"].mkdir(parents=True, exist_ok=True)
        _write_config(settings, node.node_id, p)
        if not (p["data"] / "meta.properties").exists():
            # "--cluster-id=ID", not "-t ID": a random id may start with "-" and would be read as an option.
            cmd = _java(settings, p, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                        "--config", str(p["config"]), *_scram_arguments(settings))
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                # The output may quote the --add-scram arguments: no passwords in the message.
                output = proc.stdout + proc.stderr
                if settings.kafka_security != "none":
                    for _, password in write_credentials(settings.credentials_file).values():
                        output = output.replace(password, "***")
                raise KafkaError(f"formatting {p['data']} failed:\n{output}")
        with open(p["stdout"], "ab") as out:
            proc = subprocess.Popen(_java(settings, p, "kafka.Kafka", str(p["config"]), heap="512m"),
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        p["pid"].write_text(str(proc.pid))
        started[node.node_id] = proc
    _brokers_file(settings).write_text(str(settings.kafka_brokers))
    _security_file(settings).write_text(settings.kafka_security)
    n = settings.kafka_brokers
    timeout = timeout if timeout is not None else 60.0 + 30.0 * (n - 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for node_id, proc in started.items():
            if proc.poll() is not None:
                p = _paths(settings, node_id)
                for other in started.values():
                    if other.poll() is None:
                        terminate(other.pid, 30.0)
                raise KafkaError(f"broker {node_id} exited with code {proc.returncode} while starting; see {p['log']} "
                                 f"and {p['stdout']}")
        if all(_port_open(port) for port in settings.local_broker_ports) and _brokers_serving(settings) == n:
            pids = ", ".join(str(proc.pid) for proc in started.values())
            what = "broker" if n == 1 else f"{len(started)} of {n} brokers"
            log(f"kafka: started {what} (pid {pids}) at {settings.bootstrap_servers} (data {settings.kafka_dir})")
            return status(settings)
        time.sleep(0.3)
    for proc in started.values():
        if proc.poll() is None:
            terminate(proc.pid, 30.0)
    for node_id in started:
        _paths(settings, node_id)["pid"].unlink(missing_ok=True)
    raise KafkaError(f"the cluster did not answer with {n} broker(s) on {settings.bootstrap_servers} within "
                     f"{timeout:.0f}s; see {_paths(settings)['log']}")


def _brokers_serving(settings: Settings) -> int:
    """How many brokers the cluster's metadata lists (0 when it does not answer)."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError as ClientError

    try:
        admin = KafkaAdminClient(**kafka_python_config(settings.for_role("admin")), request_timeout_ms=3000)
    except (ClientError, OSError):
        return 0
    try:
        return len(admin.describe_cluster()["brokers"])
    except (ClientError, OSError, KeyError):
        return 0
    finally:
        admin.close()


def down(settings: Settings, log=print, timeout: float = 30.0) -> None:
    """Stop every local broker (SIGTERM, then SIGKILL after ``timeout``). Data stays for the next ``up``."""
    running = [n for n in status(settings).nodes if n.running]
    if not running:
        log("kafka: not running")
        return
    # All at once: a broker stopping alone waits for the controllers' quorum, which the others would have left.
    for node in running:
        os.kill(node.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for node in running:
        while pid_alive(node.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(node.pid):
            os.kill(node.pid, signal.SIGKILL)
        _paths(settings, node.node_id)["pid"].unlink(missing_ok=True)
    log(f"kafka: stopped pid {', '.join(str(n.pid) for n in running)}")
