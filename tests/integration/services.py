"""Running `eventlake` commands as a user runs them: subprocesses with the test's settings in their environment."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from lakehouse.settings import Settings

WORKTREE = Path(__file__).resolve().parents[2]
# A librdkafka log line, e.g. "%3|1795699605.702|FAIL|rdkafka#consumer-2| [thrd:...]: ... Connection refused".
_CLIENT_LOG_LINE = re.compile(r"%\d\|\d+\.\d+\|[A-Z_]+\|rdkafka#")


def service_env(settings: Settings) -> dict[str, str]:
    """The environment a user gives the services: this worktree's code and the test's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTLAKE_")}
    env.update({"PYTHONPATH": str(WORKTREE), "PYTHONUNBUFFERED": "1",
                "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "EVENTLAKE_HOME": str(settings.home),
                "EVENTLAKE_TOPIC_PREFIX": settings.topic_prefix,
                "EVENTLAKE_TOPIC_PARTITIONS": str(settings.topic_partitions),
                "EVENTLAKE_HANDLER_GROUP_ID": settings.handler_group_id,
                "EVENTLAKE_POLICY_GROUP_ID": settings.policy_group_id,
                "EVENTLAKE_TRIGGER_INTERVAL": settings.trigger_interval,
                "EVENTLAKE_SPARK_SHUFFLE_PARTITIONS": str(settings.spark_shuffle_partitions),
                "EVENTLAKE_SPARK_DRIVER_MEMORY": "1g"})
    return env


class Service:
    """One `eventlake` service as a subprocess (in a session of its own, with its Spark JVM if it has one);
    its stdout and stderr in one log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        with open(self.log_path, "wb") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "eventlake.cli", *args], cwd=WORKTREE, env=env,
                                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 15) -> str:
        """The last ``lines`` lines of its own output: librdkafka's log lines (hundreds of "Connect ... failed"
        while a broker is away) are left out and counted, or they would be all a failure message shows."""
        kept, client_lines = [], 0
        for line in self.output().splitlines():
            if _CLIENT_LOG_LINE.match(line):
                client_lines += 1
            else:
                kept.append(line)
        return "\n".join(kept[-lines:]) + (f"\n({client_lines} librdkafka log lines left out)" if client_lines else "")

    def kill(self) -> None:
        """Cleanup only: the service and every process it started (its session)."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(30)


def wait_for(condition, timeout_s: float, every_s: float = 2.0):
    """``condition()``'s first true value within ``timeout_s``, else its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(every_s)
