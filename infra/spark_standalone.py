"""A Spark standalone cluster on loopback from the pyspark distribution: a master and N workers, each a JVM of its
own (``org.apache.spark.deploy.master.Master`` / ``...worker.Worker`` through pyspark's ``bin/spark-class``).

``up`` starts what is not running and waits until every worker has registered; ``down`` stops them all. The
apps run on it by configuration only: ``EVENTLAKE_SPARK_MASTER=spark://127.0.0.1:<port>`` (what ``up`` prints).
Executors run this checkout's Python (``PYSPARK_PYTHON``, set by ``spark_apps.session``), so on this machine the
code needs no shipping; on other machines see docs/deployment.md (``--py-files``).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from lakehouse.processes import pid_alive, read_pid
from lakehouse.settings import Settings
from lakehouse.errors import Unavailable

__all__ = ["ClusterStatus", "SparkClusterError", "up", "down", "status", "master_url", "spark_home"]


class SparkClusterError(Unavailable, RuntimeError):
    """The standalone cluster could not be started or stopped."""


@dataclass(frozen=True)
class ClusterStatus:
    master_url: str
    web_url: str
    pids: dict[str, int | None]  # "master", "worker-1", ... -> pid when running
    workers_registered: int
    folder: Path

    @property
    def running(self) -> bool:
        return all(pid is not None for pid in self.pids.values())

    def describe(self) -> str:
        state = "running" if self.running else f"{sum(p is not None for p in self.pids.values())} of " \
                                                f"{len(self.pids)} processes running"
        lines = [f"spark cluster: {state} at {self.master_url} (web UI {self.web_url}); "
                 f"{self.workers_registered} worker(s) registered"]
        lines += [f"  {name}: " + (f"pid {pid}" if pid else "stopped") for name, pid in self.pids.items()]
        lines.append(f"  logs: {self.folder}")
        lines.append(f"  use it: EVENTLAKE_SPARK_MASTER={self.master_url}")
        return "\n".join(lines)


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _folder(settings: Settings) -> Path:
    return settings.home / "spark-cluster"


def master_url(settings: Settings) -> str:
    return f"spark://127.0.0.1:{settings.spark_cluster_port}"


def _web_url(settings: Settings) -> str:
    return f"http://127.0.0.1:{settings.spark_cluster_port + 1}"


def _names(settings: Settings) -> list[str]:
    return ["master", *(f"worker-{i}" for i in range(1, settings.spark_cluster_workers + 1))]


def _registered_workers(settings: Settings) -> int:
    """Workers the master lists as ALIVE (0 when the master does not answer)."""
    try:
        with urllib.request.urlopen(f"{_web_url(settings)}/json/", timeout=3) as response:
            state = json.load(response)
    except (OSError, ValueError):
        return 0
    return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")


def status(settings: Settings) -> ClusterStatus:
    folder = _folder(settings)
    pids = {name: read_pid(folder / f"{name}.pid") for name in _names(settings)}
    registered = _registered_workers(settings) if pids["master"] else 0
    return ClusterStatus(master_url(settings), _web_url(settings), pids, registered, folder)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _command(settings: Settings, name: str) -> list[str]:
    spark_class = spark_home() / "bin" / "spark-class"
    port = settings.spark_cluster_port
    if name == "master":
        return [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                "--port", str(port), "--webui-port", str(port + 1)]
    i = int(name.split("-")[1])
    work = _folder(settings) / name
    return [str(spark_class), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
            "--cores", str(settings.spark_cluster_worker_cores), "--memory", settings.spark_cluster_worker_memory,
            "--webui-port", str(port + 1 + i), "--work-dir", str(work), master_url(settings)]


def up(settings: Settings, log=print, timeout: float = 120.0) -> ClusterStatus:
    """Start the master and the workers that are not running; wait until every worker has registered."""
    if shutil.which("java") is None:
        raise SparkClusterError("java is not on PATH; Spark needs a JDK 17+")
    folder = _folder(settings)
    folder.mkdir(parents=True, exist_ok=True)
    current = status(settings)
    if current.running and current.workers_registered == settings.spark_cluster_workers:
        return current
    env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOG_DIR": str(folder),
           "SPARK_NO_DAEMONIZE": "1"}
    started = {}
    for name in _names(settings):
        if current.pids[name] is not None:
            continue
        if name == "master":
            for port in (settings.spark_cluster_port, settings.spark_cluster_port + 1):
                if _port_open(port):
                    raise SparkClusterError(f"port {port} is taken by another process; set "
                                            "EVENTLAKE_SPARK_CLUSTER_PORT to a free port (it and the next ones)")
        (folder / name).mkdir(exist_ok=True)
        with open(folder / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(_command(settings, name), env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        (folder / f"{name}.pid").write_text(str(proc.pid))
        started[name] = proc
        if name == "master":  # workers register with a master that listens
            _wait(lambda: _port_open(settings.spark_cluster_port), started, settings, timeout, "the master to listen")
    _wait(lambda: _registered_workers(settings) == settings.spark_cluster_workers, started, settings, timeout,
          f"{settings.spark_cluster_workers} worker(s) to register")
    log(f"spark cluster: master and {settings.spark_cluster_workers} worker(s) at {master_url(settings)} "
        f"(web UI {_web_url(settings)}); use it with EVENTLAKE_SPARK_MASTER={master_url(settings)}")
    return status(settings)


def _wait(condition, started: dict, settings: Settings, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for name, proc in started.items():
            if proc.poll() is not None:
                down(settings, log=lambda *_: None)
                raise SparkClusterError(f"spark {name} exited with code {proc.returncode} while starting; see "
                                        f"{_folder(settings) / (name + '.log')}")
        if time.monotonic() > deadline:
            down(settings, log=lambda *_: None)
            raise SparkClusterError(f"waited {timeout:.0f}s for {what}; see the logs in {_folder(settings)}")
        time.sleep(0.5)


def down(settings: Settings, log=print, timeout: float = 30.0) -> None:
    """Stop the workers and the master (each with the JVMs it started: executors of running apps end too)."""
    folder = _folder(settings)
    stopped = []
    for name in reversed(_names(settings)):
        pid = read_pid(folder / f"{name}.pid")
        if pid is None:
            continue
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)
        (folder / f"{name}.pid").unlink(missing_ok=True)
        stopped.append(f"{name} (pid {pid})")
    log(f"spark cluster: stopped {', '.join(stopped)}" if stopped else "spark cluster: not running")
