"""Benchmark: freshness -- how long after a command is accepted a SQL read shows it, and how long after a payment is
appended its FraudSuspected follows -- with the platform running as in production.

Prints figures; it is not a test. It starts the services as a user does (`eventlake handler`, `eventlake project`
with its default trigger and the archive, `eventlake detect-fraud`, `eventlake policy`; each a subprocess with its
own log under the run's home), waits until they serve, then sends generated commands at ``--rate`` commands/s for
``--seconds`` while, every ``--probe-every`` seconds, a probe command (a device location report on an account of
its own) is submitted and waited for. Measured:

- **freshness**: the probe's result received (accepted) -> its version visible in ``account_summary`` through
  ``eventlake query``'s path (``eventlake.query.query_duckdb``), queried within 20 ms of each new commit to the
  table (a stat of its Delta log's next commit file every 20 ms, and a query at least every second whatever the
  log says): a query costs ~16 ms of a core, so polling it every 50 ms took ~0.3 of the 2 cores from the platform;
- **accepted**: the probe sent -> its result received;
- **fraud**: a payment event appended -> the ``FraudSuspected`` event about it appended (Kafka timestamps of the
  events topic, for every payment the detector flags during the measurement);
- the read models projection's batches (sizes and durations, from its checkpoint) and where a typical batch's time
  goes (its `projection: batch N done in ...` lines).

Halves of the run are printed apart (first and second half): a lag that builds up shows as a second half slower
than the first.

``--backlog N``: catch-up, then live, on the same settings and without a restart. N generated events are in the
events topic before the services start (a projection far behind); printed: how long the read models' projection
took to catch up, its batches meanwhile, then the live measurement as above, and each service's peak memory (the
high-water mark of the resident set of its processes, its Spark JVM included).

    .venv/bin/python bench/freshness.py [--rate 2000] [--seconds 60] [--warm-up 30] [--accounts 2000]
                                        [--probe-every 1.0] [--backlog 1000000] [--without projection]
                                        [--fraud-engine python|spark] [--projection-engine auto|spark|python]
                                        [--merchants on|off] [--rss-every 60] [--fraud-state-cache-mb MB]

``--without projection`` leaves the read models' projection out (no freshness figure): the fraud latency with the
cores not shared with Spark. ``--fraud-engine spark`` runs the fraud detector as its Structured Streaming app.
``--projection-engine`` is ``eventlake project --engine``: ``auto`` (the default a user gets: the Python engine,
DuckDB + delta-rs, python_engine/, here where the tables are local folders), ``python`` or ``spark``
(the Structured Streaming queries). ``--merchants off`` starts without reference data (by default the generator's
merchants are loaded into ``dim_merchant`` first, so payments are joined with them as in production).
``--fraud-state-cache-mb`` sets the fraud detector's ``fraud_state_cache_mb`` (a soak with a small one shows its
memory's plateau sooner).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

from event_store.client import EventStore
from event_store.collector import CollectorPaced
from event_store.envelope import CommandEnvelope, format_time
from eventlake.generator import GeneratorConfig, generate_commands
from lakehouse.kafka_security import security_env
from lakehouse.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
SERVICES = {"handler": ["handler"], "projection": ["project"], "fraud-detector": ["detect-fraud"],
            "policy": ["policy"]}
REGIONS = ("US-NYC", "GB-LON")


def rss_slopes(samples: list[tuple[float, dict[str, float]]], after_s: float) -> dict[str, dict]:
    """Per service, the least-squares slope of its RSS over the samples taken ``after_s`` seconds or more into the
    measurement: MiB per hour, and per cent of its fitted RSS at ``after_s`` per hour (issue 42's aim: <= 2%)."""
    kept = [(t, rss) for t, rss in samples if t >= after_s]
    out: dict[str, dict] = {}
    if len(kept) < 3:
        return out
    for name in kept[0][1]:
        xs = [t / 3600 for t, _ in kept]
        ys = [rss.get(name, 0.0) for _, rss in kept]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
        at_start = my + slope * (after_s / 3600 - mx)
        out[name] = {"mib_per_hour": round(slope, 1), "start_mib": round(at_start, 1),
                     "percent_per_hour": round(100 * slope / at_start, 2) if at_start else None,
                     "first_mib": round(ys[0], 1), "last_mib": round(ys[-1], 1), "samples": len(ys)}
    return out


def figures(values: list[float], unit: str = "s") -> str:
    if not values:
        return "no sample"
    v = sorted(values)
    p99 = v[min(len(v) - 1, int(round(0.99 * (len(v) - 1))))]
    return (f"p50 {statistics.median(v):7.2f} {unit}   p99 {p99:7.2f} {unit}   max {v[-1]:7.2f} {unit}   "
            f"(n={len(v)})")


class Services:
    """The services as subprocesses in sessions of their own (their Spark JVMs with them), logs under home."""

    def __init__(self, settings: Settings, without: tuple[str, ...] = (), fraud_engine: str = "python",
                 projection_engine: str = "auto", fraud_state_cache_mb: int | None = None):
        self.logs = settings.home / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTLAKE_")}
        env.update({**security_env(settings), "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
                    "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "EVENTLAKE_HOME": str(settings.home),
                    "EVENTLAKE_TOPIC_PREFIX": settings.topic_prefix,
                    "EVENTLAKE_HANDLER_GROUP_ID": settings.handler_group_id,
                    "EVENTLAKE_POLICY_GROUP_ID": settings.policy_group_id})
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        if fraud_state_cache_mb is not None:
            env["EVENTLAKE_FRAUD_STATE_CACHE_MB"] = str(fraud_state_cache_mb)
        self.processes: dict[str, subprocess.Popen] = {}
        for name, args in SERVICES.items():
            if name in without:
                continue
            if name == "fraud-detector":
                args = [*args, "--engine", fraud_engine]
            if name == "projection":
                args = [*args, "--engine", projection_engine]
            with open(self.logs / f"{name}.log", "wb") as out:
                self.processes[name] = subprocess.Popen(
                    [sys.executable, "-m", "eventlake.cli", *args], cwd=ROOT, env=env, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True)

    def peak_rss_mib(self) -> dict[str, float]:
        """Each service's processes' resident-set high-water marks (VmHWM), summed per service, in MiB."""
        peaks: dict[str, float] = {}
        for name, process in self.processes.items():
            total = 0
            for status in Path("/proc").glob("[0-9]*/status"):
                try:
                    if os.getpgid(int(status.parent.name)) != process.pid:
                        continue
                    total += next(int(line.split()[1]) for line in status.read_text().splitlines()
                                  if line.startswith("VmHWM:"))
                except (OSError, StopIteration, ValueError):
                    continue
            peaks[name] = total / 1024
        return peaks

    def rss_mib(self, field: str = "VmRSS") -> dict[str, float]:
        """Each service's processes' resident sets now (``field`` of /proc/PID/status: VmRSS, or RssAnon for the
        private part without mapped files), summed per service, in MiB."""
        now: dict[str, float] = {name: 0.0 for name in self.processes}
        groups = {process.pid: name for name, process in self.processes.items()}
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                name = groups.get(os.getpgid(int(status.parent.name)))
                if name is None:
                    continue
                now[name] += next(int(line.split()[1]) for line in status.read_text().splitlines()
                                  if line.startswith(field + ":")) / 1024
            except (OSError, StopIteration, ValueError):
                continue
        return now

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) used so far by each service's processes, by the Kafka broker(s), by this
        bench (its load, probes and polls), and by the whole machine (busy time of every core)."""
        tick = os.sysconf("SC_CLK_TCK")
        used = {name: 0.0 for name in self.processes} | {"kafka broker": 0.0}
        groups = {process.pid: name for name, process in self.processes.items()}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                seconds = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
                name = groups.get(int(fields[2]))  # the process group: a service's session
                if name is None and b"kafka.Kafka" in (stat.parent / "cmdline").read_bytes():
                    name = "kafka broker"
            except (OSError, IndexError, ValueError):
                continue
            if name is not None:
                used[name] += seconds
        own = os.times()
        used["this bench"] = own.user + own.system
        with open("/proc/stat") as f:
            cpu = [int(v) for v in f.readline().split()[1:]]
        used["machine"] = (sum(cpu[:8]) - cpu[3] - cpu[4]) / tick  # all but idle and iowait
        return used

    def output(self, name: str) -> str:
        log = self.logs / f"{name}.log"
        return log.read_text(errors="replace") if log.exists() else ""

    def check(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = "\n".join(self.output(name).splitlines()[-15:])
                raise SystemExit(f"freshness bench: the {name} service stopped (exit {process.returncode}):\n{tail}")

    def stop(self) -> None:
        """SIGTERM to each service (which stops its own JVM), then SIGKILL to what is left of its session."""
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(10)


class TableChanges:
    """Whether a read model may have changed since the last look: a new commit file in its Delta log (a stat
    each time), or a second passed since the name was last resolved (the catalog may point elsewhere now, or the
    table is not local)."""

    def __init__(self, settings: Settings, name: str):
        self.settings, self.name = settings, name
        self.log: Path | None = None
        self.version, self.resolved = -1, 0.0

    def changed(self) -> bool:
        now = time.monotonic()
        if self.log is None or now - self.resolved >= 1.0:
            from eventlake.query import logical_tables

            self.resolved = now
            parts = logical_tables(self.settings).get(self.name)
            self.log = parts[0].path / "_delta_log" if parts and parts[0].path.is_dir() else None
            if self.log is not None:
                versions = [int(f[:20]) for f in os.listdir(self.log) if f.endswith(".json") and f[:20].isdigit()]
                self.version = max(versions, default=-1)
            return True
        moved = False
        while (self.log / f"{self.version + 1:020d}.json").exists():
            self.version, moved = self.version + 1, True
        return moved


def probe_version(settings: Settings, account: str) -> int | None:
    from eventlake.query import QueryError, query_duckdb

    try:
        _, rows = query_duckdb(settings, f"SELECT version FROM account_summary WHERE account_id = '{account}'")
    except QueryError:  # no table yet
        return None
    return rows[0][0] if rows else None


class FraudWatch(threading.Thread):
    """Reads the events topic and the commands topic from their ends at the start: payment events', FlagFraud
    commands' and FraudSuspected events' timestamps (the FlagFraud command splits the latency into the detector's
    part and the handler's). Cheap, so as to take as little as it can of the cores the platform shares with it:
    librdkafka, and only the records that name a payment are parsed."""

    def __init__(self, settings: Settings):
        super().__init__(daemon=True)
        from confluent_kafka import OFFSET_END, TopicPartition

        from event_store import kafka_clients

        self.consumer = kafka_clients.range_reader(settings, "bench-fraud-watch")
        self.commands_topic = settings.commands_topic
        assigned = []
        for topic in (settings.events_topic, settings.commands_topic):
            partitions = self.consumer.list_topics(topic, timeout=10).topics[topic].partitions
            assigned += [TopicPartition(topic, p, OFFSET_END) for p in sorted(partitions)]
        self.consumer.assign(assigned)
        self.paid: dict[str, float] = {}  # payment_id -> its event's timestamp (s)
        self.asked: dict[str, float] = {}  # payment_id -> its first FlagFraud command's timestamp (s)
        self.flagged: list[tuple[float, float, float | None]] = []  # (payment, FraudSuspected, FlagFraud) appended
        self.stopping = False

    def run(self) -> None:
        import orjson

        while not self.stopping:
            for record in self.consumer.consume(num_messages=5000, timeout=0.2):
                value = record.value()
                if record.error() is not None or not value or b'"payment_id"' not in value:
                    continue
                at = record.timestamp()[1] / 1000
                if record.topic() == self.commands_topic:
                    if b'"FlagFraud"' in value:
                        self.asked.setdefault((orjson.loads(value).get("payload") or {}).get("payment_id"), at)
                    continue
                event = orjson.loads(value)
                kind, payload = event.get("event_type", ""), event.get("payload") or {}
                if kind.startswith("Payment"):
                    self.paid.setdefault(payload.get("payment_id"), at)
                elif kind == "FraudSuspected" and payload.get("payment_id") in self.paid:
                    self.flagged.append((self.caused_at(payload), at, self.asked.get(payload["payment_id"])))
        self.consumer.close()

    def caused_at(self, finding: dict) -> float:
        """When the payment that made the finding was appended: the flagged one, but for ``rapid_attempts`` the
        later appended of the two (a payment received after another but earlier in event time flags the other:
        the latency runs from its own arrival, not from the other's, up to a minute before)."""
        at = self.paid[finding["payment_id"]]
        rapid = finding.get("rule") == "rapid_attempts"
        other = _RAPID_EVIDENCE.match(finding.get("evidence") or "") if rapid else None
        return max(at, self.paid.get(other.group(1), at)) if other else at


# event_store/account/fraud_rules.py's evidence of rule 1: the other payment of the two.
_RAPID_EVIDENCE = re.compile(r"payment (\S+) [0-9.]+s apart$")


def batches(settings: Settings, since: float, until: float) -> list[tuple[int, int, float]]:
    """The read models projection's batches committed in [since, until]: (batch id, events, seconds)."""
    from projection_core import checkpoint as log

    out = []
    for checkpoint in settings.checkpoints.glob("projection-*"):
        if checkpoint.name == "projection-event_archive":  # the archive's query: not a read model's
            continue
        commits = log.committed_batches(checkpoint)
        for before, batch in zip([None, *commits], commits):  # the first batch starts at offset 0 (a new topic)
            if before is None and batch != 0:
                continue  # its predecessor's files are cleaned up already (the last 100 batches are kept)
            done = log.committed_at(checkpoint, batch).timestamp()
            if since <= done <= until:
                started = log.planned_at(checkpoint, batch).timestamp()
                size = (log.offsets_total(checkpoint, batch, settings.events_topic)
                        - (0 if before is None else log.offsets_total(checkpoint, before, settings.events_topic)))
                out.append((batch, size, done - started))
    return sorted(out)


def read_models_offsets(settings: Settings) -> int:
    """The offsets the read models' projection has committed, summed over the topic's partitions (0 before)."""
    from projection_core import checkpoint as log

    best = 0
    for checkpoint in settings.checkpoints.glob("projection-*"):
        if checkpoint.name == "projection-event_archive":
            continue
        last = log.last_committed_batch(checkpoint)
        if last is not None:
            best = max(best, log.offsets_total(checkpoint, last, settings.events_topic))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=2000, help="background commands per second")
    ap.add_argument("--seconds", type=int, default=60, help="the measurement's length")
    ap.add_argument("--warm-up", type=int, default=30, help="seconds of traffic before the measurement")
    ap.add_argument("--accounts", type=int, default=2000)
    ap.add_argument("--probe-every", type=float, default=1.0)
    ap.add_argument("--keep", action="store_true", help="keep the run's home (logs, tables) and its topics")
    ap.add_argument("--merchants", choices=["on", "off"], default="on",
                    help="load the generator's merchants into dim_merchant first (on: the projection joins payments "
                         "with them; off: no reference data)")
    ap.add_argument("--json", type=Path, help="also write the measurements to this file (bench/report.py reads it)")
    ap.add_argument("--without", nargs="*", choices=["projection"], default=[],
                    help="leave these services out (without the projection: fraud latency alone, no freshness)")
    ap.add_argument("--fraud-engine", choices=["python", "spark"], default="python",
                    help="the fraud detector's engine (eventlake detect-fraud --engine)")
    ap.add_argument("--projection-engine", choices=["auto", "python", "spark"], default="auto",
                    help="the projection's engine (eventlake project --engine)")
    ap.add_argument("--fraud-state-cache-mb", type=int, default=None,
                    help="the fraud detector's state cache (fraud_state_cache_mb; default: the setting's default)")
    ap.add_argument("--rss-every", type=float, default=60.0,
                    help="seconds between samples of each service's resident set during the measurement; the "
                         "slope after the first 10 minutes (of a measurement longer than 20) is printed")
    ap.add_argument("--backlog", type=int, default=0,
                    help="generated events in the log before the services start: catch-up, then live")
    args = ap.parse_args()

    run = uuid.uuid4().hex[:8]
    base = Settings.load(role="admin")
    if base.uses_local_kafka:
        from infra import kafka

        kafka.up(base, log=lambda *_: None)
    home = (ROOT / ".cache" / "bench" / "freshness" / run).resolve()
    settings = base.replace(home=home, kafka_bootstrap_servers=base.bootstrap_servers,
                            topic_prefix=f"bench-fresh-{run}.", handler_group_id=f"bench-fresh-{run}",
                            policy_group_id=f"bench-fresh-policy-{run}")
    total = args.rate * (args.warm_up + args.seconds)
    # Event times follow the clock (the stream starts now, one command per 1/rate s of event time), as the
    # probes' do: the windowed read model's watermark then moves as in production.
    stream = iter(generate_commands(GeneratorConfig(
        accounts=args.accounts, commands=total + args.accounts, run_id=f"fresh{run}", seed=11,
        start=datetime.now(timezone.utc), mean_interval_s=1.0 / args.rate)))
    probe = f"acc-probe-{run}"
    if args.merchants == "on":
        # Reference data as in production: the generator's merchants in dim_merchant before the services start, so
        # the projection joins every payment with its merchant as of its time (issue 46).
        from reference_data.loads import load_merchants
        from reference_data.samples import write_sample_merchants

        landed = write_sample_merchants(home / "landing" / "merchants.csv", GeneratorConfig().merchants)
        print(" ".join(load_merchants(settings, str(landed), full=True).lines()), flush=True)
    store = EventStore(settings)  # creates the topics
    if args.backlog:
        sys.path.insert(0, str(ROOT))
        from bench.projection import generated_events, publish

        backlog = generated_events(args.backlog, 20_000, ROOT / ".cache" / "bench")
        publish(settings, backlog)
        print(f"backlog: {len(backlog):,} events in {settings.events_topic} before the services start", flush=True)
    projecting = "projection" not in args.without
    if args.backlog and not projecting:
        raise SystemExit("freshness bench: --backlog measures the projection's catch-up; it needs the projection")
    services = Services(settings, tuple(args.without), args.fraud_engine, args.projection_engine,
                        args.fraud_state_cache_mb)
    services_started = time.monotonic()
    print(f"freshness bench {run}: services starting (logs: {services.logs})", flush=True)
    try:
        if args.backlog:
            last_report = 0.0
            while read_models_offsets(settings) < len(backlog):
                services.check()
                if time.monotonic() - last_report >= 30:
                    last_report = time.monotonic()
                    print(f"  catching up: {read_models_offsets(settings):,} of {len(backlog):,} events projected "
                          f"({last_report - services_started:.0f}s)", flush=True)
                time.sleep(1)
            caught_up = time.monotonic() - services_started
            catch_up = batches(settings, 0, time.time())
            print(f"caught up: the read models' projection reached the backlog's end {caught_up:.0f}s after the "
                  f"services started ({len(backlog) / caught_up:,.0f} events/s, Spark start included), in "
                  f"{len(catch_up)} batch(es): " + ", ".join(f"{b[1]:,} events in {b[2]:.0f}s" for b in catch_up[:8])
                  + (" ..." if len(catch_up) > 8 else ""), flush=True)
        store.submit(CommandEnvelope.create("OpenAccount", probe, {"customer_id": "cus-probe",
                                                                   "credit_limit_minor": 100_000,
                                                                   "currency": "USD"}), timeout_s=300)
        started = time.monotonic()
        while projecting and probe_version(settings, probe) is None:  # the projection's first batch is in
            services.check()
            if time.monotonic() - started > 600:
                raise SystemExit("freshness bench: account_summary did not show the probe account within 600s")
            time.sleep(1)
        print(f"services serving after {time.monotonic() - started:.0f}s; warm-up: {args.warm_up}s at "
              f"{args.rate:,} commands/s", flush=True)

        sent = {"commands": 0}
        stop_load = threading.Event()

        def load() -> None:
            with EventStore(settings, ensure_topics=False) as loader:
                tick, chunk = 0.1, max(1, args.rate // 10)
                next_at = time.monotonic()
                while not stop_load.is_set():
                    records = [r for _, r in zip(range(chunk), stream)]
                    if not records:
                        return
                    sent["commands"] += loader.send_raw(records)
                    next_at += tick
                    time.sleep(max(0.0, next_at - time.monotonic()))

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        time.sleep(args.warm_up)
        services.check()
        # Not measured: this client's results reader first reads through the warm-up's results (its first
        # probe took 4-5 s more than the others for that alone).
        store.submit(CommandEnvelope.create("ReportDeviceLocation", probe, {
            "location": REGIONS[0], "occurred_at": format_time(datetime.now(timezone.utc))}), timeout_s=120)

        fraud = FraudWatch(settings)
        fraud.start()
        measure_from = time.time()
        cpu_before = services.cpu_seconds()
        probes: list[tuple[float, float, float]] = []  # (accepted at, sent -> accepted, accepted -> visible)
        pending: list[tuple[int, float, float]] = []  # (version, sent at, accepted at)
        lock = threading.Lock()
        stop_poll = threading.Event()

        changes = TableChanges(settings, "account_summary")

        def poll() -> None:
            while not stop_poll.is_set() or pending:
                with lock:
                    waiting = list(pending)
                if waiting and changes.changed():
                    version = probe_version(settings, probe) or 0
                    now = time.time()
                    with lock:
                        for item in [p for p in pending if p[0] <= version]:
                            pending.remove(item)
                            probes.append((item[2], item[2] - item[1], now - item[2]))
                time.sleep(0.02)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        rss_samples: list[tuple[float, dict[str, float]]] = []  # (seconds into the measurement, MiB per service)
        anon_samples: list[tuple[float, dict[str, float]]] = []  # the same, private memory only (RssAnon)

        def sample_rss() -> None:
            while not stop_poll.is_set():
                at = round(time.time() - measure_from, 1)
                rss_samples.append((at, services.rss_mib()))
                anon_samples.append((at, services.rss_mib("RssAnon")))
                stop_poll.wait(args.rss_every)

        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()
        deadline = time.monotonic() + args.seconds
        accepted: list[float] = []  # every probe: sent -> result
        unanswered: list[int] = []  # seconds into the measurement of each probe not answered within 60 s
        n = 0
        # This process's own garbage collections paced as the services' are (event_store.collector): its full
        # passes over what it holds (every payment's timestamp) came every ~4 s, up to 0.5 s, and a pause while
        # a probe is waited for is counted in that probe's figures.
        with CollectorPaced() as collector:
            while time.monotonic() < deadline:
                n += 1
                command = CommandEnvelope.create("ReportDeviceLocation", probe, {
                    "location": REGIONS[n % 2], "occurred_at": format_time(datetime.now(timezone.utc))})
                sent_at = time.time()
                try:
                    result = store.submit(command, timeout_s=60)
                except TimeoutError:  # the handler behind by more than a minute: counted, and the run goes on
                    unanswered.append(round(sent_at - measure_from))
                    print(f"  probe {n} not answered within 60 s ({unanswered[-1]} s into the measurement); "
                          f"going on", flush=True)
                    services.check()
                    continue
                accepted_at = time.time()
                accepted.append(accepted_at - sent_at)
                if result.accepted and projecting:
                    with lock:
                        pending.append((result.version, sent_at, accepted_at))
                collector.tick()
                time.sleep(max(0.0, args.probe_every - (time.time() - sent_at)))
                services.check()
        measure_until = time.time()
        cpu_used = {name: seconds - cpu_before.get(name, 0.0) for name, seconds in services.cpu_seconds().items()}
        stop_load.set()
        stop_poll.set()
        poller.join(120)
        fraud.stopping = True
        fraud.join(10)
        offered = args.rate * args.seconds

        print(f"\nmeasured {args.seconds}s at {args.rate:,} commands/s ({sent['commands']:,} sent in all, "
              f"{offered:,} in the measurement), {len(probes)} probes, {len(pending)} not visible within 120s")
        half = measure_from + (measure_until - measure_from) / 2
        print(f"  accepted   (probe sent -> result)            {figures(accepted)}")
        if unanswered:
            print(f"  probes not answered within 60 s: {len(unanswered)} (at {unanswered[:20]} s)")
        print(f"  freshness  (accepted -> in account_summary)  {figures([p[2] for p in probes])}")
        print(f"    first half                                 {figures([p[2] for p in probes if p[0] < half])}")
        print(f"    second half                                {figures([p[2] for p in probes if p[0] >= half])}")
        flagged = [(paid, at - paid) for paid, at, _ in fraud.flagged]
        print(f"  fraud      (payment -> FraudSuspected)       {figures([f[1] for f in flagged])}")
        print(f"    first half                                 {figures([f[1] for f in flagged if f[0] < half])}")
        print(f"    second half                                {figures([f[1] for f in flagged if f[0] >= half])}")
        split = [(asked - paid, at - asked) for paid, at, asked in fraud.flagged if asked is not None]
        print(f"    the detector (payment -> FlagFraud)        {figures([d for d, _ in split])}")
        print(f"    the handler (FlagFraud -> FraudSuspected)  {figures([h for _, h in split])}")
        done = batches(settings, measure_from, measure_until)
        if done:
            print(f"  read models' batches during the measurement: {len(done)}; events per batch "
                  f"{figures([float(b[1]) for b in done], 'ev')}")
            print(f"    batch duration (offsets written -> commit) {figures([b[2] for b in done])}")
        # The Spark engine's lines ("projection: batch N done in ...") and the Python engine's read models' ones
        # ("projection-<models>: batch N done in ...", not the archive's).
        lines = re.findall(r"^projection(?:-(?!event_archive)[^:]*)?: batch (\d+) done in ([\d.]+)s \((.*)\)$",
                           services.output("projection"), re.MULTILINE)
        measured = {b[0] for b in done}
        typical = [line for line in lines if int(line[0]) in measured] or lines
        if typical:
            by_time = sorted(typical, key=lambda line: float(line[1]))
            batch, seconds, steps = by_time[len(by_time) // 2]
            print(f"  a typical batch (the median of {len(typical)}): batch {batch}, {seconds}s in foreachBatch:")
            for step in steps.split("; "):
                print(f"    {step}")
        span = measure_until - measure_from
        cores = {name: used / span for name, used in cpu_used.items()}
        machine = cores.pop("machine")
        print(f"  cores busy on average during the measurement (of {os.cpu_count()}): machine {machine:.2f} = "
              + ", ".join(f"{name} {c:.2f}" for name, c in sorted(cores.items(), key=lambda i: -i[1]))
              + f", the rest {machine - sum(cores.values()):.2f}")
        # Its last progress line: what its transactions and snapshots took (a snapshot pauses its loop).
        handler_lines = re.findall(r"^handler [^:]*: (\d[\d,]* commands .*)$", services.output("handler"),
                                   re.MULTILINE)
        if handler_lines:
            print(f"  the handler's last progress line: {handler_lines[-1]}")
        slopes = rss_slopes(rss_samples, 600.0) if args.seconds > 1200 else {}
        anon_slopes = rss_slopes(anon_samples, 600.0) if args.seconds > 1200 else {}
        # VmRSS counts the pages of mapped files a process touched (the state stores' LMDB files: page cache the
        # kernel takes back when it needs it, swinging by hundreds of MiB within seconds); RssAnon is the memory
        # the process holds for itself.
        for what, found in (("resident memory (VmRSS, mapped files included)", slopes),
                            ("private memory (RssAnon)", anon_slopes)):
            if found:
                print(f"  {what} after the first 10 minutes (a sample every {args.rss_every:.0f}s; least-squares "
                      f"slope): " + ", ".join(f"{name} {f['first_mib']:,.0f} -> {f['last_mib']:,.0f} MiB, "
                                              f"{f['mib_per_hour']:+,.1f} MiB/h ({f['percent_per_hour']:+.2f}%/h)"
                                              for name, f in found.items()))
        peaks = services.peak_rss_mib()
        print("  peak resident memory per service (its processes, Spark JVM included): "
              + ", ".join(f"{name} {mib:,.0f} MiB" for name, mib in peaks.items()))
        if args.json:
            args.json.write_text(json.dumps({"backlog": args.backlog, "peak_rss_mib": peaks, "cores": cores,
                "without": args.without, "fraud_engine": args.fraud_engine,
                "projection_engine": args.projection_engine,
                "fraud_state_cache_mb": args.fraud_state_cache_mb,
                "rate": args.rate, "seconds": args.seconds, "accounts": args.accounts,
                "accepted": [round(a, 3) for a in accepted],
                "freshness": [[round(p[0] - measure_from, 3), round(p[2], 3)] for p in probes],
                "fraud": [[round(paid - measure_from, 3), round(latency, 3)] for paid, latency in flagged],
                "fraud_split": [[round(detector, 3), round(handler, 3)] for detector, handler in split],
                "batches": [[b[1], b[2]] for b in done], "not_visible": len(pending),
                "rss_samples": [[t, {k: round(v, 1) for k, v in rss.items()}] for t, rss in rss_samples],
                "rss_slopes": slopes,
                "anon_samples": [[t, {k: round(v, 1) for k, v in rss.items()}] for t, rss in anon_samples],
                "anon_slopes": anon_slopes}))
    finally:
        services.stop()
        store.close()
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
            sys.path.insert(0, str(ROOT))
            from bench.workloads import drop_scratch_topics

            drop_scratch_topics(settings)


if __name__ == "__main__":
    main()
