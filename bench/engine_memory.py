"""The Python projection engine's memory between batches as the log grows (issue 42), before and after its index
of keys and heads moved to disk, side by side. Prints figures; it is not a test.

For each size (``--sizes``; a size larger than the smallest is copies of the smallest's account events, the same
accounts going on: ``bench.projection.continued_copies``, so the live aggregates stay the same and only the log
grows), the events are published once to a topic of their own; then each code tree (``--before``: a checkout of
the old code, e.g. ``git worktree add /tmp/h3-before <commit>``; and this one) runs ``PythonProjection`` until
caught up in a process of its own, with tables and a checkpoint of its own, and records at the end of each of its
read models' batches the process's anonymous RSS (its heap: what it holds itself) and its file-backed RSS (mapped
files: LMDB's pages, shared libraries; the kernel's page cache, given back under pressure) and the batch's time.
Absolute figures mean little on a shared 2-core machine: compare the columns of one run.

    .venv/bin/python bench/engine_memory.py [--sizes 200000 1000000] [--accounts 20000] [--batch 20000]
                                            [--before /tmp/h3-before]
    .venv/bin/python bench/engine_memory.py --stores [--keys 1000000] [--batch 10000]

``--stores`` measures the candidate stores of the index on the engine's access pattern instead (no broker): an
index of ``--keys`` 64-bit key hashes and a tenth as many aggregate heads, then batches of ``--batch`` new hashes
and a fifth as many aggregates each looked up, then written in one transaction: LMDB (``lmdb``, as the command
handler's state store) and SQLite in WAL mode (``sqlite3``), each in a process of its own.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.projection import continued_copies, generated_events, publish  # noqa: E402
from bench.workloads import scratch_topics  # noqa: E402
from lakehouse.kafka_security import security_env  # noqa: E402
from lakehouse.settings import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# Run in the measured process, with the code tree under test first on its path.
_DRIVER = r"""
import json, sys, time
from bench.projection import domain_models
from lakehouse.settings import Settings
from python_engine.run import PythonProjection

def memory():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return [int(fields[f].split()[0]) / 1024 for f in ("RssAnon", "RssFile")]

samples = []
def log(line):
    if line.startswith("projection-") and " done in " in line and "event_archive" not in line.split(":")[0]:
        seconds = float(line.split(" done in ")[1].split("s")[0])
        samples.append([seconds, *memory()])

engine = PythonProjection(Settings.load(), domain_models("accounts"), log=log)
started = time.perf_counter()
run = engine.run_until_caught_up()
print(json.dumps({"events": run.input_rows, "seconds": time.perf_counter() - started, "handed_over":
                  engine.handed_over, "samples": samples}))
"""


def run_engine(settings: Settings, tree: Path, home: Path, batch: int) -> dict:
    """``PythonProjection`` of the account models until caught up, from the code at ``tree``, in a process of its
    own -> events, seconds, batches handed to Spark, and (batch seconds, RssAnon MiB, RssFile MiB) per batch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTLAKE_")}
    env.update({**security_env(settings), "EVENTLAKE_HOME": str(home), "PYTHONPATH": str(tree),
                "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "EVENTLAKE_TOPIC_PREFIX": settings.topic_prefix,
                "EVENTLAKE_MAX_OFFSETS_PER_TRIGGER": str(batch)})
    done = subprocess.run([sys.executable, "-c", _DRIVER], cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"bench: the engine from {tree} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(figures: dict) -> str:
    """The figures of a run's batches after the first fifth (warm-up and the first read of the tables left out)."""
    samples = figures["samples"][len(figures["samples"]) // 5:]
    if not samples:
        return "no batch"
    seconds, anon, mapped = (sorted(column) for column in zip(*samples))
    return (f"heap (RssAnon) {anon[len(anon) // 2]:,.0f} MiB median, {anon[-1]:,.0f} max; mapped files (RssFile) "
            f"{mapped[-1]:,.0f} MiB max; batch {seconds[len(seconds) // 2]:.2f} s median, {seconds[-1]:.2f} s max "
            f"({len(figures['samples'])} batches, {figures['events'] / figures['seconds']:,.0f} events/s, "
            f"{figures['handed_over']} handed to Spark)")


def engine_memory(args) -> None:
    base = Settings.load(role="admin")
    if base.uses_local_kafka:
        from infra import kafka
        kafka.up(base)
    trees = ([("before", args.before)] if args.before else []) + [("after", ROOT)]
    smallest = min(args.sizes)
    for size in args.sizes:
        records = generated_events(smallest, args.accounts, base.cache_dir / "bench")
        if size > smallest:
            records = continued_copies(records, size // smallest)
        run = uuid.uuid4().hex[:8]
        settings = base.replace(topic_prefix=f"bench-engine-memory-{run}.", home=base.home / "bench" / run)
        with scratch_topics(settings):
            publish(settings, records)
            events = len(records)
            del records
            for name, tree in trees:
                home = settings.home / name
                figures = run_engine(settings, Path(tree), home, args.batch)
                print(f"{events:,} events ({args.accounts:,} accounts), {name}: {summary(figures)}", flush=True)
                if args.json:
                    with open(args.json, "a") as out:
                        out.write(json.dumps({"events": events, "code": name, **figures}) + "\n")
                shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(settings.home, ignore_errors=True)


_STORE = r"""
import json, os, sqlite3, struct, sys, time
import numpy as np
import lmdb
which, keys, batch, folder = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = np.random.default_rng(1)
aggregates = [f"acc-{i:08d}" for i in range(keys // 10)]
def anon():
    return int([l for l in open("/proc/self/status") if l.startswith("RssAnon")][0].split()[1]) / 1024
if which == "lmdb":
    env = lmdb.open(folder + "/index.lmdb", subdir=False, map_size=1 << 40, metasync=False, sync=False,
                    readahead=False)
    def put(hashes, heads):
        with env.begin(write=True) as txn:
            cursor = txn.cursor()
            raw = np.sort(hashes).astype(">u8").tobytes()
            cursor.putmulti([(b"k" + raw[i:i + 8], b"") for i in range(0, len(raw), 8)])
            cursor.putmulti(sorted((b"h" + a.encode(), struct.pack(">Q", v)) for a, v in heads.items()))
    def look(hashes, names):
        with env.begin() as txn:
            cursor = txn.cursor()
            raw = np.sort(hashes).astype(">u8").tobytes()
            found = len(cursor.getmulti([b"k" + raw[i:i + 8] for i in range(0, len(raw), 8)]))
            return found, dict(cursor.getmulti(sorted(b"h" + a.encode() for a in names)))
else:
    con = sqlite3.connect(folder + "/index.sqlite", isolation_level=None)
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "cache_size=-16000"):
        con.execute(f"PRAGMA {pragma}")
    con.execute("CREATE TABLE k(h INTEGER PRIMARY KEY)")
    con.execute("CREATE TABLE hd(a TEXT PRIMARY KEY, v INTEGER) WITHOUT ROWID")
    def put(hashes, heads):
        con.execute("BEGIN")
        con.executemany("INSERT OR IGNORE INTO k VALUES (?)", ((int(h),) for h in np.sort(hashes)))
        con.executemany("INSERT INTO hd VALUES (?, ?) ON CONFLICT(a) DO UPDATE SET v = max(v, excluded.v)",
                        sorted(heads.items()))
        con.execute("COMMIT")
    def look(hashes, names):
        found = con.execute("SELECT count(*) FROM k WHERE h IN (SELECT value FROM json_each(?))",
                            (json.dumps([int(h) for h in hashes]),)).fetchone()[0]
        return found, dict(con.execute("SELECT a, v FROM hd WHERE a IN (SELECT value FROM json_each(?))",
                                       (json.dumps(names),)).fetchall())
started = time.perf_counter()
for at in range(0, keys, 100_000):
    put(rng.integers(-2**63, 2**63 - 1, size=100_000, dtype=np.int64),
        {aggregates[j % len(aggregates)]: at + 1 for j in range(at // 10, at // 10 + 10_000)})
seeded = time.perf_counter() - started
started, rounds = time.perf_counter(), 50
for _ in range(rounds):
    new = rng.integers(-2**63, 2**63 - 1, size=batch, dtype=np.int64)
    names = [aggregates[j] for j in rng.integers(0, len(aggregates), size=batch // 5)]
    look(new, names)
    put(new, {a: keys for a in names})
per_batch = (time.perf_counter() - started) / rounds
size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
print(f"{which}: {keys:,} keys and {len(aggregates):,} heads put in {seeded:.1f} s; a batch of {batch:,} keys and "
      f"{batch // 5:,} heads looked up then written: {per_batch * 1000:.0f} ms; heap (RssAnon) {anon():.0f} MiB; "
      f"{size / 2**20:,.0f} MiB on disk")
"""


def stores(args) -> None:
    for which in ("lmdb", "sqlite"):
        folder = Path(args.dir) / f"engine-index-{which}-{uuid.uuid4().hex[:8]}"
        folder.mkdir(parents=True)
        try:
            subprocess.run([sys.executable, "-c", _STORE, which, str(args.keys), str(args.batch), str(folder)],
                           check=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 1_000_000], help="events in the log")
    parser.add_argument("--accounts", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=20_000, help="records per batch at most")
    parser.add_argument("--before", type=Path, help="a checkout of the code to compare with (run first)")
    parser.add_argument("--json", type=Path, help="also append each run's figures to this file (JSON lines)")
    parser.add_argument("--stores", action="store_true", help="instead: the candidate stores of the index")
    parser.add_argument("--keys", type=int, default=1_000_000, help="with --stores: keys in the index")
    parser.add_argument("--dir", default="/tmp", help="with --stores: where their files go")
    args = parser.parse_args()
    if args.stores:
        stores(args)
    else:
        engine_memory(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
