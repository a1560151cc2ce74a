"""Benchmark (issue 42's aims): the command handler on a long log, its memory, restart, restore and command path.

Prints figures; it is not a test. On a broker of its own (the project's ``infra.kafka``, free ports, a temp
home), for each size (N events over A accounts) it:

1. **seeds** the events topic with N valid events written straight to it through the project's envelope code
   (``EventEnvelope``, ``decider.event_id_for``: derived ids, versions 1, 2, 3 ... per account, the murmur2
   partition of the account as the handler's commands partition has it): each account's ``AccountOpened``, then
   payments (``PaymentAuthorized``, a device location every tenth event) round-robin over the accounts, as the
   handler itself would have written them (librdkafka, zstd: the handler's kafka-python reader has no lz4 codec
   here; large batches; no command results: the handler's
   idempotency windows start empty, as after a window's worth of new commands);
2. **first fold**: starts ``eventlake handler`` on a fresh home and times it until it answers a probe command in
   every partition (an ``OpenAccount`` of a new account each), sampling its RSS every 0.2 s (peak; and its
   split into RssAnon, the handler's heap, and RssFile, the state store's mapped pages);
3. **restart** on the same home (its state store under ``<home>/handler-state``): the same timing and peak;
4. **command path**, on that freshly restarted handler (cold cache): ``--commands`` ``AuthorizePayment``
   commands of random seeded accounts sent at once (``EventStore.send_raw``, as ``bench/commands.py``), timed
   to the last committed result; then the handler's RSS;
5. **restore** on a fresh home (snapshots topic + tail): the same timing; state entries/s = aggregates restored
   (the handler's own rebuild lines) / the rebuild's seconds.

The figures go to ``--json`` (default ``bench/results/long_log.json``, one entry per size and ``--label``, the
entries of other labels and sizes kept) and a table is printed. ``--handler-root DIR`` runs the handler of
another checkout (e.g. a ``git worktree`` of an earlier commit) with this interpreter and ``PYTHONPATH=DIR``:
the before/after line.

    .venv/bin/python bench/long_log.py [--sizes 1000000:100000 10000000:1000000] [--commands 100000]
                                       [--label after] [--handler-root DIR] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from event_store import kafka_log  # noqa: E402
from event_store.client import EventStore  # noqa: E402
from event_store.decider import event_id_for  # noqa: E402
from event_store.envelope import CommandEnvelope, EventEnvelope  # noqa: E402
from lakehouse.settings import Settings  # noqa: E402

from bench.commands import count_committed, results_reader  # noqa: E402

IDLE_S = 3.0  # after the commands: the handler idle this long before its RSS is read again
REGIONS = ("US-NYC", "US-SFO", "US-CHI", "GB-LON", "DE-BER", "FR-PAR", "JP-TYO", "BR-SAO", "IN-BOM", "AU-SYD")
REBUILT = re.compile(r"partition (\d+): (\d+) aggregates from (a snapshot \+ |the state store \+ |)(\d+) events "
                     r"and (\d+) results in ([\d.]+)s(?: \(CPU ([\d.]+)s\))?")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def account_id(run: str, i: int) -> str:
    return f"acc-{run}-{i:07d}"


def seeded_events(run: str, events: int, accounts: int, worker: int = 0, workers: int = 1):
    """(key, event JSON) of ``events`` valid events over ``accounts`` accounts: every account opened first, then
    payments and device locations round-robin; each event's id is the derivation of its fields. With
    ``workers`` > 1, only the events of the accounts ``i`` with ``i % workers == worker`` (each account's events
    stay in one worker, in version order)."""
    recorded = "2026-01-01T00:00:00.000Z"
    seq = 0
    for i in range(min(accounts, events)):
        if i % workers != worker:
            seq += 1
            continue
        a = account_id(run, i)
        command_id = f"{run}-{seq:024x}"
        yield a, EventEnvelope(event_id_for("account", a, 1, command_id), "AccountOpened", 1, "account", a, 1,
                               recorded, recorded, command_id, command_id, command_id,
                               {"customer_id": f"cus-{i}", "credit_limit_minor": 10**12, "currency": "USD"}).to_json()
        seq += 1
    version = 2
    while seq < events:
        for i in range(accounts):
            if seq >= events:
                return
            if i % workers != worker:
                seq += 1
                continue
            a = account_id(run, i)
            command_id = f"{run}-{seq:024x}"
            location = REGIONS[(i + version) % len(REGIONS)]
            at = f"2026-01-01T{(version // 60) % 24:02d}:{version % 60:02d}:00.000Z"
            if version % 10 == 0:
                kind, schema, payload = "DeviceLocationReported", 1, {"location": location}
            else:
                kind, schema, payload = "PaymentAuthorized", 2, {
                    "payment_id": f"pay-{i}-{version}", "amount_minor": 100 + (seq % 9900), "currency": "USD",
                    "merchant_id": f"mer-{seq % 500:04d}", "location": location, "merchant_country": location[:2]}
            yield a, EventEnvelope(event_id_for("account", a, version, command_id), kind, schema, "account", a,
                                   version, at, recorded, command_id, command_id, command_id, payload).to_json()
            seq += 1
        version += 1


def seed(settings: Settings, run: str, events: int, accounts: int, workers: int = 2) -> float:
    """Write the seeded events to the events topic, from ``workers`` processes; events/s."""
    import multiprocessing

    started = time.perf_counter()
    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=_seed_share, args=(settings, run, events, accounts, w, workers), daemon=True)
             for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise RuntimeError(f"a seeding process failed: exit codes {[p.exitcode for p in procs]}")
    return events / (time.perf_counter() - started)


def _seed_share(settings: Settings, run: str, events: int, accounts: int, worker: int, workers: int) -> None:
    import confluent_kafka

    from lakehouse.kafka_security import confluent_config

    producer = confluent_kafka.Producer({**confluent_config(settings),
                                         "partitioner": "murmur2_random", "compression.type": "zstd",
                                         "linger.ms": 50, "batch.size": 1024 * 1024, "acks": "all",
                                         "queue.buffering.max.messages": 2_000_000,
                                         "queue.buffering.max.kbytes": 2 * 1024 * 1024})
    topic = settings.events_topic
    produce, poll = producer.produce, producer.poll
    started = time.perf_counter()
    n = 0
    for key, value in seeded_events(run, events, accounts, worker, workers):
        while True:
            try:
                produce(topic, value, key)
                break
            except BufferError:
                poll(0.05)
        n += 1
        if n % 100_000 == 0:
            poll(0)
            if worker == 0 and n % 1_000_000 == 0:
                print(f"  seeded {n * workers:,} events ({n * workers / (time.perf_counter() - started):,.0f}/s)",
                      flush=True)
    left = producer.flush(300)
    if left:
        raise RuntimeError(f"{left} seeded events not acknowledged")


LIVE: list["Handler"] = []  # stopped when the bench ends, however it ends


class Handler:
    """``eventlake handler`` in a process of its own on ``home``, its RSS sampled every 0.2 s."""

    def __init__(self, settings: Settings, home: Path, log_path: Path, root: Path | None):
        env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "EVENTLAKE_HOME": str(home),
               "EVENTLAKE_TOPIC_PREFIX": settings.topic_prefix, "EVENTLAKE_HANDLER_GROUP_ID": settings.handler_group_id,
               "EVENTLAKE_KAFKA_SECURITY": "none", "EVENTLAKE_TOPIC_PARTITIONS": str(settings.topic_partitions),
               "EVENTLAKE_HANDLER_MAX_BATCH": os.environ.get("EVENTLAKE_HANDLER_MAX_BATCH", "5000"),
               "PYTHONPATH": str(root or ROOT)}
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-c", "from eventlake.cli import entry; entry()", "handler"],
                                     env=env, cwd=str(root or ROOT), stdout=self._log, stderr=subprocess.STDOUT)
        LIVE.append(self)
        self.started = time.perf_counter()
        self.samples: list[tuple[float, int, int]] = []  # (seconds since the start, RSS MiB, RssAnon MiB) every ~5 s
        self.peak = 0
        self.peak_anon = 0  # peak RssAnon: the handler's own memory (heap, caches, batches)
        self.peak_file = 0  # peak RssFile: the state store's mapped pages (and the interpreter's files)
        self.hwm = 0  # the kernel's high-water mark of its RSS (VmHWM): a spike the sampling misses counts too
        self._sampling = True
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def rss(self) -> int:
        import psutil

        try:
            return psutil.Process(self.proc.pid).memory_info().rss
        except psutil.NoSuchProcess:
            return 0

    def status(self) -> dict[str, int]:
        """The kernel's memory figures of the handler (bytes): VmHWM, and RSS split into RssAnon (the heap: what
        the handler holds) and RssFile (mapped file pages: the state store's LMDB map, reclaimable by the kernel)."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return {}
        return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in status.splitlines()
                if line.startswith(("VmHWM:", "RssAnon:", "RssFile:"))}

    def high_water_mark(self) -> int:
        return self.status().get("VmHWM", 0)

    def _sample(self) -> None:
        while self.proc.poll() is None:  # on until the process ends: its close (snapshots) counted in hwm
            self.hwm = max(self.hwm, self.high_water_mark())
            if not self._sampling:
                time.sleep(0.05)
                continue
            rss = self.rss()
            self.peak = max(self.peak, rss)
            kernel = self.status()
            self.peak_anon = max(self.peak_anon, kernel.get("RssAnon", 0))
            self.peak_file = max(self.peak_file, kernel.get("RssFile", 0))
            at = time.perf_counter() - self.started
            if not self.samples or at - self.samples[-1][0] >= 5:
                self.samples.append((round(at, 1), round(rss / 2**20), round(kernel.get("RssAnon", 0) / 2**20)))
            time.sleep(0.2)

    def rebuilds(self) -> list[tuple[int, int, str, int, int, float, float | None]]:
        """(partition, aggregates, source, events read, results read, seconds, CPU seconds or None) per line."""
        return [(int(p), int(n), src, int(ev), int(res), float(s), float(cpu) if cpu else None)
                for p, n, src, ev, res, s, cpu in REBUILT.findall(self.log_path.read_text())]

    def cpu_seconds(self) -> float:
        """The handler process's CPU time so far (user + system, all its threads)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self in LIVE:
            LIVE.remove(self)
        self._sampling = False
        self.proc.terminate()
        try:
            self.proc.wait(300)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._thread.join(5)
        self._log.close()


def probes(settings: Settings, tag: str) -> list[bytes]:
    """One OpenAccount per partition at least (30 new accounts, as bench/commands.py's warm-up)."""
    return [CommandEnvelope.create("OpenAccount", f"probe-{tag}-{i}", {"customer_id": "c", "credit_limit_minor": 1,
                                                                      "currency": "USD"}).to_json() for i in range(30)]


def timed_start(settings: Settings, home: Path, log_path: Path, root: Path | None, tag: str,
                timeout_s: float) -> tuple[Handler, dict]:
    """Start a handler on ``home`` and time it to the first and to the last of the probes' answers."""
    consumer = results_reader(settings, at_end=True)
    started = time.perf_counter()
    handler = Handler(settings, home, log_path, root)
    with EventStore(settings, ensure_topics=False) as store:
        store.send_raw([(f"probe-{tag}-{i}", value) for i, value in enumerate(probes(settings, tag))])
    seen, first_at, _ = count_committed(consumer, 30, timeout_s)
    seconds = time.perf_counter() - started
    consumer.close()
    if seen < 30:
        handler.stop()
        raise RuntimeError(f"the handler answered {seen} of 30 probes in {timeout_s:.0f}s; its log: {log_path}")
    return handler, {"first_answer_s": round(first_at - started, 2), "all_answered_s": round(seconds, 2),
                     "peak_rss_mib": round(handler.peak / 2**20), "peak_anon_mib": round(handler.peak_anon / 2**20),
                     "peak_file_mib": round(handler.peak_file / 2**20), "rss_answered_mib": round(handler.rss() / 2**20),
                     "rss_timeline_mib": handler.samples}


def shown(figures: dict) -> dict:
    """The figures printed (the RSS timeline only goes to the JSON)."""
    return {k: v for k, v in figures.items() if k != "rss_timeline_mib"}


def rebuild_figures(handler: Handler) -> dict:
    rows = handler.rebuilds()
    aggregates = sum(r[1] for r in rows)
    seconds = max((r[5] for r in rows), default=0.0)  # partitions are rebuilt one after the other in one loop
    total = sum(r[5] for r in rows)
    return {"partitions": len(rows), "aggregates": aggregates, "events_read": sum(r[3] for r in rows),
            "results_read": sum(r[4] for r in rows), "sources": sorted({r[2].strip(" +") or "log" for r in rows}),
            "rebuild_s": round(total, 2), "slowest_partition_s": round(seconds, 2),
            "entries_per_s": round(aggregates / total) if total else None,
            # The handler's CPU time during its rebuilds: what they cost on a core of their own (a loaded host
            # stretches the seconds, not this).
            "rebuild_cpu_s": round(sum(r[6] for r in rows), 2) if rows and all(r[6] is not None for r in rows)
            else None}


def command_path(settings: Settings, run: str, accounts: int, commands: int) -> dict:
    """AuthorizePayment commands of random seeded accounts, all sent at once; commands/s to the last result."""
    rng = random.Random(7)
    records = []
    for n in range(commands):
        a = account_id(run, rng.randrange(accounts))
        records.append((a, CommandEnvelope.create("AuthorizePayment", a, {
            "payment_id": f"cmd-{run}-{n}", "amount_minor": 500, "currency": "USD", "merchant_id": "mer-0001",
            "location": "US-NYC", "occurred_at": "2026-01-02T00:00:00.000Z"}).to_json()))
    consumer = results_reader(settings, at_end=True)
    started = time.perf_counter()
    with EventStore(settings, ensure_topics=False) as store:
        store.send_raw(records)
    seen = count_committed(consumer, commands, timeout_s=1200)[0]
    seconds = time.perf_counter() - started
    consumer.close()
    return {"commands": seen, "seconds": round(seconds, 2), "commands_per_s": round(seen / seconds)}


def run_size(broker: Settings, events: int, accounts: int, commands: int, root: Path | None, work: Path,
             timeout_s: float) -> dict:
    run = uuid.uuid4().hex[:8]
    settings = broker.replace(topic_prefix=f"bench-longlog-{run}.", handler_group_id=f"bench-longlog-{run}",
                              topic_partitions=3)
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    figures: dict = {"events": events, "accounts": accounts, "topic_prefix": settings.topic_prefix}
    started = time.perf_counter()
    figures["seed_events_per_s"] = round(seed(settings, run, events, accounts))
    figures["seed_s"] = round(time.perf_counter() - started, 1)
    print(f"{events:,} events over {accounts:,} accounts seeded in {figures['seed_s']}s "
          f"({figures['seed_events_per_s']:,} events/s)", flush=True)
    home = work / f"home-{run}"
    handler, first = timed_start(settings, home, work / f"handler-{run}-fold.log", root, "fold", timeout_s)
    first.update(rebuild_figures(handler))
    handler.stop()
    first["high_water_mib"] = round(handler.hwm / 2**20)
    figures["first_fold"] = first
    print(f"  first fold (fresh home): {shown(first)}", flush=True)
    handler, again = timed_start(settings, home, work / f"handler-{run}-restart.log", root, "restart", timeout_s)
    again.update(rebuild_figures(handler))
    figures["restart"] = again
    print(f"  restart (same home): {shown(again)}", flush=True)
    cpu_before = handler.cpu_seconds()
    path = command_path(settings, run, accounts, commands)
    # Commands per second of the handler's CPU time: its rate on a core of its own, whatever the host's load.
    path["handler_cpu_s"] = round(handler.cpu_seconds() - cpu_before, 2)
    path["commands_per_cpu_s"] = round(path["commands"] / path["handler_cpu_s"]) if path["handler_cpu_s"] else None
    path["rss_after_mib"] = round(handler.rss() / 2**20)
    time.sleep(IDLE_S)  # then idle: what the last writes mapped of the stores is handed back (StateStore.settle)
    path["rss_idle_mib"] = round(handler.rss() / 2**20)
    path["peak_rss_mib"] = round(handler.peak / 2**20)
    path["peak_anon_mib"] = round(handler.peak_anon / 2**20)
    figures["command_path"] = path
    handler.stop()
    path["high_water_mib"] = round(handler.hwm / 2**20)
    print(f"  command path (cold cache): {shown(path)}", flush=True)
    handler, restore = timed_start(settings, work / f"home-{run}-restore", work / f"handler-{run}-restore.log",
                                   root, "restore", timeout_s)
    restore.update(rebuild_figures(handler))
    handler.stop()
    restore["high_water_mib"] = round(handler.hwm / 2**20)
    # The store entries it restored (states, payment-id index keys, idempotency-window rows): the aim's "state
    # entries"; entries_per_s above counts aggregates only.
    from event_store.state_store import store_figures

    stores = [store_figures(folder) for folder in (work / f"home-{run}-restore" / "handler-state").iterdir()]
    restore["store_entries"] = sum(f["entries"] for f in stores if f)
    restore["store_entries_per_s"] = (round(restore["store_entries"] / restore["rebuild_s"])
                                      if restore.get("rebuild_s") else None)
    restore["store_entries_per_cpu_s"] = (round(restore["store_entries"] / restore["rebuild_cpu_s"])
                                          if restore.get("rebuild_cpu_s") else None)
    figures["restore"] = restore
    print(f"  restore (fresh home: snapshots + tail): {shown(restore)}", flush=True)
    figures["home_bytes"] = sum(f.stat().st_size for f in home.rglob("*") if f.is_file())
    figures["seconds"] = round(time.perf_counter() - started, 1)
    from bench.workloads import drop_scratch_topics
    drop_scratch_topics(settings)
    return figures


def anon(figures: dict) -> str:
    """Peak RssAnon, the handler's own memory (runs before it was recorded: '?')."""
    return f"{figures['peak_anon_mib']:,}" if "peak_anon_mib" in figures else "?"


def _store_rates(restore: dict) -> str:
    """' (store entries/s; store entries per CPU-second)' of a restore, for runs that recorded them."""
    rates = [format(restore[k], ",") for k in ("store_entries_per_s", "store_entries_per_cpu_s") if restore.get(k)]
    return f" ({'; '.join(rates)})" if rates else ""


def table(entries: list[dict]) -> str:
    lines = ["| label | events | accounts | seed ev/s | fold: answered s | fold peak RSS (anon) | restart: answered s | "
             "restart peak RSS | restore s | restore aggregates/s (store entries/s; per CPU-s) | commands/s | RSS after commands (idle 3 s later) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        f, r, s, c = e["first_fold"], e["restart"], e["restore"], e["command_path"]
        lines.append(f"| {e['label']} | {e['events']:,} | {e['accounts']:,} | {e['seed_events_per_s']:,} | "
                     f"{f['all_answered_s']} | {f['peak_rss_mib']:,} ({anon(f)}) MiB | {r['all_answered_s']} | "
                     f"{r['peak_rss_mib']:,} MiB | {s['all_answered_s']} | "
                     f"{s['entries_per_s'] if s['entries_per_s'] is not None else '-'}"
                     f"{_store_rates(s)} | "
                     f"{c['commands_per_s']:,}"
                     f"{' (' + format(c['commands_per_cpu_s'], ',') + ' per CPU-s)' if c.get('commands_per_cpu_s') else ''} | "
                     f"{c['rss_after_mib']:,}"
                     f"{' (' + format(c['rss_idle_mib'], ',') + ')' if 'rss_idle_mib' in c else ''} MiB |")
    return "\n".join(lines)


def report(figures: Path) -> int:
    """The section of bench/results/REPORT.md for the figures in ``figures`` (bench/report.py draws the plot)."""
    from bench import report as bench_report

    entries = sorted(json.loads(figures.read_text()), key=lambda e: (e["label"], e["events"]))
    out = ROOT / "bench" / "results"
    commits = ", ".join(sorted({f"{e['label']} {e['commit']}" for e in entries}))
    section = bench_report.long_log_section(entries, table(entries),
                                            f".venv/bin/python bench/long_log.py ... ({commits})",
                                            max(e["when"] for e in entries), bench_report.machine(), out)
    bench_report.replace_section(out / "REPORT.md", bench_report.LONG_LOG_TITLE, section)
    print(f"report: {out / 'REPORT.md'} ({len(entries)} runs), plot {out / 'long_log.png'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["1000000:100000", "10000000:1000000"],
                        help="EVENTS:ACCOUNTS, one run each, in order")
    parser.add_argument("--commands", type=int, default=100_000, help="commands of the command path")
    parser.add_argument("--label", default="after", help="the entries' label in the JSON (e.g. before/after)")
    parser.add_argument("--handler-root", type=Path, help="run the handler of this checkout (PYTHONPATH)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a handler may take to answer")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "long_log.json")
    parser.add_argument("--report", action="store_true",
                        help="only write the figures already in --json into bench/results/REPORT.md (plot, table)")
    args = parser.parse_args(argv)
    if args.report:
        return report(args.json)
    from infra import kafka

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the broker and handlers are stopped on the way out
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.handler_root or ROOT,
                            capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="bench-long-log-") as tmp:
        work = Path(tmp)
        broker = Settings.load({}).replace(home=work / "kafka-home", kafka_port=_free_port(),
                                           kafka_controller_port=_free_port(), kafka_brokers=1,
                                           kafka_security="none")
        kafka.up(broker, log=lambda *_: None)
        local = broker
        broker = broker.replace(kafka_bootstrap_servers=broker.bootstrap_servers)
        print(f"long-log bench: broker {broker.bootstrap_servers} (home {work}), handler of {commit} "
              f"({args.handler_root or ROOT}), {os.cpu_count()} CPUs", flush=True)
        entries = []
        try:
            for size in args.sizes:
                events, accounts = (int(x) for x in size.split(":"))
                figures = run_size(broker, events, accounts, args.commands, args.handler_root, work, args.timeout)
                figures.update(label=args.label, commit=commit,
                               when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
                entries.append(figures)
                saved = json.loads(args.json.read_text()) if args.json.exists() else []
                saved = [e for e in saved if (e["label"], e["events"]) != (args.label, events)] + [figures]
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(saved, indent=1) + "\n")
        finally:
            for handler in list(LIVE):
                handler.stop()
            kafka.down(local, log=lambda *_: None)
    print(table(entries))
    print(f"figures: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
