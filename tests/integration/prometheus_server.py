"""A real Prometheus server for a test (Debian's ``prometheus`` package): on loopback, scraping every service that
registers under a home (``<home>/metrics/*.json``, file_sd) each second, with eventlake's alert rules loaded (their
windows in seconds, if asked)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tests.integration.sql_fixtures import free_port

PROMETHEUS = shutil.which("prometheus")
NO_PROMETHEUS = "prometheus is not on the PATH: sudo apt-get install prometheus (Debian's package)"
PUSHGATEWAY = shutil.which("prometheus-pushgateway")
NO_PUSHGATEWAY = ("prometheus-pushgateway is not on the PATH: sudo apt-get install prometheus-pushgateway (Debian's "
                  "package)")
RULES = Path(__file__).resolve().parents[2] / "infra" / "prometheus" / "alerts.yml"


def rules_in_seconds(text: str) -> str:
    """The alert rules with each window and ``for`` in seconds where they say minutes or hours (5m -> 5s, 1h -> 60s):
    the same expressions, seen fire within a test."""
    text = re.sub(r"(\[|for: )(\d+)m\b", r"\g<1>\2s", text)
    return re.sub(r"(\[|for: )(\d+)h\b", lambda m: f"{m.group(1)}{int(m.group(2)) * 60}s", text)


class _LoopbackServer:
    """A server process of Prometheus' family on loopback: started with ``args`` (its listen address appended),
    its output in ``<folder>/<name>.log``, ready once ``/-/ready`` answers; ``close()`` stops it."""

    def _start(self, name: str, folder: Path, args: list[str]) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log_path = folder / f"{name}.log"
        with open(self.log_path, "wb") as out:
            self.process = subprocess.Popen([*args, f"--web.listen-address={self.url.removeprefix('http://')}"],
                                            stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not self._ready():
            assert self.process.poll() is None and time.monotonic() < deadline, self.log_path.read_text()[-2000:]
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class PrometheusServer(_LoopbackServer):
    """``fast_rules``: the alert rules with their windows in seconds (``rules_in_seconds``). ``config``: this
    configuration instead of one scraping the registrations under ``home`` each second."""

    def __init__(self, home: Path, folder: Path, fast_rules: bool = False, config: dict | None = None):
        folder.mkdir(parents=True, exist_ok=True)
        rules = RULES
        if fast_rules:
            rules = folder / "alerts.yml"
            rules.write_text(rules_in_seconds(RULES.read_text()))
        config = config or {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "eventlake", "file_sd_configs": [
                {"files": [str(home / "metrics" / "*.json")], "refresh_interval": "1s"}]}]}
        config_file = folder / "prometheus.yml"
        config_file.write_text(json.dumps(config))  # JSON is YAML
        self._start("prometheus", folder, [PROMETHEUS, f"--config.file={config_file}",
                                           f"--storage.tsdb.path={folder / 'data'}"])

    def api(self, path: str, **params) -> dict:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> dict[tuple, float]:
        """An instant query: labels (sorted items, without __name__) -> value."""
        return {tuple(sorted((k, v) for k, v in r["metric"].items() if k != "__name__")): float(r["value"][1])
                for r in self.api("query", query=expr)["result"]}


class PushgatewayServer(_LoopbackServer):
    """A real Pushgateway (Debian's ``prometheus-pushgateway``) on loopback, holding what is pushed in memory."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        # Its own persistence file: Debian's default is one shared file under /var/lib/prometheus.
        self._start("pushgateway", folder, [PUSHGATEWAY, f"--persistence.file={folder / 'pushgateway.data'}"])

    def series(self, name: str) -> dict[tuple, float]:
        """The pushed series named ``name``: labels (sorted items) -> value."""
        from lakehouse import metrics

        return {tuple(sorted(labels.items())): value for n, labels, value in metrics.scrape(f"{self.url}/metrics")
                if n == name}
