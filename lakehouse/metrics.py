"""Prometheus metrics of a long-running service: ``/metrics`` over HTTP, and where to find it (issue 44).

A service hands ``serve`` a function that returns its figures (``Sample``s, read from counters it keeps anyway):
they are turned into Prometheus' text format when scraped, so the command path and the projection's batches pay
nothing per event for being watched. With ``metrics_port = 0`` (the default) a service takes a free port and
registers it in ``<home>/metrics/<service>-<pid>.json``, a target file in Prometheus' ``file_sd`` format: point a
``file_sd_configs`` entry at ``<home>/metrics/*.json`` and every local service is scraped; `eventlake metrics`
reads the same files. The file goes when the service stops (a killed service's file is skipped: its process is
gone).

Names follow Prometheus' conventions: the ``eventlake_`` prefix, ``_total`` for counters, base units
(``_seconds``), labels of bounded values only (an outcome, a partition, a read model; never an id).
"""
from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from lakehouse.errors import Unavailable
from lakehouse.processes import pid_alive
from lakehouse.settings import Settings, SettingsError

__all__ = ["Sample", "MetricsServer", "serve", "push", "register", "SPARK_METRICS_PATH", "consumer_lag_samples", "local_targets", "scrape", "Target", "MetricsError", "table"]

KINDS = ("counter", "gauge")


class MetricsError(Unavailable, RuntimeError):
    """A metrics endpoint cannot be served (its port is taken) or read."""


@dataclass(frozen=True)
class Sample:
    """One figure: ``name`` without the ``eventlake_`` prefix (a counter's without ``_total``), its kind
    ("counter" or "gauge"), its help text, its labels and its value."""
    name: str
    kind: str
    help: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """A local service's metrics endpoint, as registered under ``<home>/metrics``."""
    service: str
    pid: int
    url: str


def push(settings: Settings, job: str, group: dict[str, str], samples: Iterable[Sample],
         log: Callable[[str], None] = print) -> bool:
    """Push ``samples`` to the Pushgateway at ``settings.pushgateway_url`` under ``job`` and the grouping key
    ``group`` (each group's figures replace only that group's: one table's check does not erase another's), with a
    ``service`` label of ``job``. Nothing when no Pushgateway is configured. A push that fails is said, never
    raised: a task's outcome is its own, not its metrics'. -> whether it was pushed."""
    if not settings.pushgateway_url:
        return False
    from prometheus_client import CollectorRegistry, push_to_gateway

    samples = list(samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Figures(lambda: samples, job))
    try:
        push_to_gateway(settings.pushgateway_url, job=job, registry=registry, grouping_key=group, timeout=10)
    except (OSError, ValueError) as e:
        log(f"{job}: could not push its metrics to the Pushgateway at {settings.pushgateway_url} "
            f"(EVENTLAKE_PUSHGATEWAY_URL): {e}")
        return False
    return True


def consumer_lag_samples(lag: dict[int, int]) -> list[Sample]:
    """The lag of a service reading the events topic through a consumer group (the fraud policy, the fraud
    detector): records past it, by partition it owns. One name for every such service (its ``service`` label says
    which), so one alert rule serves them all."""
    return [Sample("consumer_lag_records", "gauge", "Events records past this consumer, by partition it owns", n,
                   {"partition": str(partition)}) for partition, n in sorted(dict(lag).items())]


class _Figures:
    """A prometheus_client collector over a function returning ``Sample``s, called at each scrape."""

    def __init__(self, figures: Callable[[], Iterable[Sample]], service: str):
        self.figures, self.service = figures, service

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        families: dict[str, object] = {}
        for s in self.figures():
            if s.kind not in KINDS:
                raise ValueError(f"metric {s.name}: kind {s.kind!r}, expected one of {KINDS}")
            name = f"eventlake_{s.name}"
            family = families.get(name)
            if family is None:
                labels = ["service", *sorted(s.labels)]
                kind = CounterMetricFamily if s.kind == "counter" else GaugeMetricFamily
                family = families[name] = kind(name, s.help, labels=labels)
            family.add_metric([self.service, *(str(s.labels[k]) for k in sorted(s.labels))], float(s.value))
        yield from families.values()


SPARK_METRICS_PATH = "/metrics/prometheus"  # Spark's PrometheusServlet (spark_apps.session, spark_metrics = "on")


def register(settings: Settings, service: str, address: str, metrics_path: str = "/metrics") -> Path:
    """Register ``address`` (host:port) as ``service``'s metrics endpoint in ``<home>/metrics/<service>-<pid>.json``
    (Prometheus' file_sd format; ``metrics_path`` as its ``__metrics_path__`` when not /metrics): -> the file,
    which its owner removes when it stops."""
    folder = targets_folder(settings)
    folder.mkdir(parents=True, exist_ok=True)
    registration = folder / f"{service}-{os.getpid()}.json"
    labels = {"service": service, "pid": str(os.getpid())}
    if metrics_path != "/metrics":
        labels["__metrics_path__"] = metrics_path
    temporary = registration.with_suffix(".tmp")
    temporary.write_text(json.dumps([{"targets": [address], "labels": labels}]))
    temporary.replace(registration)  # Prometheus never reads half a file
    return registration


class MetricsServer:
    """A running ``/metrics`` endpoint; ``close()`` stops it and removes its registration."""

    def __init__(self, settings: Settings, service: str, figures: Callable[[], Iterable[Sample]],
                 log: Callable[[str], None] = print):
        from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

        self.service = service
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Figures(figures, service))
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
        try:
            self.httpd, self.thread = start_http_server(settings.metrics_port, addr=settings.metrics_host,
                                                        registry=self.registry)
        except OSError as e:
            raise MetricsError(f"{service}: cannot serve metrics on {settings.metrics_host}:{settings.metrics_port} "
                               f"({e.strerror or e}); set EVENTLAKE_METRICS_PORT to a free port (0 takes any) or "
                               f"EVENTLAKE_METRICS=off") from None
        self.port = self.httpd.server_address[1]
        self.url = f"http://{settings.metrics_host}:{self.port}/metrics"
        self.registration = register(settings, service, f"{settings.metrics_host}:{self.port}")
        self._closed = False
        log(f"{service}: metrics at {self.url}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.registration.unlink(missing_ok=True)
        self.httpd.shutdown()
        self.httpd.server_close()


def serve(settings: Settings, service: str, figures: Callable[[], Iterable[Sample]],
          log: Callable[[str], None] = print) -> MetricsServer | None:
    """Serve ``figures`` as ``/metrics`` for ``service`` (None when ``metrics = "off"``)."""
    if settings.metrics not in ("on", "off"):
        raise SettingsError(f"setting metrics={settings.metrics!r} (EVENTLAKE_METRICS): expected on or off")
    if settings.metrics == "off":
        return None
    return MetricsServer(settings, service, figures, log)


def targets_folder(settings: Settings) -> Path:
    return settings.home / "metrics"


def local_targets(settings: Settings) -> list[Target]:
    """The services of this home that serve metrics now (a registration whose process is gone is skipped)."""
    targets = []
    folder = targets_folder(settings)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            entry = json.loads(path.read_text())[0]
            pid = int(entry["labels"]["pid"])
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            continue  # not a registration of ours
        if not pid_alive(pid):
            continue  # gone (killed without cleaning up)
        path = entry["labels"].get("__metrics_path__", "/metrics")
        targets.append(Target(entry["labels"]["service"], pid, f"http://{entry['targets'][0]}{path}"))
    return targets


def scrape(url: str, timeout_s: float = 5.0) -> list[tuple[str, dict[str, str], float]]:
    """The samples a ``/metrics`` endpoint serves: (name, labels, value)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            text = response.read().decode()
    except OSError as e:
        raise MetricsError(f"metrics at {url} not readable: {e}") from None
    return [(s.name, dict(s.labels), s.value) for family in text_string_to_metric_families(text)
            for s in family.samples]


def table(settings: Settings) -> list[str]:
    """`eventlake metrics`: every local service's figures as they stand, a block per service."""
    targets = local_targets(settings)
    if not targets:
        return [f"no service of this home serves metrics now (registrations under {targets_folder(settings)}; "
                f"services register there while they run, unless EVENTLAKE_METRICS=off)"]
    lines = []
    for target in targets:
        try:
            samples = scrape(target.url)
        except MetricsError as e:
            lines += [f"{target.service} (pid {target.pid}): {e}", ""]
            continue
        lines.append(f"{target.service} (pid {target.pid}, {target.url})")
        rows = [(name, ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "service"), value)
                for name, labels, value in samples
                if name.startswith("eventlake_") or name in ("process_resident_memory_bytes", "process_cpu_seconds_total")
                if not name.endswith("_created")]
        width = max((len(n) + len(lab) + 3 for n, lab, _ in rows), default=0)
        for name, labels, value in rows:
            label = f"{name}{{{labels}}}" if labels else name
            shown = f"{value:,.0f}" if float(value).is_integer() else f"{value:,.3f}"
            lines.append(f"  {label:<{width}} {shown:>16}")
        lines.append("")
    return lines
