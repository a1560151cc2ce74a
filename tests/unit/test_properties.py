"""Property-based tests of the sequence rule (read_models.sequence) over generated logs, no Kafka or Spark.

Whatever Kafka may do to a log within its rules (duplicates, replays of a slice, any interleaving of
partitions that keeps each partition's order), the read models apply the same events; forged records written
around the command handler change what is admitted only as the rule says (the first event at a version takes
it; nothing after a gap), never differently for another interleaving, another batch split or another reader:
every read model's fold, the cross-model agreement and the command handler's rebuild follow the same rule.
Profiles (tests/conftest.py): HYPOTHESIS_PROFILE=thorough runs many more examples.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from types import SimpleNamespace

import pyarrow as pa
from hypothesis import given, note
from hypothesis import strategies as st

import read_models
from event_store.account import AccountState, evolve
from event_store.partition_rebuild import PartitionRebuilder
from event_store.snapshots import PartitionState
from eventlake.generator import GeneratorConfig
from expectations.account.payments_match_account_summary import compare_payments_with_summary
from lakehouse.settings import Settings
from read_models.sequence import sequence
from tests.domain_helpers import events_for
from tests.log_strategies import forged, interleavings, logs, short


def _ids(events) -> list[str]:
    return [e.event_id for e in events]


def _outcome(log) -> tuple:
    """What the rule decides, comparable across orders: admitted (in its own order), conflicts, waiting."""
    s = sequence(log)
    return (_ids(s.admitted), sorted((c[0].event_id, c[1]) for c in s.conflicts), sorted(_ids(s.waiting)))


def _folds(events) -> dict:
    return {m.name: m.python_fold(events) for m in read_models.select(None)}


def _states(events) -> dict[str, AccountState]:
    """Each account's state after its events (taken as given: in version order)."""
    states: dict[str, AccountState] = {}
    for e in events:
        states[e.aggregate_id] = evolve(states.get(e.aggregate_id) or AccountState(e.aggregate_id), e)
    return states


def _handler_rebuild(partitions) -> dict[str, AccountState]:
    """The command handler's rebuild of every partition (PartitionRebuilder.apply_logged, record by record in
    the partition's order), without Kafka: the rebuilder is built, never opened."""
    rebuilder = PartitionRebuilder(Settings.load({}), log=lambda *_: None)
    accounts: dict[str, AccountState] = {}
    for p, records in enumerate(partitions):
        part = PartitionState(p)
        for offset, e in enumerate(records):
            rebuilder.apply_logged(part, e, SimpleNamespace(topic="events", offset=offset))
        states = {aggregate_id: state for (_, aggregate_id), state in part.states.items()}
        assert not accounts.keys() & states.keys(), "an account in two partitions"
        accounts.update(states)
    return accounts


# (a) -------------------------------------------------------------------------------------------------------
@given(logs())
def test_duplicates_replays_and_interleavings_admit_exactly_the_clean_log(log):
    admitted = sequence(log.merged)
    got, clean = _ids(admitted.admitted), _ids(sequence(log.clean).admitted)
    assert got == clean, f"admitted {len(got)} events, the clean log has {len(clean)}; admitted: " \
                         f"{[short(e) for e in admitted.admitted]}"
    assert sorted(got) == sorted(_ids(log.clean))
    assert admitted.conflicts == [] and admitted.waiting == [], (
        [short(c[0]) for c in admitted.conflicts], [short(e) for e in admitted.waiting])


@given(logs(forge=True), st.data())
def test_what_is_admitted_does_not_depend_on_how_the_partitions_interleave(log, data):
    other = data.draw(interleavings(log.partitions), label="another interleaving")
    one_after_another = [e for p in log.partitions for e in p]
    assert _outcome(log.merged) == _outcome(other) == _outcome(one_after_another)


# (b) -------------------------------------------------------------------------------------------------------
@given(logs())
def test_every_read_model_folds_the_transformed_log_as_the_clean_one(log):
    assert _folds(sequence(log.merged).admitted) == _folds(log.clean)


@given(logs(forge=True), st.data())
def test_every_read_model_folds_the_same_whatever_the_interleaving_and_the_models_agree(log, data):
    other = data.draw(interleavings(log.partitions), label="another interleaving")
    folds = _folds(sequence(log.merged).admitted)
    assert folds == _folds(sequence(other).admitted)
    # The cross-model expectation (expectations/account/payments_match_account_summary.py) holds between the folds: no model counts a
    # payment another one ignores.
    keys, differing, lines = compare_payments_with_summary(
        pa.Table.from_pylist(list(folds["account_summary"].values())),
        pa.Table.from_pylist(list(folds["payments"].values()),
                             schema=pa.schema([("account_id", pa.string()), ("status", pa.string()),
                                               ("amount_minor", pa.int64())])))
    assert differing == 0, lines


# (c) -------------------------------------------------------------------------------------------------------
# read_models.sequence has no carried state to apply batch by batch (spark_apps.sequence carries it in its
# ledger); what batch-by-batch admission rests on is checked instead: the rule is monotone in the log. What a
# prefix (the batches so far) admits or finds in conflict stays so whatever follows, and each event is decided
# by the first batch that holds it and its predecessors.
@given(logs(forge=True), st.data())
def test_a_prefix_of_the_log_decides_nothing_the_rest_reverses(log, data):
    full = sequence(log.merged)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(log.merged)), max_size=4), label="batch boundaries"))
    full_admitted = _ids(full.admitted)
    full_conflicts = {(c[0].event_id, c[1]) for c in full.conflicts}
    admitted_before: set[str] = set()
    for cut in cuts + [len(log.merged)]:
        prefix = sequence(log.merged[:cut])
        note(f"batches end at {cut}")
        assert set(_ids(prefix.admitted)) <= set(full_admitted)
        assert {(c[0].event_id, c[1]) for c in prefix.conflicts} <= full_conflicts
        assert admitted_before <= set(_ids(prefix.admitted))
        admitted_before = set(_ids(prefix.admitted))
    assert admitted_before == set(full_admitted)


# (d) -------------------------------------------------------------------------------------------------------
@given(logs())
def test_the_handlers_rebuild_of_a_transformed_log_gives_the_clean_logs_accounts(log):
    assert _handler_rebuild(log.partitions) == _states(log.clean)


@given(logs(forge=True))
def test_the_handlers_rebuild_folds_the_events_the_read_models_apply(log):
    """The write side's idea of each account is the read side's: the same versions, the same events."""
    by_account = defaultdict(list)
    for e in sequence(log.merged).admitted:
        by_account[e.aggregate_id].append(e)
    assert _handler_rebuild(log.partitions) == _states(e for events in by_account.values() for e in events)


# Examples the properties found ---------------------------------------------------------------------------------
def test_an_event_id_repeated_at_a_version_no_other_event_holds_counts_once():
    """A record that repeats an event id under another version is a duplicate of the first record with that
    id (it used to raise KeyError, taking the reconciliation down with it)."""
    clean = events_for(GeneratorConfig(accounts=1, commands=6, seed=1, run_id="prop"))
    repeat = dataclasses.replace(clean[1], aggregate_version=len(clean) + 2)
    admitted = sequence(clean + [repeat])
    assert _ids(admitted.admitted) == _ids(clean) and admitted.conflicts == [] and admitted.waiting == []


def test_the_rule_reads_a_generator_like_a_list():
    clean = events_for(GeneratorConfig(accounts=1, commands=6, seed=1, run_id="prop"))
    log = clean + [forged(clean[2], "forged-conflict")]
    assert _outcome(iter(log)) == _outcome(log) and _outcome(log)[1] == [("forged-conflict", clean[2].event_id)]


def test_a_record_repeating_an_event_id_under_the_next_version_counts_nowhere_on_either_side():
    clean = events_for(GeneratorConfig(accounts=1, commands=6, seed=1, run_id="prop"))
    repeat = dataclasses.replace(clean[1], aggregate_version=clean[-1].aggregate_version + 1)
    log = clean + [repeat]
    assert _ids(sequence(log).admitted) == _ids(clean)
    assert _handler_rebuild([log]) == _states(sequence(log).admitted) == _states(clean)


def test_a_repeat_of_an_event_id_from_before_a_snapshot_is_caught_after_a_restart_from_it():
    """Rebuilt from a snapshot plus the records after it, a record repeating an id from before the snapshot
    still counts nowhere (its id is the derivation of a version the snapshot's state holds: no id kept)."""
    from collections import namedtuple

    from event_store.snapshots import load_snapshot, snapshot_records

    Record = namedtuple("Record", "key value")
    clean = events_for(GeneratorConfig(accounts=1, commands=6, seed=1, run_id="prop"))
    rebuilder = PartitionRebuilder(Settings.load({}), log=lambda *_: None)
    part = PartitionState(0)
    for offset, e in enumerate(clean):
        rebuilder.apply_logged(part, e, SimpleNamespace(topic="events", offset=offset))
    restored = load_snapshot([Record(k, v) for k, v in snapshot_records(part)], 0, 100)
    assert restored.event_ids == set() and restored.states == part.states  # the clean log's ids are derived
    repeat = dataclasses.replace(clean[1], aggregate_version=clean[-1].aggregate_version + 1)
    rebuilder.apply_logged(restored, repeat, SimpleNamespace(topic="events", offset=len(clean)))
    assert {aid: s for (_, aid), s in restored.states.items()} == _states(clean)


def test_a_snapshot_without_the_event_ids_is_not_loaded():
    """A snapshot of the earlier layout cannot tell which ids the log holds: the partition is read whole."""
    import json
    from collections import namedtuple

    from event_store.snapshots import load_snapshot, snapshot_records

    Record = namedtuple("Record", "key value")
    records = [Record(k, v) for k, v in snapshot_records(PartitionState(0))]
    manifest = json.loads(records[-1].value)
    del manifest["format"]
    assert load_snapshot(records, 0, 100) is not None
    assert load_snapshot(records[:-1] + [Record(records[-1].key, json.dumps(manifest).encode())], 0, 100) is None
