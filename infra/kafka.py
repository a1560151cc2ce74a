"""A single-node Apache Kafka broker in KRaft mode on loopback, from Kafka's own Maven Central artifacts.

``resolve_libs`` copies the broker jars (``infra/kafka/pom.xml``) into the cache once; ``up`` formats
the data folder on first use and starts ``kafka.Kafka`` in the background; ``down`` stops it.
Everything is idempotent: ``up`` on a running broker only reports it.
"""
from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from eventlake.processes import read_pid, terminate
from lakehouse.settings import Settings

__all__ = ["BrokerStatus", "KafkaError", "resolve_libs", "up", "down", "status"]

POM = Path(__file__).resolve().parent / "kafka" / "pom.xml"


class KafkaError(RuntimeError):
    """The local broker could not be set up, started or stopped."""


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap_servers: str
    data_dir: Path
    log_file: Path

    def describe(self) -> str:
        state = f"running (pid {self.pid})" if self.running else "stopped"
        return (f"kafka: {state} at {self.bootstrap_servers}\n"
                f"  data: {self.data_dir}\n  log:  {self.log_file}")


def libs_dir(settings: Settings) -> Path:
    return settings.cache_dir / "kafka-libs"


def resolve_libs(settings: Settings, log=print) -> Path:
    """Copy the broker's jars from Maven Central (through ~/.m2) into the cache; no-op when present."""
    target = libs_dir(settings)
    marker = target / ".complete"
    if marker.exists() and marker.read_text() == POM.read_text():
        return target
    if shutil.which("mvn") is None:
        raise KafkaError("Maven (mvn) is needed once to fetch Apache Kafka's jars; install it (apt-get install maven)")
    log(f"kafka: resolving broker jars from Maven Central into {target} (once) ...")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    cmd = ["mvn", "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
           f"-DoutputDirectory={target}", "-DincludeScope=runtime"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        raise KafkaError(f"resolving Kafka jars failed ({' '.join(cmd)}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    marker.write_text(POM.read_text())
    log(f"kafka: {len(list(target.glob('*.jar')))} jars in {target}")
    return target


def _paths(settings: Settings) -> dict[str, Path]:
    d = settings.kafka_dir
    return {"dir": d, "data": d / "data", "config": d / "server.properties", "log4j": d / "log4j2.properties",
            "pid": d / "broker.pid", "log": d / "server.log", "stdout": d / "stdout.log"}


def _write_config(settings: Settings, p: dict[str, Path]) -> None:
    port, cport = settings.kafka_port, settings.kafka_controller_port
    p["config"].write_text(f"""# written by eventlake (infra/kafka.py); edits are overwritten on `eventlake kafka up`
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{cport}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={p['data']}
num.partitions={settings.topic_partitions}
offsets.topic.replication.factor=1
offsets.topic.num.partitions=5
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=5
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.retention.hours=-1
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
    p = _paths(settings)
    pid = read_pid(p["pid"])
    return BrokerStatus(pid is not None, pid, settings.bootstrap_servers, p["data"], p["log"])


def up(settings: Settings, log=print, timeout: float = 60.0) -> BrokerStatus:
    """Start the local broker unless it already runs. Refuses when KAFKA_BOOTSTRAP_SERVERS is set."""
    if not settings.uses_local_kafka:
        raise KafkaError(f"KAFKA_BOOTSTRAP_SERVERS={settings.kafka_bootstrap_servers} is set: "
                         "eventlake uses that cluster and starts no local broker")
    p = _paths(settings)
    current = status(settings)
    if current.running:
        return current
    if _port_open(settings.kafka_port):
        raise KafkaError(f"port {settings.kafka_port} is taken by another process; "
                         "set EVENTLAKE_KAFKA_PORT (and EVENTLAKE_KAFKA_CONTROLLER_PORT) to free ports")
    resolve_libs(settings, log=log)
    p["dir"].mkdir(parents=True, exist_ok=True)
    _write_config(settings, p)
    if not (p["data"] / "meta.properties").exists():
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        # "--cluster-id=ID", not "-t ID": a random id may start with "-" and would be read as an option.
        cmd = _java(settings, p, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                    "--config", str(p["config"]))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise KafkaError(f"formatting {p['data']} failed:\n{proc.stdout}{proc.stderr}")
    with open(p["stdout"], "ab") as out:
        proc = subprocess.Popen(_java(settings, p, "kafka.Kafka", str(p["config"]), heap="512m"),
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    p["pid"].write_text(str(proc.pid))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise KafkaError(f"the broker exited with code {proc.returncode} while starting; see {p['log']} "
                             f"and {p['stdout']}")
        if _port_open(settings.kafka_port) and _broker_ready(settings):
            log(f"kafka: started pid {proc.pid} at {settings.bootstrap_servers} (data {p['data']})")
            return status(settings)
        time.sleep(0.3)
    down(settings, log=lambda *_: None)
    raise KafkaError(f"the broker did not answer on {settings.bootstrap_servers} within {timeout:.0f}s; "
                     f"see {p['log']}")


def _broker_ready(settings: Settings) -> bool:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError as ClientError

    try:
        admin = KafkaAdminClient(bootstrap_servers=settings.bootstrap_servers, request_timeout_ms=3000)
    except (ClientError, OSError):
        return False
    try:
        admin.list_topics()
        return True
    except (ClientError, OSError):
        return False
    finally:
        admin.close()


def down(settings: Settings, log=print, timeout: float = 30.0) -> None:
    """Stop the local broker (SIGTERM, then SIGKILL after ``timeout``). Data stays for the next ``up``."""
    p = _paths(settings)
    pid = read_pid(p["pid"])
    if pid is None:
        log("kafka: not running")
        return
    terminate(pid, timeout)
    p["pid"].unlink(missing_ok=True)
    log(f"kafka: stopped pid {pid}")
