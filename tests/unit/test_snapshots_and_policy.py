"""Pure parts of the write side: snapshot records, the idempotency window, the policy's commands, CLI input."""
import json
from collections import namedtuple

import pytest

from event_store.account import AccountState
from event_store.envelope import CommandResult
from event_store.decider import event_id_for, execute
from event_store.account.policy import commands_for
from event_store.snapshots import PartitionState, SnapshotWriter, load_snapshot, snapshot_records
from eventlake.cli.common import read_commands
from tests.unit.test_account import cmd, open_cmd

Record = namedtuple("Record", "key value")


def a_partition(accounts=50, results_per_account=5, window=3) -> PartitionState:
    part = PartitionState(1, events_offset=123, results_offset=456, window=window)
    for i in range(accounts):
        aid = f"acc-{i}"
        part.states[("account", aid)] = AccountState(aid, version=i + 1, opened=True, currency="USD", credit_limit_minor=10)
        for j in range(results_per_account):
            part.remember(CommandResult(f"c-{i}-{j}", aid, "accepted", j + 1, (event_id_for("account", aid, j + 1, f"c-{i}-{j}"),),
                                        recorded_at="2026-01-01T00:00:00.000Z"))
            part.event_ids.add(event_id_for("account", aid, j + 1, f"c-{i}-{j}"))
    return part


def test_the_window_keeps_the_first_result_of_the_most_recent_commands():
    part = a_partition(accounts=1, results_per_account=5, window=3)
    assert list(part.results["acc-0"]) == ["c-0-2", "c-0-3", "c-0-4"]  # bounded, oldest dropped
    part.remember(CommandResult("c-0-4", "acc-0", "rejected", 9))  # a later answer never replaces the first
    assert part.first_result("acc-0", "c-0-4").status == "accepted"
    assert part.first_result("acc-0", "c-0-0") is None


def test_the_window_holds_no_objects_for_the_garbage_collector_until_a_result_is_asked_for():
    # Every command adds a result to the window and (once it is full) drops one: what it keeps is young, and each
    # of the handler's collections visits what is young (event_store.collector); results are kept encoded.
    import gc

    part = a_partition(accounts=20, results_per_account=50, window=30)
    kept = [row for recent in part.results.values() for row in recent.values()]
    assert len(kept) == 20 * 30 and not any(gc.is_tracked(row) for row in kept)
    first = part.first_result("acc-3", "c-3-40")
    assert (first.command_id, first.status, first.version, len(first.event_ids)) == ("c-3-40", "accepted", 41, 1)


def test_a_snapshot_round_trips_through_its_records_even_in_several_chunks(monkeypatch):
    import event_store.snapshots as snapshots

    monkeypatch.setattr(snapshots, "_CHUNK_BYTES", 2000)
    part = a_partition()
    records = [Record(k, v) for k, v in snapshot_records(part)]
    assert len(records) > 3 and records[-1].key == b"1"  # chunks, then the manifest
    older = [Record(k, v) for k, v in snapshot_records(a_partition(accounts=60))]
    back = load_snapshot(older + records, 1, window=3)  # the latest manifest wins; stale chunks are ignored
    assert (back.events_offset, back.results_offset) == (123, 456)
    assert back.states == part.states
    assert back.event_ids == part.event_ids and len(back.event_ids) == 250
    assert {a: [back.first_result(a, c) for c in list(r)] for a, r in back.results.items()} == \
        {a: [part.first_result(a, c) for c in list(r)] for a, r in part.results.items()}
    assert load_snapshot(records, 2, window=3) is None


class SnapshotsPartition:
    """A snapshots partition as the handler writes it: each step of a snapshot one transaction (its records,
    then a commit marker taking an offset)."""

    def __init__(self):
        self.records: list = []
        self.next = 0

    def write_step(self, writer: SnapshotWriter, budget=None, commit=True) -> list:
        written = []
        for key, value in writer.step(budget):
            written.append(Logged(key, value, self.next))
            writer.delivered(key, self.next)
            self.next += 1
        self.next += 1  # the commit (or abort) marker
        if commit:
            self.records += written
            writer.step_written()
        return written

    def write(self, part: PartitionState, budget=None) -> list:
        writer = SnapshotWriter(part)
        written = []
        while not writer.done:
            written += self.write_step(writer, budget)
        part.snapshot_written(writer)
        return written

    def read(self, ranges) -> list:
        return [r for start, stop in ranges for r in self.records if start <= r.offset < stop]


Logged = namedtuple("Logged", "key value offset")


def _ids_in(records) -> set:
    import json
    return {i for r in records if b"/ids/" in r.key for ids in json.loads(r.value)["event_ids"] for i in ids}


def test_a_snapshot_writes_only_the_event_ids_added_since_the_last_one(monkeypatch):
    import json
    import event_store.snapshots as snapshots

    monkeypatch.setattr(snapshots, "_CHUNK_BYTES", 2000)
    monkeypatch.setattr(snapshots, "_IDS_PER_ENTRY", 7)
    log = SnapshotsPartition()
    part = a_partition()
    first = log.write(part)
    assert _ids_in(first) == part.event_ids and len(part.event_ids) == 250 and not part.event_ids.unsaved
    part.event_ids.add(next(iter(part.event_ids)))  # already held: not added again
    assert not part.event_ids.unsaved
    part.event_ids.update(f"new-{i}" for i in range(30))
    part.events_offset = 200
    second = log.write(part)
    assert _ids_in(second) == {f"new-{i}" for i in range(30)}  # the first 250 are not written again
    part.event_ids.update(["newer-0"])
    third = log.write(part)
    assert _ids_in(third) == {"newer-0"}
    manifest = json.loads(third[-1].value)
    assert [seg["ids"] for seg in manifest["id_segments"]] == [250, 30, 1]

    # Read back from exactly the ranges the manifest names (what the handler's rebuild reads), and from the
    # whole partition: the same state, every id.
    for records in (log.read(snapshots.segment_ranges(manifest, third[-1].offset)), log.records):
        back = load_snapshot(records, 1, window=3)
        assert back.event_ids == part.event_ids and len(back.event_ids) == 281 and not back.event_ids.unsaved
        assert back.states == part.states and back.events_offset == 200
        assert back.id_segments == part.id_segments
    assert len(log.read(snapshots.segment_ranges(manifest, third[-1].offset))) < len(log.records)

    # A snapshot taken after that load lists the same segments and adds its own.
    back.event_ids.add("after-load")
    fourth = log.write(back)
    assert _ids_in(fourth) == {"after-load"}
    again = load_snapshot(log.read(snapshots.segment_ranges(json.loads(fourth[-1].value), fourth[-1].offset)), 1, 3)
    assert again.event_ids == part.event_ids | {"after-load"}


def test_a_snapshot_with_an_id_segment_missing_is_refused_not_loaded_short(monkeypatch):
    import event_store.snapshots as snapshots
    from event_store.errors import InvalidRecord

    monkeypatch.setattr(snapshots, "_IDS_PER_ENTRY", 7)
    log = SnapshotsPartition()
    part = a_partition()
    log.write(part)
    part.event_ids.update(f"new-{i}" for i in range(30))
    log.write(part)
    without_first_segment = [r for r in log.records if not r.key.startswith(b"1/ids/") or
                             r.key.decode().split("/")[2] != part.id_segments[0]["id"]]
    with pytest.raises(InvalidRecord, match="id segment .* is missing"):
        load_snapshot(without_first_segment, 1, window=3)


def _result(aid, n):
    return CommandResult(f"later-{aid}-{n}", aid, "accepted", 100 + n, (f"e-later-{aid}-{n}",),
                         recorded_at="2026-01-01T00:00:01.000Z")


def test_a_snapshot_written_in_steps_while_the_partition_goes_on_holds_the_cut_it_started_from(monkeypatch):
    import event_store.snapshots as snapshots

    monkeypatch.setattr(snapshots, "_CHUNK_BYTES", 1000)
    monkeypatch.setattr(snapshots, "SEGMENT_IDS", 40)
    log = SnapshotsPartition()
    part = a_partition()  # 50 accounts, 250 ids not yet saved
    part.events_since_snapshot = 250
    at_cut = (dict(part.states), set(part.event_ids), part.events_offset, part.results_offset)
    writer = SnapshotWriter(part)
    steps, later = [], []
    while not writer.done:
        steps.append(log.write_step(writer, budget=3000))
        # Between steps the handler goes on: states change, new results and ids arrive, offsets move.
        n = len(steps)
        aid = f"acc-{n % 50}"
        part.states[("account", aid)] = AccountState(aid, version=1000 + n, opened=True, currency="USD")
        part.states[("account", f"new-{n}")] = AccountState(f"new-{n}", version=1, opened=True)
        result = _result(aid, n)
        later.append(result)
        part.remember(result)
        part.event_ids.add(f"e-later-{aid}-{n}")
        part.events_offset += 2
        part.results_offset += 1
        part.events_since_snapshot += 2
    # Many steps, each of about the budget (a unit of up to one chunk or one id segment more), the manifest alone.
    assert len(steps) > 10 and steps[-1] == [steps[-1][0]] and steps[-1][0].key == b"1"
    assert all(sum(len(r.value) for r in step) < 3000 + 3000 for step in steps[:-1])
    assert [seg["ids"] for seg in writer.segments] == [40] * 6 + [10]
    part.snapshot_written(writer)
    assert part.events_since_snapshot == 2 * (len(steps) - 1) + 2  # the events after the cut count on
    assert set(part.event_ids.unsaved) == {f"e-later-acc-{n % 50}-{n}" for n in range(1, len(steps) + 1)}

    manifest = json.loads(steps[-1][0].value)
    for records in (log.read(snapshots.segment_ranges(manifest, steps[-1][0].offset)), log.records):
        back = load_snapshot(records, 1, window=3)
        assert back.states == at_cut[0] and back.event_ids == at_cut[1]
        assert (back.events_offset, back.results_offset) == at_cut[2:]
        # The window may hold results newer than its offset; the rebuild reads those again: the same window.
        for result in later:
            back.remember(result)
        assert {a: [back.first_result(a, c) for c in r] for a, r in back.results.items()} == \
            {a: [part.first_result(a, c) for c in r] for a, r in part.results.items()}


def test_an_unfinished_snapshot_leaves_the_one_before_whole_and_a_retried_step_is_written_again(monkeypatch):
    import event_store.snapshots as snapshots

    monkeypatch.setattr(snapshots, "_CHUNK_BYTES", 1000)
    log = SnapshotsPartition()
    part = a_partition()
    log.write(part)
    assert part.slot == "a"
    first_states = dict(part.states)
    part.states[("account", "acc-0")] = AccountState("acc-0", version=99, opened=True)
    writer = SnapshotWriter(part)
    assert writer.slot == "b"
    aborted = log.write_step(writer, budget=2000, commit=False)
    again = log.write_step(writer, budget=2000)
    assert [r.key for r in again] == [r.key for r in aborted]  # a step that was not committed is given again
    last = log.write_step(writer, budget=2000)  # ... and then the writer dies: no manifest
    assert not writer.done
    # Its last record says where the latest manifest is: a restart reads that snapshot's own records only.
    manifest_at = json.loads(last[-1].value)["manifest_offset"]
    assert last[-1].key == b"1/latest" and manifest_at == part.manifest_offset
    (manifest,) = log.read([(manifest_at, manifest_at + 1)])
    ranges = snapshots.segment_ranges(json.loads(manifest.value), manifest.offset)
    assert manifest.key == b"1" and len(log.read(ranges)) < len(log.records)
    for records in (log.read(ranges), log.records):  # the same from the whole partition
        back = load_snapshot(records, 1, window=3)
        assert back.states == first_states and back.slot == "a" and back.manifest_offset == manifest_at
    writer = SnapshotWriter(back)  # the next start writes the other slot again
    assert writer.slot == "b"
    log.write(back)
    assert load_snapshot(log.records, 1, window=3).slot == "b"


def test_the_policy_freezes_on_fraud_with_an_id_derived_from_the_event():
    state, events, _ = execute(AccountState("acc-1"), open_cmd())
    _, flagged, _ = execute(state, cmd("FlagFraud", {"payment_id": "p1", "rule": "velocity"}))
    first, again = commands_for(flagged[0]), commands_for(flagged[0])
    assert [c.command_type for c in first] == ["FreezeAccount"]
    assert first[0].command_id == again[0].command_id  # redelivery sends the same command id
    assert first[0].causation_id == flagged[0].event_id and "velocity" in first[0].payload["reason"]
    assert commands_for(events[0]) == []


@pytest.mark.parametrize("text, n", [('{"a": 1}', 1), ('[{"a": 1}, {"b": 2}]', 2), ('{"a": 1}\n\n{"b": 2}\n', 2),
                                     ("", 0)])
def test_submit_reads_an_object_an_array_or_json_lines(text, n):
    assert len(read_commands(text, "x")) == n


def test_submit_names_the_line_that_is_not_json():
    with pytest.raises(SystemExit, match="x line 2 is not JSON"):
        read_commands('{"a": 1}\n{nope\n', "x")


def test_a_partition_is_snapshotted_after_every_events_or_a_quarter_of_what_it_holds():
    from event_store.handler import snapshot_due

    part = PartitionState(0, events_held=1000)
    part.events_since_snapshot = 299
    assert not snapshot_due(part, every=300)
    part.events_since_snapshot = 300
    assert snapshot_due(part, every=300)  # 300 > 1000 / 4: every decides
    part.events_held = 4000  # a quarter is 1,000
    assert not snapshot_due(part, every=300)
    part.events_since_snapshot = 999
    assert not snapshot_due(part, every=300)
    part.events_since_snapshot = 1000
    assert snapshot_due(part, every=300)


def test_a_client_skips_unparsed_only_the_results_that_cannot_answer_its_commands():
    from event_store.client import command_id_needles

    wanted = {"cmd-1", "cmd-2"}
    needles = command_id_needles(wanted)
    answer = CommandResult("cmd-2", "acc-1", "accepted", 3).to_json()
    other = CommandResult("cmd-12", "acc-1", "accepted", 4).to_json()  # holds "cmd-1" as a prefix only
    assert any(n in answer for n in needles) and not any(n in other for n in needles)
    # Ids a result's JSON may write escaped, and too many ids to look for: every record is parsed.
    for escaped in ('say "hi"', "back\\slash", "tab\tin", "café"):
        assert command_id_needles({escaped}) is None
    assert command_id_needles({f"c-{i}" for i in range(17)}) is None
