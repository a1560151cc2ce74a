"""The candidate embedded stores for the command handler's per-partition state, on its access pattern.

Prints figures; it is not a test. Issue 42 moves the handler's state (aggregate states, idempotency windows, the
log positions they cover) from memory to an embedded on-disk store per partition. A handler batch reads the
state and the result window of each aggregate its commands name (random keys over all the aggregates), then
writes the changed ones and the partition's two log positions in ONE atomic transaction (so a restart sees a state
and the position it covers, never one without the other). Both candidates are run on that pattern, side by side:

- ``lmdb`` (PyPI's binding of LMDB: a copy-on-write B+tree in one memory-mapped file, one writer);
- SQLite in WAL mode (the standard library's ``sqlite3``; one ``WITHOUT ROWID`` table, key -> blob).

Each store is seeded with ``--aggregates`` aggregates (a state of ~200 bytes and a window of ~500 bytes each),
then ``--batches`` batches of ``--batch`` random aggregates are read and written back. Two durabilities each:
``durable`` (fsync at every commit: survives a power loss) and ``crash-safe`` (no fsync: survives a kill -9 of
the process, which is what the handler needs, since Kafka is its source of truth and the tail after the stored
position is replayed; an OS crash may lose the last commits, never the store's consistency: LMDB ``metasync``
off / SQLite WAL ``synchronous=NORMAL``).

    .venv/bin/python bench/state_store.py [--aggregates 1000000] [--batch 500] [--batches 400] [--dir /tmp/x]
    .venv/bin/python bench/state_store.py --handler-memory [--accounts 100000] [--payments 50]

``--handler-memory`` measures the handler's own state layer (``PartitionState.stored`` over a ``StateStore``)
with ``--accounts`` accounts of ``--payments`` payments each, with the payment ids in the account's state (as
before issue 42's point 1: the account domain without its index) and in the store's index (after), each in a
process of its own: RSS after loading them all (64 MiB cache), the store's size on disk, the bytes one more
payment per account writes, and a restart: opening the store to the first command decided. Measured here
(100,000 x 50, 2 shared cores, busy): ids in the state RSS +201 MiB, 394 MiB on disk, one payment on 10k
accounts 12.05 s, restart to a decided command 16 ms; ids in the store's index RSS +129 MiB, 597 MiB on disk (a
key per id), 1.72 s, 1 ms.

Measured here (2 shared cores, ``--aggregates 1000000 --batches 200``, crash-safe): LMDB 22.0 batches/s (11.0k
aggregates read and written per second), 216k random reads/s, 1,036 MiB on disk; SQLite WAL 13.6 batches/s (6.8k
aggregates/s), 7.5k random reads/s, 825 MiB. LMDB is chosen: 1.6x the batch rate and ~30x the random reads
(a read is a lookup in the OS page cache, no copy into a cache of SQLite's own, so the handler's bounded cache
sits in front of the kernel's), one file per partition, readers never block the writer.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import struct
import tempfile
import time
from pathlib import Path

import lmdb

POSITIONS = b"\x00positions"  # the log positions' key: sorts before every aggregate key


def _key(kind: bytes, i: int) -> bytes:
    return kind + b"acc-%08d" % i


def _value(rng: random.Random, size: int) -> bytes:
    return rng.randbytes(size // 2).hex().encode()[:size]


class LmdbStore:
    name = "lmdb"

    def __init__(self, path: Path, durable: bool):
        self.env = lmdb.open(str(path), map_size=64 << 30, subdir=True, max_dbs=0, sync=durable,
                             metasync=durable, readahead=False, lock=True)

    def seed(self, items) -> None:
        with self.env.begin(write=True) as txn:
            for key, value in items:
                txn.put(key, value, append=False)

    def batch(self, keys: list[bytes], new_value, positions: bytes) -> int:
        with self.env.begin(write=True) as txn:  # reads and writes in the one write transaction
            got = [txn.get(k) for k in keys]
            for k, v in zip(keys, got):
                txn.put(k, new_value(v))
            txn.put(POSITIONS, positions)
        return len(got)

    def read_only(self, keys: list[bytes]) -> int:
        with self.env.begin() as txn:
            return sum(txn.get(k) is not None for k in keys)

    def close(self) -> None:
        self.env.close()


class SqliteStore:
    name = "sqlite-wal"

    def __init__(self, path: Path, durable: bool):
        path.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path / "state.sqlite", isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        self.db.execute("PRAGMA cache_size=-65536")  # 64 MiB, as a bounded cache would be
        self.db.execute("CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")

    def seed(self, items) -> None:
        self.db.execute("BEGIN")
        self.db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)", items)
        self.db.execute("COMMIT")

    def batch(self, keys: list[bytes], new_value, positions: bytes) -> int:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        got = {}
        for i in range(0, len(keys), 500):  # SQLite's default bound on variables per statement is 32766
            part = keys[i:i + 500]
            got.update(db.execute(f"SELECT k, v FROM kv WHERE k IN ({','.join('?' * len(part))})", part))
        db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)", [(k, new_value(got.get(k))) for k in keys]
                       + [(POSITIONS, positions)])
        db.execute("COMMIT")
        return len(got)

    def read_only(self, keys: list[bytes]) -> int:
        got = 0
        for i in range(0, len(keys), 500):
            part = keys[i:i + 500]
            got += len(self.db.execute(f"SELECT k FROM kv WHERE k IN ({','.join('?' * len(part))})", part)
                        .fetchall())
        return got

    def close(self) -> None:
        self.db.close()


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run(store_cls, durable: bool, args, root: Path) -> dict:
    path = root / f"{store_cls.name}-{'durable' if durable else 'crashsafe'}"
    shutil.rmtree(path, ignore_errors=True)
    rng = random.Random(42)
    store = store_cls(path, durable)
    t = time.perf_counter()
    chunk = 100_000
    for start in range(0, args.aggregates, chunk):
        stop = min(start + chunk, args.aggregates)
        store.seed([(_key(kind, i), _value(rng, size)) for i in range(start, stop)
                    for kind, size in ((b"s/", 200), (b"r/", 500))])
    seed_s = time.perf_counter() - t
    ids = [rng.randrange(args.aggregates) for _ in range(args.batch * args.batches)]

    def new_value(old: bytes | None) -> bytes:
        return (old or b"")[:-8] + struct.pack(">Q", rng.getrandbits(63))

    t = time.perf_counter()
    for b in range(args.batches):
        keys = [_key(kind, i) for i in ids[b * args.batch:(b + 1) * args.batch] for kind in (b"s/", b"r/")]
        store.batch(keys, new_value, struct.pack(">QQ", b, b))
    batch_s = time.perf_counter() - t
    t = time.perf_counter()
    for b in range(args.batches):
        store.read_only([_key(b"s/", i) for i in ids[b * args.batch:(b + 1) * args.batch]])
    read_s = time.perf_counter() - t
    store.close()
    size = _du(path)
    shutil.rmtree(path, ignore_errors=True)
    aggregates = args.batch * args.batches
    return {"store": store_cls.name, "mode": "durable" if durable else "crash-safe", "seed_s": seed_s,
            "batches_per_s": args.batches / batch_s, "aggregates_per_s": aggregates / batch_s,
            "reads_per_s": aggregates / read_s, "mib": size / 2**20}


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def handler_memory(accounts: int, payments: int, with_index: bool, root: Path) -> dict:
    """One run of ``--handler-memory`` (module docstring), in this process."""
    import dataclasses
    import gc

    from immutables import Map

    from event_store.account import AccountState
    from event_store.account import decide as decide_account
    from event_store.domains import DOMAINS
    from event_store.snapshots import PartitionState
    from event_store.state_store import StateStore

    if not with_index:  # the account as before point 1: every payment id in its state, rewritten with it
        DOMAINS["account"] = dataclasses.replace(DOMAINS["account"], index_split=None, index_probe=None,
                                                 index_known=None)
    path = root / ("with-index" if with_index else "in-state")
    shutil.rmtree(path, ignore_errors=True)
    rss_start = _rss_mib()
    store = StateStore(path, cache_bytes=0)
    part = PartitionState.stored(0, store, window=100, cache_bytes=64 << 20, loaded=PartitionState(0))
    started = time.perf_counter()
    for start in range(0, accounts, 2_000):
        for a in range(start, min(start + 2_000, accounts)):
            aid = f"acc-{a:07d}"
            part.states[("account", aid)] = AccountState(
                aid, version=payments + 1, opened=True, currency="USD", credit_limit_minor=10 ** 12,
                payments_authorized=payments, authorized_total_minor=payments,
                payment_ids=Map((f"pay-{aid}-{i:05d}", None) for i in range(payments)))
        part.events_offset += 2_000
        part.flush()
    load_s = time.perf_counter() - started
    gc.collect()
    rss = _rss_mib() - rss_start
    size = _du(path)
    # One more payment on 10k accounts: what a batch of payments writes.
    before_write = size
    started = time.perf_counter()
    for a in range(0, min(accounts, 10_000)):
        key = ("account", f"acc-{a:07d}")
        state = part.state(*key)
        part.states[key] = dataclasses.replace(state, version=state.version + 1,
                                               payment_ids=state.payment_ids.set(f"new-{a}", None))
    part.events_offset += 10_000
    part.flush()
    write_s = time.perf_counter() - started
    store.close()
    # A restart: the store opened again and one payment decided (a DuplicatePayment: the index is read).
    started = time.perf_counter()
    store = StateStore(path, cache_bytes=0)
    again = PartitionState.stored(0, store, window=100, cache_bytes=64 << 20)
    command = argparse.Namespace(command_type="AuthorizePayment", aggregate_type="account", aggregate_id="acc-0000007",
                                 payload={"payment_id": "pay-acc-0000007-00003", "currency": "USD"})
    try:
        decide_account(again.known(command, again.state("account", "acc-0000007")), command)
        verdict = "accepted"
    except Exception as e:  # noqa: BLE001 -- the verdict is printed
        verdict = getattr(e, "error_type", repr(e))
    restart_s = time.perf_counter() - started
    store.close()
    return {"mode": "ids in the store's index" if with_index else "ids in the state", "rss_mib": rss,
            "disk_mib": size / 2**20, "load_s": load_s, "write_mib_per_10k_payments": (_du(path) - before_write) / 2**20,
            "write_s_per_10k": write_s, "restart_s": restart_s, "verdict": verdict}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--handler-memory", choices=("both", "in-state", "with-index"), nargs="?", const="both",
                    default=None, help="measure the handler's state layer before/after issue 42's point 1")
    ap.add_argument("--accounts", type=int, default=100_000)
    ap.add_argument("--payments", type=int, default=50)
    ap.add_argument("--aggregates", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=500, help="aggregates per handler batch")
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--dir", default=None, help="where the stores are written (default: a temp dir)")
    ap.add_argument("--durable", action="store_true", help="also run with an fsync at every commit")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="state-store-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    if args.handler_memory in ("in-state", "with-index"):
        print(json.dumps(handler_memory(args.accounts, args.payments, args.handler_memory == "with-index", root)))
        return
    if args.handler_memory == "both":
        import subprocess
        import sys

        print(f"{args.accounts:,} accounts x {args.payments} payments, each mode in a process of its own:")
        for mode in ("in-state", "with-index"):
            out = subprocess.run([sys.executable, __file__, "--handler-memory", mode, "--accounts",
                                  str(args.accounts), "--payments", str(args.payments), "--dir", str(root)],
                                 capture_output=True, text=True, check=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(f"  {r['mode']:<26} RSS +{r['rss_mib']:6.0f} MiB  {r['disk_mib']:6.0f} MiB on disk  loaded in "
                  f"{r['load_s']:5.1f}s  one payment on 10k accounts: {r['write_s_per_10k']:.2f}s, store "
                  f"+{r['write_mib_per_10k_payments']:.1f} MiB  restart to a decided command {r['restart_s'] * 1000:.0f}"
                  f" ms ({r['verdict']})", flush=True)
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
        return
    print(f"{args.aggregates:,} aggregates (state ~200 B + window ~500 B each), batches of {args.batch} random "
          f"aggregates read then written with the log positions in one transaction, {args.batches} batches; "
          f"in {root} ({os.cpu_count()} CPUs)")
    rows = []
    for durable in ([False, True] if args.durable else [False]):
        for cls in (LmdbStore, SqliteStore):
            rows.append(run(cls, durable, args, root))
            r = rows[-1]
            print(f"  {r['store']:<11} {r['mode']:<10} seeded in {r['seed_s']:6.1f}s  {r['batches_per_s']:8.1f} "
                  f"batches/s  {r['aggregates_per_s']:10,.0f} aggregates/s (read+write)  {r['reads_per_s']:10,.0f} "
                  f"reads/s (read only)  {r['mib']:7.0f} MiB on disk", flush=True)
    print()
    print("| store | mode | batches/s | aggregates/s read+written | reads/s | MiB on disk |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['store']} | {r['mode']} | {r['batches_per_s']:.1f} | {r['aggregates_per_s']:,.0f} | "
              f"{r['reads_per_s']:,.0f} | {r['mib']:.0f} |")
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
