"""The handler's per-partition state store (event_store.state_store): batches idempotent, state and log positions
committed together, a bounded cache."""
import json
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
                store.write(10, 4, _batch(50), [("acc-1", "c1", b'["c1","accepted"]')], ["forged-1"])
        assert _contents(once) == _contents(twice)
        assert once.positions() == (10, 4) and once.result("acc-1", "c1") == b'["c1","accepted"]'
        assert once.window("acc-1") == twice.window("acc-1") == [("c1", b'["c1","accepted"]')]
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
        assert store.entries() == 40_002  # each state marked for the next snapshot, the positions, the layout
        assert 0 < store.cached_entries() <= bound // (300 + ENTRY_OVERHEAD)
        # The most recently read stay cached.
        assert store.state("account", "acc-19999") is not None


def test_each_partition_has_its_own_store_under_the_home(tmp_path):
    assert store_path(tmp_path, "eventlake.events", 2) == tmp_path / "handler-state" / "eventlake.events-2"
    with StateStore(store_path(tmp_path, "t", 0)) as a, StateStore(store_path(tmp_path, "t", 1)) as b:
        a.write(5, 5, _batch(1))
        assert b.positions() is None and a.size_on_disk() > 0


# PartitionState read through the store (event_store.snapshots.PartitionState.stored) -----------------------------
def _fill(part, accounts: int, results_per_account: int = 4) -> None:
    """The same changes for an in-memory and a stored partition, as the handler makes them after a commit."""
    from event_store.account import AccountState
    from event_store.decider import event_id_for
    from event_store.envelope import CommandResult

    for i in range(accounts):
        aid = f"acc-{i}"
        part.states[("account", aid)] = AccountState(aid, version=i + 1, opened=True, currency="USD",
                                                     credit_limit_minor=10 * i)
        for j in range(results_per_account):
            part.remember(CommandResult(f"c-{i}-{j}", aid, "accepted", j + 1,
                                        (event_id_for("account", aid, j + 1, f"c-{i}-{j}"),),
                                        recorded_at="2026-01-01T00:00:00.000Z"))
    part.event_ids.add("forged-1")
    part.events_offset, part.results_offset = 500, 900


def _answers(part, accounts: int, results_per_account: int = 4) -> list:
    return [(part.state("account", f"acc-{i}"), part.owner_of("device", f"acc-{i}"),
             [part.first_result(f"acc-{i}", f"c-{i}-{j}") for j in range(results_per_account)])
            for i in range(accounts)] + [part.state("account", "never"), part.first_result("never", "c")]


def test_states_beyond_the_cache_bound_are_served_from_disk_with_the_same_answers(tmp_path):
    from event_store.snapshots import PartitionState

    memory = PartitionState(0, window=3)
    _fill(memory, 300)
    bound = 20_000  # a few dozen entries of the 300 accounts' states and windows
    with StateStore(tmp_path / "s", cache_bytes=0) as store:
        part = PartitionState.stored(0, store, window=3, cache_bytes=bound, loaded=PartitionState(0, window=3))
        _fill(part, 300)
        assert part.flush() and not part.states.dirty and not part.results.dirty
        assert store.positions() == (500, 900) and len(part.states) == 300
        assert _answers(part, 300) == _answers(memory, 300)
        assert part.states.cache.held <= bound
        # A restart on the same home: the store as it was written, nothing of the log read.
        again = PartitionState.stored(0, store, window=3, cache_bytes=bound)
        assert (again.events_offset, again.results_offset, len(again.states)) == (500, 900, 300)
        assert again.event_ids == {"forged-1"} and again.event_ids.unsaved == ["forged-1"]
        assert _answers(again, 300) == _answers(memory, 300)
        assert again.states.cache.held <= bound


def test_one_cache_bounds_every_partition_a_handler_holds_and_a_partition_read_anew_drops_its_entries(tmp_path):
    """Issue 42: handler_state_cache_mb bounds the handler, not each partition it owns (12 partitions held 12
    times the setting before)."""
    from event_store.snapshots import PartitionState
    from event_store.stored_state import StateCache

    bound = 20_000
    cache = StateCache(bound)
    with StateStore(tmp_path / "p0", cache_bytes=0) as s0, StateStore(tmp_path / "p1", cache_bytes=0) as s1:
        parts = [PartitionState.stored(p, store, window=3, loaded=PartitionState(p, window=3), cache=cache)
                 for p, store in ((0, s0), (1, s1))]
        for part in parts:
            _fill(part, 300)
            assert part.flush()
        assert 0 < cache.held <= bound and cache.held == sum(cache.held_by.values())
        assert set(cache.held_by) == {0, 1}
        # Partition 1 changes on disk under another owner, then comes back: nothing cached of it is served.
        other = PartitionState.stored(1, s1, window=3, cache_bytes=0)
        other.states[("account", "acc-299")] = other.state("account", "acc-299").__class__(
            "acc-299", version=999, opened=True, currency="USD", credit_limit_minor=0)
        other.events_offset += 1
        assert other.flush()
        again = PartitionState.stored(1, s1, window=3, cache=cache)
        assert 1 not in cache.held_by and again.state("account", "acc-299").version == 999
        assert _answers(parts[0], 300) == _answers(PartitionState.stored(0, s0, window=3, cache_bytes=0), 300)


def test_changes_reach_the_store_only_when_flushed_and_positions_never_go_back(tmp_path):
    from event_store.account import AccountState
    from event_store.snapshots import PartitionState

    with StateStore(tmp_path / "s", cache_bytes=0) as store:
        part = PartitionState.stored(0, store, window=3, cache_bytes=1 << 20, loaded=PartitionState(0, window=3))
        _fill(part, 5)
        part.flush()
        # A batch staged but not flushed (its Kafka transaction aborted, or the process killed): not in the store.
        part.states[("account", "acc-1")] = AccountState("acc-1", version=99, opened=True)
        assert PartitionState.stored(0, store, window=3, cache_bytes=0).state("account", "acc-1").version == 2
        # A newer owner of the partition wrote the store: this (stale) one's flush writes nothing, keeps its changes.
        store.write(600, 900)
        assert not part.flush() and part.states.dirty
        assert PartitionState.stored(0, store, window=3, cache_bytes=0).state("account", "acc-1").version == 2
        part.events_offset = 700
        assert part.flush() and store.positions() == (700, 900)
        assert PartitionState.stored(0, store, window=3, cache_bytes=0).state("account", "acc-1").version == 99


def _forged(account: str, version: int, event_id: str | None = None):
    from event_store.envelope import EventEnvelope

    return EventEnvelope(event_id or f"forged-{account}-{version}", "PaymentAuthorized", 2, "account", account,
                         version, "2026-01-01T09:00:00.000Z", "2026-01-01T09:00:00.000Z", "c", "c", "c",
                         {"payment_id": f"p{version}", "amount_minor": 5, "currency": "USD", "merchant_id": "m",
                          "location": "US-NYC", "merchant_country": "US"})


def test_events_waiting_after_a_gap_are_stored_with_the_positions_and_go_once_folded(tmp_path):
    """A gap never filled (a record written around the handler) must not stop the store from following the log
    (issue 42): the waiting events are written with the positions, read back on open, and dropped once their
    aggregate's committed state passes them."""
    from event_store.account import AccountState
    from event_store.snapshots import PartitionState

    with StateStore(tmp_path / "s", cache_bytes=0) as store:
        part = PartitionState.stored(0, store, window=3, cache_bytes=1 << 20, loaded=PartitionState(0, window=3))
        _fill(part, 5)
        ghost = ("account", "ghost")
        assert part.wait(ghost, _forged("ghost", 5)) and part.wait(ghost, _forged("ghost", 7))
        assert not part.wait(ghost, _forged("ghost", 5, "another"))  # the first read at a version keeps it
        part.events_offset = 40
        assert part.flush() and store.positions()[0] == 40
        again = PartitionState.stored(0, store, window=3, cache_bytes=0)
        assert {v: e.event_id for v, e in again.waiting[ghost].items()} == {5: "forged-ghost-5", 7: "forged-ghost-7"}
        assert again.state("account", "acc-1").version == 2 and not again.waiting_changed
        # The gap below 5 filled and 5 folded: 5 goes, 7 still waits (for 6).
        again.states[ghost] = AccountState("ghost", version=5, opened=True)
        again.events_offset = 50
        assert again.flush()
        assert [(t, a, v) for t, a, v, _ in store.waiting()] == [("account", "ghost", 7)]
        again.states[ghost] = AccountState("ghost", version=8, opened=True)
        again.events_offset = 60
        assert again.flush() and list(store.waiting()) == [] and again.waiting == {}
        assert PartitionState.stored(0, store, window=3, cache_bytes=0).waiting == {}


def test_a_snapshot_of_a_stored_partition_is_the_cut_taken_when_it_starts(tmp_path):
    from event_store.account import AccountState
    from event_store.snapshots import PartitionState, SnapshotWriter, load_snapshot

    memory = PartitionState(0, window=3)
    _fill(memory, 40)
    with StateStore(tmp_path / "s", cache_bytes=0) as store:
        part = PartitionState.stored(0, store, window=3, cache_bytes=4_000, loaded=PartitionState(0, window=3))
        _fill(part, 40)
        part.flush()
        writer = SnapshotWriter(part)
        # The handler goes on while the snapshot is written: later batches are not in it.
        part.states[("account", "acc-3")] = AccountState("acc-3", version=1000, opened=True)
        part.states[("account", "late")] = AccountState("late", version=1, opened=True)
        part.events_offset += 10
        part.flush()
        records, offset = [], 0
        while not writer.done:
            for key, value in writer.step(3000):
                writer.delivered(key, offset)
                records.append(_Record(key, value, offset))
                offset += 1
            offset += 1
            assert writer.step_written()
        back = load_snapshot(records, 0, window=3)
        assert (back.events_offset, back.results_offset) == (500, 900)
        assert back.states == memory.states and back.event_ids == {"forged-1"}
        assert _answers(back, 40) == _answers(memory, 40)
        part.snapshot_written(writer)
        assert json.loads(store.meta())["slot"] == writer.slot  # the next start knows which slot not to write


class _Record:
    def __init__(self, key, value, offset):
        self.key, self.value, self.offset = key, value, offset


def _payment(payment_id: str):
    from types import SimpleNamespace

    return SimpleNamespace(command_type="AuthorizePayment", aggregate_type="account", aggregate_id="acc-1",
                           command_id=f"c-{payment_id}", expected_version=None, issued_at="2026-01-01T00:00:00.000Z",
                           payload={"payment_id": payment_id, "amount_minor": 1, "currency": "USD",
                                    "merchant_id": "m-1", "location": "US-NYC",
                                    "occurred_at": "2026-01-01T00:00:00.000Z"})


def _verdicts(part, payment_ids) -> list:
    """What decide answers to a payment of each id on acc-1, given the state the handler hands it."""
    from event_store.account import decide
    from event_store.domain import CommandRejected

    answers = []
    for payment_id in payment_ids:
        command = _payment(payment_id)
        try:
            answers.append(decide(part.known(command, part.state("account", "acc-1")), command)[0].event_type)
        except CommandRejected as e:
            answers.append(e.error_type)
    return answers


def test_payment_ids_live_in_the_store_index_not_in_the_state_and_duplicates_are_refused_as_before(tmp_path):
    from event_store.account import AccountState, evolve
    from event_store.domain import NewEvent
    from event_store.snapshots import PartitionState, load_snapshot, snapshot_records

    state = AccountState("acc-1", version=1, opened=True, currency="USD", credit_limit_minor=10 ** 9)
    for i in range(60):
        state = evolve(state, NewEvent("PaymentAuthorized", {"payment_id": f"p-{i}", "amount_minor": 1}, "t"))
    asked = ["p-0", "p-59", "p-new", "p-7"]
    memory = PartitionState(0, window=3)
    memory.states[("account", "acc-1")] = state
    expected = _verdicts(memory, asked)
    assert expected == ["DuplicatePayment", "DuplicatePayment", "PaymentAuthorized", "DuplicatePayment"]
    with StateStore(tmp_path / "s", cache_bytes=0) as store:
        part = PartitionState.stored(0, store, window=3, cache_bytes=1 << 20, loaded=PartitionState(0, window=3))
        part.states[("account", "acc-1")] = state
        assert _verdicts(part, asked) == expected  # not flushed yet: the ids are in the state
        part.flush()
        # Stored: the state without its ids (its size does not grow with its payments), each id a key of its own.
        assert b"p-7" not in store.state("account", "acc-1") and store.has_index("account", "acc-1", "p-7")
        assert not part.state("account", "acc-1").payment_ids
        assert _verdicts(part, asked) == expected
        assert _verdicts(PartitionState.stored(0, store, window=3, cache_bytes=0), asked) == expected
        # A payment after the flush is in the state until the next one; both kinds are answered.
        part.states[("account", "acc-1")] = evolve(part.state("account", "acc-1"), NewEvent(
            "PaymentDeclined", {"payment_id": "p-late", "amount_minor": 1}, "t"))
        assert _verdicts(part, ["p-late", "p-3"]) == ["DuplicatePayment"] * 2
        part.flush()
        # The snapshot (the store's cut) carries the index: a fresh home restored from it answers the same.
        records = [_Record(k, v, i) for i, (k, v) in enumerate(snapshot_records(part))]
        assert any(b'"index":' in r.value for r in records)
        with StateStore(tmp_path / "fresh", cache_bytes=0) as fresh:
            restored = PartitionState.stored(0, fresh, window=3, cache_bytes=0,
                                             loaded=load_snapshot(records, 0, window=3))
            assert _verdicts(restored, asked + ["p-late"]) == expected + ["DuplicatePayment"]
            assert b"p-7" not in fresh.state("account", "acc-1")


def test_a_window_is_kept_per_entry_bounded_oldest_first_and_the_first_result_stays(tmp_path):
    with StateStore(tmp_path / "s", cache_bytes=0) as store:
        for i in range(5):
            store.write(i + 1, i + 1, results=[("acc-1", f"c{i}", f'["c{i}",{i}]'.encode())], window=3)
        assert store.window("acc-1") == [(f"c{i}", f'["c{i}",{i}]'.encode()) for i in (2, 3, 4)]
        assert store.result("acc-1", "c1") is None and store.result("acc-1", "c4") == b'["c4",4]'
        entries = store.entries()
        # A later result of a command in the window changes nothing; one more command costs the same keys as
        # the one it pushes out (its entry and its order key), not a rewrite of the window.
        store.write(6, 6, results=[("acc-1", "c3", b'["c3","again"]'), ("acc-2", "x", b'["x"]')], window=3)
        assert store.result("acc-1", "c3") == b'["c3",3]' and store.entries() == entries + 4  # acc-2's 2, head, mark
        store.write(7, 7, results=[("acc-1", "c9", b'["c9"]')], window=3)
        assert store.entries() == entries + 4
        assert [c for c, _ in store.window("acc-1")] == ["c3", "c4", "c9"]
        # The snapshot's cut gives each window whole, oldest first.
        assert [(a, rows) for kind, _, a, rows in store.cut() if kind == "results"] == [
            ("acc-1", [b'["c3",3]', b'["c4",4]', b'["c9"]']), ("acc-2", [b'["x"]'])]


def test_a_store_of_an_older_layout_is_emptied_when_opened(tmp_path):
    import lmdb

    env = lmdb.open(str(tmp_path / "old"))
    with env.begin(write=True) as txn:
        txn.put(b"\x00positions", b"\x00" * 16)
        txn.put(b"racc-1", b"a whole window")
    env.close()
    with StateStore(tmp_path / "old") as store:
        assert store.positions() is None and store.entries() == 1  # its layout's key alone


def test_status_shows_each_partition_store_size_entries_cache_and_positions(tmp_path):
    from event_store.state_store import status_lines

    assert status_lines(tmp_path, "ev") == []
    with StateStore(store_path(tmp_path, "ev", 1)) as store:
        store.write(120, 45, _batch(3), meta=b'{"cached_bytes": 3145728, "aggregates": 3}')
    lines = status_lines(tmp_path, "ev")
    assert len(lines) == 1 and lines[0].startswith("handler state ev[1]: ")
    assert "9 entries (3 aggregates), 3.0 MiB cached, covers events to offset 120, results to 45" in lines[0]


def _write_snapshot(part, records: list) -> object:
    """One snapshot of ``part`` written to ``records`` (offsets following on), its manifest committed."""
    from event_store.snapshots import SnapshotWriter

    writer = SnapshotWriter(part)
    offset = records[-1].offset + 2 if records else 0
    while not writer.done:
        for key, value in writer.step(3000):
            writer.delivered(key, offset)
            records.append(_Record(key, value, offset))
            offset += 1
        offset += 1
        assert writer.step_written()
    part.snapshot_written(writer)
    return writer


def test_an_incremental_snapshot_writes_only_what_changed_and_restores_the_same_state(tmp_path):
    from event_store.account import AccountState, evolve
    from event_store.domain import NewEvent
    from event_store.envelope import CommandResult
    from event_store.snapshots import (MAX_INCREMENTS, PartitionState, load_snapshot, restore_snapshot,
                                       segment_ranges)

    def pay(part, aid, payment_id):
        part.states[("account", aid)] = evolve(part.state("account", aid), NewEvent(
            "PaymentAuthorized", {"payment_id": payment_id, "amount_minor": 1}, "t"))
        part.remember(CommandResult(f"c-{payment_id}", aid, "accepted", 1, (), recorded_at="t"))

    with StateStore(tmp_path / "s", cache_bytes=0) as store:
        part = PartitionState.stored(0, store, window=3, cache_bytes=1 << 20, loaded=PartitionState(0, window=3))
        for i in range(50):
            part.states[("account", f"acc-{i}")] = AccountState(f"acc-{i}", version=1, opened=True, currency="USD",
                                                               credit_limit_minor=10 ** 6)
            pay(part, f"acc-{i}", f"p-{i}-0")
        part.flush()
        records: list = []
        base = _write_snapshot(part, records)
        assert not base.incremental and base.chunks > 0
        base_records = len(records)
        # Two accounts change (a payment each, their windows roll past the bound), then an increment.
        for j in range(1, 5):
            pay(part, "acc-3", f"p-3-{j}")
        pay(part, "acc-7", "p-7-1")
        part.events_offset = 40
        part.flush()
        increment = _write_snapshot(part, records)
        assert increment.incremental and increment.slot == base.slot
        written = b"".join(r.value for r in records[base_records:] if b"/d1/" in r.key)
        assert b'"acc-3"' in written and b'"acc-7"' in written and b'"acc-8"' not in written
        assert len(written) < sum(len(r.value) for r in records[:base_records]) / 5
        # Restored from the topic (only the ranges the manifest names): the same answers as the live state.
        manifest = records[-1]
        wanted = [r for r in records if any(a <= r.offset < b for a, b in
                                            segment_ranges(json.loads(manifest.value), manifest.offset))]
        back = load_snapshot(wanted, 0, window=3)
        assert back.events_offset == 40
        with StateStore(tmp_path / "fresh", cache_bytes=0) as fresh:
            restored = PartitionState.stored(0, fresh, window=3, cache_bytes=0, loaded=back)
            for i in range(50):
                aid = f"acc-{i}"
                assert restored.state("account", aid) == part.state("account", aid)
                assert fresh.window(aid) == store.window(aid)
                assert fresh.has_index("account", aid, f"p-{i}-0")
            assert [c for c, _ in fresh.window("acc-3")] == ["c-p-3-2", "c-p-3-3", "c-p-3-4"]
            assert fresh.has_index("account", "acc-3", "p-3-4") and fresh.has_index("account", "acc-7", "p-7-1")
        # Restored straight into a store (what a handler does: memory of a batch, not of the partition).
        with StateStore(tmp_path / "direct", cache_bytes=0) as direct:
            direct.write(1, 1, _batch(3))  # whatever was there goes
            head = restore_snapshot(wanted, 0, 3, direct)
            assert direct.positions() == (40, part.results_offset) and head.slot == base.slot
            again = PartitionState.stored(0, direct, window=3, cache_bytes=0)
            for i in range(50):
                aid = f"acc-{i}"
                assert again.state("account", aid) == part.state("account", aid)
                assert direct.window(aid) == store.window(aid)
                assert direct.has_index("account", aid, f"p-{i}-0")
            assert direct.has_index("account", "acc-3", "p-3-4") and _verdicts(again, ["p-1-0", "new"]) == [
                "DuplicatePayment", "PaymentAuthorized"]
        # Nothing changed: an empty increment; after MAX_INCREMENTS of them, a full base in the other slot.
        for _ in range(MAX_INCREMENTS - 1):
            assert _write_snapshot(part, records).incremental
        again = _write_snapshot(part, records)
        assert not again.incremental and again.slot != base.slot


def test_every_snapshot_holds_the_events_waiting_after_a_gap_as_they_were_when_it_started(tmp_path):
    """A handler that never held the partition restores the waiting events too (its positions pass them): from a
    base, from an increment (each snapshot lists them all, so an earlier part's list is not taken), in memory
    (load_snapshot) and straight into a store (restore_snapshot)."""
    from event_store.account import AccountState
    from event_store.snapshots import PartitionState, load_snapshot, restore_snapshot

    def waiting_of(part):
        return {key: {v: e.event_id for v, e in events.items()} for key, events in part.waiting.items()}

    with StateStore(tmp_path / "s", cache_bytes=0) as store:
        part = PartitionState.stored(0, store, window=3, cache_bytes=1 << 20, loaded=PartitionState(0, window=3))
        _fill(part, 5)
        part.wait(("account", "ghost"), _forged("ghost", 5))
        part.wait(("account", "acc-1"), _forged("acc-1", 4))  # acc-1 is at 2: waits for 3
        part.events_offset = 30
        part.flush()
        records: list = []
        assert not _write_snapshot(part, records).incremental
        expected = {("account", "ghost"): {5: "forged-ghost-5"}, ("account", "acc-1"): {4: "forged-acc-1-4"}}
        assert waiting_of(load_snapshot(records, 0, window=3)) == expected
        # acc-1's gap filled and its waiting event folded; the increment's list replaces the base's.
        part.states[("account", "acc-1")] = AccountState("acc-1", version=4, opened=True)
        part.events_offset = 35
        part.flush()
        assert _write_snapshot(part, records).incremental
        expected = {("account", "ghost"): {5: "forged-ghost-5"}}
        back = load_snapshot(records, 0, window=3)
        assert waiting_of(back) == expected and back.state("account", "acc-1").version == 4
        with StateStore(tmp_path / "direct", cache_bytes=0) as direct:
            restore_snapshot(records, 0, 3, direct)
            assert waiting_of(PartitionState.stored(0, direct, window=3, cache_bytes=0)) == expected
        with StateStore(tmp_path / "fresh", cache_bytes=0) as fresh:  # a loaded state written into a store
            assert waiting_of(PartitionState.stored(0, fresh, window=3, cache_bytes=0, loaded=back)) == expected
            assert waiting_of(PartitionState.stored(0, fresh, window=3, cache_bytes=0)) == expected


def test_the_pages_lmdb_copies_for_a_large_write_are_not_held_after_it(tmp_path):
    # LMDB keeps a malloc'd copy of every page a write transaction changed until its environment closes (the
    # store renews it after each write): a write touching ~20,000 pages would otherwise hold ~80 MB for good.
    script = textwrap.dedent(f"""
        import ctypes, random
        from event_store.state_store import StateStore

        class Info(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks "
                                                       "fordblks keepcost".split()]
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = Info
        with StateStore({str(tmp_path / "big")!r}, cache_bytes=0) as store:
            state = b"x" * 200
            store.restore({{("account", f"acc-{{i:07d}}"): state for i in range(300_000)}}, [], {{}}, 100)
            before = libc.mallinfo2().uordblks
            chosen = random.Random(3).sample(range(300_000), 20_000)
            store.write(1, 1, {{("account", f"acc-{{i:07d}}"): b"y" * 200 for i in chosen}}, mark=False)
            print((libc.mallinfo2().uordblks - before) >> 20)
    """)
    held_mib = int(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                  cwd=ROOT).stdout)
    assert held_mib < 10, held_mib
