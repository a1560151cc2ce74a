"""Benchmark (issue 42): the fraud detector's memory against the number of accounts, its state on disk or not.

Prints figures; it is not a test. On a broker of its own (``infra.kafka``, free ports, a temp folder) it seeds the
events topic once with ``--events`` valid events over ``--accounts`` accounts (``bench/long_log.py``'s seeding:
payments round-robin over the accounts, a device location every tenth event), then runs ``eventlake detect-fraud
--until-caught-up`` over the whole log once per variant, each on a fresh home (so each folds every event from the
log's start), sampling its RSS every 0.2 s (peak; the kernel's high-water mark; RssAnon, its own memory):

- ``cache <N> MB`` (default 128): this checkout, ``fraud_state_cache_mb=N``: the states on disk (LMDB), a cache of
  encoded states of N MB;
- ``cache unbounded`` (with ``--unbounded``): this checkout with a cache that holds every account;
- ``before`` (with ``--before-root DIR``, e.g. a ``git worktree`` of an earlier commit): that checkout's detector,
  run with this interpreter and ``PYTHONPATH=DIR``.

The variants run one after the other on the same seeded topic, in one run: read them side by side. The time
includes the detector's start and its last state write and snapshot.

    .venv/bin/python bench/fraud_state.py [--events 2000000] [--accounts 200000] [--cache-mb 128] [--unbounded]
                                          [--before-root DIR]
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lakehouse.settings import Settings  # noqa: E402

from bench.long_log import _free_port, seed  # noqa: E402

_READ = re.compile(r"fraud detector: (\d+) events read")


def _status(pid: int) -> dict[str, int]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in text.splitlines()
            if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:"))}


def run_variant(broker: Settings, label: str, home: Path, root: Path, cache_mb: int | None) -> dict:
    """``eventlake detect-fraud --until-caught-up`` of ``root`` on ``home``: seconds, events/s, memory."""
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers, "EVENTLAKE_HOME": str(home),
           "EVENTLAKE_TOPIC_PREFIX": broker.topic_prefix, "EVENTLAKE_KAFKA_SECURITY": "none",
           "EVENTLAKE_TOPIC_PARTITIONS": str(broker.topic_partitions), "EVENTLAKE_LINEAGE": "off",
           "EVENTLAKE_METRICS_PORT": "0", "PYTHONPATH": str(root)}
    if cache_mb is not None:
        env["EVENTLAKE_FRAUD_STATE_CACHE_MB"] = str(cache_mb)
    log_path = home.parent / f"{home.name}.log"
    home.mkdir(parents=True)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", "from eventlake.cli import entry; entry()", "detect-fraud",
                                 "--until-caught-up"], env=env, cwd=str(root), stdout=log, stderr=subprocess.STDOUT)
        peak = {"VmRSS": 0, "VmHWM": 0, "RssAnon": 0}

        def sample():
            while proc.poll() is None:
                for key, value in _status(proc.pid).items():
                    peak[key] = max(peak[key], value)
                time.sleep(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            code = proc.wait(7200)
        except BaseException:
            proc.kill()
            raise
        sampler.join(2)
    seconds = time.perf_counter() - started
    output = log_path.read_text()
    if code != 0:
        raise RuntimeError(f"{label}: detect-fraud exited {code}:\n{output[-3000:]}")
    read = _READ.findall(output)
    events = int(read[-1]) if read else 0
    state = home / "fraud-detector-state"
    on_disk = sum(f.stat().st_size for f in state.rglob("*") if f.is_file()) if state.exists() else 0
    snapshots = home / "checkpoints" / "fraud-detector-consumer"
    snapshot = sum(f.stat().st_size for f in snapshots.glob("*.json")) if snapshots.exists() else 0
    return {"label": label, "seconds": seconds, "events": events, "rate": events / seconds,
            "peak_rss": max(peak["VmRSS"], peak["VmHWM"]), "peak_anon": peak["RssAnon"], "on_disk": on_disk,
            "snapshot": snapshot}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--accounts", type=int, default=200_000)
    parser.add_argument("--cache-mb", type=int, default=128, help="the bounded variant's fraud_state_cache_mb")
    parser.add_argument("--unbounded", action="store_true", help="also run with a cache that holds every account")
    parser.add_argument("--before-root", type=Path, help="also run the detector of this checkout (PYTHONPATH)")
    args = parser.parse_args(argv)
    from infra import kafka

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="bench-fraud-state-") as tmp:
        work = Path(tmp)
        local = Settings.load({}).replace(home=work / "kafka-home", kafka_port=_free_port(),
                                          kafka_controller_port=_free_port(), kafka_brokers=1, kafka_security="none")
        kafka.up(local, log=lambda *_: None)
        broker = local.replace(kafka_bootstrap_servers=local.bootstrap_servers,
                               topic_prefix=f"bench-fraud-{uuid.uuid4().hex[:6]}-")
        try:
            from event_store import kafka_log

            kafka_log.ensure_topics(broker, log=lambda *_: None)
            rate = seed(broker, "fs", args.events, args.accounts)
            print(f"fraud-state bench: {args.events:,} events over {args.accounts:,} accounts seeded "
                  f"({rate:,.0f}/s) on {broker.bootstrap_servers}, {os.cpu_count()} CPUs", flush=True)
            variants = [(f"cache {args.cache_mb} MB", ROOT, args.cache_mb)]
            if args.unbounded:
                variants.append(("cache unbounded", ROOT, 1 << 20))
            if args.before_root:
                variants.append((f"before ({args.before_root.name})", args.before_root, None))
            rows = []
            for n, (label, root, cache_mb) in enumerate(variants):
                row = run_variant(broker, label, work / f"home-{n}", root, cache_mb)
                rows.append(row)
                print(f"  {label}: {row['seconds']:.0f} s, {row['rate']:,.0f} events/s, peak RSS "
                      f"{row['peak_rss'] / 2**20:,.0f} MiB", flush=True)
        finally:
            kafka.down(local, log=lambda *_: None)
    print()
    print("| variant | events | seconds | events/s | peak RSS MiB | peak RssAnon MiB | state on disk MiB | "
          "snapshots MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['label']} | {r['events']:,} | {r['seconds']:.0f} | {r['rate']:,.0f} | "
              f"{r['peak_rss'] / 2**20:,.0f} | {r['peak_anon'] / 2**20:,.0f} | {r['on_disk'] / 2**20:,.0f} | "
              f"{r['snapshot'] / 2**20:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
