"""The handler's per-partition state store (event_store.state_store): batches idempotent, state and log positions
committed together, a bounded cache."""
import subprocess
import sys
import textwrap
from pathlib import Path

from event_store.state_store import ENTRY_OVERHEAD, StateStore, store_path

ROOT = Path(__file__).resolve().parents[2]


def _batch(n: int, tag: str = "v") -> dict:
    return {("account", f"acc-{i}"): f'{{"version":{i},"tag":"{tag}"}}'.encode() for i in range(n)}


def _contents(store: StateStore) -> tuple:
    return store.positions(), list(store.states()), store.entries()


def test_a_batch_written_twice_leaves_the_store_as_written_once(tmp_path):
    with StateStore(tmp_path / "once") as once, StateStore(tmp_path / "twice") as twice:
        for store, times in ((once, 1), (twice, 2)):
            for _ in range(times):
                store.write(10, 4, _batch(50), {"acc-1": b'[["c1","accepted"]]'}, ["forged-1"])
        assert _contents(once) == _contents(twice)
        assert once.positions() == (10, 4) and once.results("acc-1") == b'[["c1","accepted"]]'
        assert once.has_event_id("forged-1") and not once.has_event_id("forged-2")


def test_a_reopened_store_reads_what_was_committed(tmp_path):
    with StateStore(tmp_path / "s") as store:
        assert store.positions() is None and store.state("account", "acc-1") is None
        store.write(7, 3, _batch(3))
    with StateStore(tmp_path / "s", cache_bytes=0) as store:
        assert store.positions() == (7, 3)
        assert store.state("account", "acc-2") == b'{"version":2,"tag":"v"}'
        assert [(t, a) for t, a, _ in store.states()] == [("account", f"acc-{i}") for i in range(3)]


def test_a_process_killed_mid_transaction_leaves_the_previous_state_and_position(tmp_path):
    path = tmp_path / "s"
    with StateStore(path) as store:
        store.write(100, 50, _batch(20, "before"))
    # A second process opens the store, puts a batch and new positions in a write transaction, and is killed
    # (SIGKILL) before the commit.
    child = textwrap.dedent(f"""
        import os, signal, struct, sys
        sys.path.insert(0, {str(ROOT)!r})
        from event_store import state_store as ss
        store = ss.StateStore({str(path)!r})
        txn = store._env.begin(write=True)
        for i in range(20):
            txn.put(ss._state_key("account", f"acc-{{i}}"), b"after")
        txn.put(ss._POSITIONS, struct.pack(">qq", 200, 90))
        print("in transaction", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    run = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert run.returncode == -9 and "in transaction" in run.stdout, run.stderr
    with StateStore(path) as store:
        assert store.positions() == (100, 50)
        assert all(value.endswith(b'"before"}') for _, _, value in store.states())
        store.write(200, 90, _batch(20, "after"))  # the writer's lock is free again
        assert store.positions() == (200, 90)


def test_a_failed_write_changes_nothing(tmp_path):
    with StateStore(tmp_path / "s") as store:
        store.write(1, 1, _batch(2))
        try:
            store.write(2, 2, {("account", "acc-0"): b"new", ("account", "x" * 1000): b"too long a key"})
        except Exception:  # noqa: BLE001 -- LMDB refuses keys over 511 bytes
            pass
        else:
            raise AssertionError("a key over LMDB's limit was accepted")
        assert store.positions() == (1, 1) and store.state("account", "acc-0") == b'{"version":0,"tag":"v"}'


def test_the_cache_stays_under_its_bound_with_many_keys(tmp_path):
    bound = 64 * 1024
    with StateStore(tmp_path / "s", cache_bytes=bound) as store:
        for start in range(0, 20_000, 1000):
            store.write(start, start, {("account", f"acc-{i}"): b"x" * 300 for i in range(start, start + 1000)})
            assert store.cached_bytes() <= bound
        for i in range(0, 20_000, 7):
            assert store.state("account", f"acc-{i}") == b"x" * 300
            assert store.cached_bytes() <= bound
        assert store.entries() == 20_001
        assert 0 < store.cached_entries() <= bound // (300 + ENTRY_OVERHEAD)
        # The most recently read stay cached.
        assert store.state("account", "acc-19999") is not None


def test_each_partition_has_its_own_store_under_the_home(tmp_path):
    assert store_path(tmp_path, "eventlake.events", 2) == tmp_path / "handler-state" / "eventlake.events-2"
    with StateStore(store_path(tmp_path, "t", 0)) as a, StateStore(store_path(tmp_path, "t", 1)) as b:
        a.write(5, 5, _batch(1))
        assert b.positions() is None and a.size_on_disk() > 0
