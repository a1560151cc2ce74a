"""A YARN cluster with HDFS on loopback: Hadoop's own mini cluster (``hadoop-client-minicluster``), a NameNode,
a DataNode, a ResourceManager and a NodeManager in one JVM (``infra/yarn/MiniCluster.java``).

``resolve_libs`` copies the mini cluster's jars (``infra/yarn/pom.xml``) into the cache once; ``up`` compiles
``MiniCluster.java`` against them (once per change of the source), starts the JVM when it is not running and
waits until HDFS and the ResourceManager answer; ``down`` stops it (SIGTERM: YARN, then HDFS). HDFS keeps its
files under ``$EVENTLAKE_HOME/yarn/data`` across a ``down`` and ``up``.

What the apps need to run on it, ``up`` writes next to the Hadoop client configuration (``HADOOP_CONF_DIR``):
``eventlake-spark.conf``, the Spark settings of this cluster (the pyspark jars by a ``local:`` path, since the
NodeManager runs on this machine: no ~450 MB upload per app; this checkout's Python; small executors), which
``eventlake spark-submit --master yarn`` applies when ``HADOOP_CONF_DIR`` names a folder holding it.

Ports: ``Settings.yarn_port`` is the NameNode's RPC port (``fs.defaultFS``), the next its web UI, then the
ResourceManager's client, scheduler, resource-tracker and admin ports and its web UI (REST API); the DataNode
and the NodeManager take free ports.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from infra.maven import copy_dependencies
from lakehouse.processes import read_pid, terminate
from lakehouse.settings import Settings
from lakehouse.errors import Unavailable

__all__ = ["YarnStatus", "YarnError", "resolve_libs", "up", "down", "status", "spark_conf", "SPARK_CONF_FILE"]

_HERE = Path(__file__).resolve().parent / "yarn"
POM = _HERE / "pom.xml"
SOURCE = _HERE / "MiniCluster.java"
LOG4J = _HERE / "log4j.properties"
SPARK_CONF_FILE = "eventlake-spark.conf"
_PORTS = 7  # NameNode RPC + web, ResourceManager client, scheduler, resource tracker, admin, web


class YarnError(Unavailable, RuntimeError):
    """The mini cluster could not be set up, started or stopped."""


@dataclass(frozen=True)
class YarnStatus:
    pid: int | None
    ready: bool  # the JVM has written its configuration and the ResourceManager answers
    fs_uri: str
    rm_web: str
    conf_dir: Path
    log_file: Path
    node_managers: int

    @property
    def running(self) -> bool:
        return self.pid is not None and self.ready

    def describe(self) -> str:
        if self.pid is None:
            return f"yarn: stopped\n  log: {self.log_file}"
        state = f"running (pid {self.pid})" if self.ready else f"starting or broken (pid {self.pid})"
        return "\n".join([
            f"yarn: {state}; HDFS at {self.fs_uri}, ResourceManager web/REST at {self.rm_web}, "
            f"{self.node_managers} NodeManager(s) running",
            f"  log: {self.log_file}",
            f"  use it: HADOOP_CONF_DIR={self.conf_dir}",
            f"  e.g.    HADOOP_CONF_DIR={self.conf_dir} eventlake spark-submit projection --master yarn "
            f"-- --until-caught-up",
            f"  tables on HDFS: {self.fs_uri}/..."])


def libs_dir(settings: Settings) -> Path:
    return settings.cache_dir / "yarn-libs"


def _classes_dir(settings: Settings) -> Path:
    return settings.cache_dir / "yarn-classes"


def _folder(settings: Settings) -> Path:
    return settings.home / "yarn"


def conf_dir(settings: Settings) -> Path:
    return _folder(settings) / "conf"


def _paths(settings: Settings) -> dict[str, Path]:
    d = _folder(settings)
    return {"dir": d, "conf": conf_dir(settings), "data": d / "data", "pid": d / "minicluster.pid",
            "log": d / "minicluster.log", "ready": conf_dir(settings) / "ready"}


def fs_uri(settings: Settings) -> str:
    return f"hdfs://127.0.0.1:{settings.yarn_port}"


def rm_web(settings: Settings) -> str:
    return f"http://127.0.0.1:{settings.yarn_port + 6}"


def resolve_libs(settings: Settings, log=print) -> Path:
    """Copy the mini cluster's jars from Maven Central (through ~/.m2) into the cache; no-op when present."""
    return copy_dependencies(POM, libs_dir(settings), "Hadoop's mini cluster jars", YarnError, "yarn", log)


def _compile(settings: Settings, libs: Path) -> Path:
    """``MiniCluster.java`` compiled into the cache (again only when the source or the jars changed)."""
    classes = _classes_dir(settings)
    stamp = hashlib.sha256(SOURCE.read_bytes() + POM.read_bytes()).hexdigest()
    marker = classes / ".source"
    if marker.exists() and marker.read_text() == stamp and (classes / "MiniCluster.class").exists():
        return classes
    javac = _java_home() / "bin" / "javac"
    if not javac.exists():
        raise YarnError(f"no javac at {javac}: the mini cluster is compiled once and needs a JDK 17+, not a JRE")
    if classes.exists():
        shutil.rmtree(classes)
    classes.mkdir(parents=True)
    proc = subprocess.run([str(javac), "-d", str(classes), "-cp", f"{libs}/*", str(SOURCE)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise YarnError(f"compiling {SOURCE} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    marker.write_text(stamp)
    return classes


def _java_home() -> Path:
    """JAVA_HOME, else the JDK the ``java`` on PATH belongs to: the NodeManager's containers start
    ``$JAVA_HOME/bin/java``, so the JVM gets it in its environment."""
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    java = shutil.which("java")
    if java is None:
        raise YarnError("java is not on PATH; Hadoop's mini cluster needs a JDK 17+")
    return Path(java).resolve().parents[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _node_managers(settings: Settings) -> int:
    """Running NodeManagers as the ResourceManager's REST API lists them (-1 when it does not answer)."""
    try:
        with urllib.request.urlopen(f"{rm_web(settings)}/ws/v1/cluster/metrics", timeout=3) as response:
            return int(json.load(response)["clusterMetrics"]["activeNodes"])
    except (OSError, ValueError, KeyError):
        return -1


def status(settings: Settings) -> YarnStatus:
    p = _paths(settings)
    pid = read_pid(p["pid"])
    nodes = _node_managers(settings) if pid else -1
    ready = pid is not None and p["ready"].exists() and nodes >= 1
    return YarnStatus(pid, ready, fs_uri(settings), rm_web(settings), p["conf"], p["log"], max(nodes, 0))


def spark_conf(settings: Settings) -> dict[str, str]:
    """The Spark settings of an app on this cluster (written to ``HADOOP_CONF_DIR/eventlake-spark.conf``)."""
    import pyspark

    jars = Path(pyspark.__file__).resolve().parent / "jars"
    return {
        # The NodeManager runs here: containers take pyspark's jars from this disk, nothing is uploaded.
        "spark.yarn.jars": f"local:{jars}/*",
        # ... and this checkout's Python, which has the apps' third-party packages.
        "spark.pyspark.python": sys.executable,
        "spark.executor.instances": "1",
        "spark.executor.cores": "2",
        "spark.executor.memory": "1g",
        "spark.yarn.am.memory": "512m",
        # Spark's staging folder (the app's files for its containers) on this cluster's HDFS.
        "spark.yarn.stagingDir": f"{fs_uri(settings)}/tmp/spark-staging",
        # eventlake's settings are local paths without a scheme: with HDFS as the default file system, Spark would
        # put tables and checkpoints on HDFS while the Python side (the catalog through delta-rs, the checkpoints'
        # markers, logs) stays on the local disk. The apps keep the local disk; HDFS is reached by hdfs:// URIs.
        "spark.hadoop.fs.defaultFS": "file:///",
    }


def _write_spark_conf(settings: Settings) -> None:
    lines = ["# Spark settings of an app on eventlake's YARN mini cluster (infra/yarn.py); `eventlake spark-submit",
             "# --master yarn` applies them when HADOOP_CONF_DIR names this folder. --conf on its line wins."]
    lines += [f"{key}={value}" for key, value in spark_conf(settings).items()]
    (conf_dir(settings) / SPARK_CONF_FILE).write_text("\n".join(lines) + "\n")


def up(settings: Settings, log=print, timeout: float = 240.0) -> YarnStatus:
    """Start the mini cluster when it is not running; wait until HDFS and the ResourceManager answer."""
    current = status(settings)
    if current.running:
        _write_spark_conf(settings)
        return current
    if current.pid is not None:  # a JVM that never got ready, or lost its ResourceManager: start afresh
        terminate(current.pid, timeout=60, group=True)
    p = _paths(settings)
    for port in range(settings.yarn_port, settings.yarn_port + _PORTS):
        if _port_open(port):
            raise YarnError(f"port {port} is taken by another process; set EVENTLAKE_YARN_PORT to a free port "
                            f"(it and the next {_PORTS - 1})")
    libs = resolve_libs(settings, log=log)
    classes = _compile(settings, libs)
    for key in ("conf", "data"):
        p[key].mkdir(parents=True, exist_ok=True)
    p["ready"].unlink(missing_ok=True)
    java_home = _java_home()
    # The NodeManager's environment is its containers' (DefaultContainerExecutor): none of this shell's Python path
    # or eventlake settings, which would let an app run code or settings it was not given (as on a real cluster).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EVENTLAKE_", "PYSPARK_", "SPARK_", "HADOOP_", "PYTHON"))
           and k != "KAFKA_BOOTSTRAP_SERVERS"}
    env["JAVA_HOME"] = str(java_home)
    cmd = [str(java_home / "bin" / "java"), "-Xmx1g", f"-Dlog4j.configuration=file:{LOG4J}",
           "-cp", f"{classes}:{libs}/*", "MiniCluster", str(p["conf"]), str(p["data"]), str(settings.yarn_port),
           str(settings.yarn_port + 2), str(settings.yarn_nodemanager_memory_mb),
           str(settings.yarn_nodemanager_vcores)]
    with open(p["log"], "ab") as out:
        proc = subprocess.Popen(cmd, cwd=p["data"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    p["pid"].write_text(str(proc.pid))
    deadline = time.monotonic() + timeout
    while not status(settings).running:
        if proc.poll() is not None:
            p["pid"].unlink(missing_ok=True)
            raise YarnError(f"the YARN mini cluster exited with code {proc.returncode} while starting; see {p['log']}")
        if time.monotonic() > deadline:
            down(settings, log=lambda *_: None)
            raise YarnError(f"waited {timeout:.0f}s for HDFS and the ResourceManager; see {p['log']}")
        time.sleep(0.5)
    _write_spark_conf(settings)
    log(f"yarn: HDFS at {fs_uri(settings)}, ResourceManager at 127.0.0.1:{settings.yarn_port + 2} "
        f"(web {rm_web(settings)}); use it with HADOOP_CONF_DIR={p['conf']}")
    return status(settings)


def down(settings: Settings, log=print, timeout: float = 60.0) -> None:
    """Stop the mini cluster (YARN first, with the containers of running apps, then HDFS)."""
    p = _paths(settings)
    pid = read_pid(p["pid"])
    if pid is None:
        p["pid"].unlink(missing_ok=True)
        log("yarn: not running")
        return
    killed = terminate(pid, timeout=timeout, group=True)
    p["pid"].unlink(missing_ok=True)
    p["ready"].unlink(missing_ok=True)
    log(f"yarn: stopped (pid {pid}{', killed after ' + str(int(timeout)) + ' s' if killed else ''})")
