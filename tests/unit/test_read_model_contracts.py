"""Contracts every registry entry keeps, parametrised by the registries themselves, so that a read model, an
aggregate or an expectation suite is tested the moment it is registered (pyeventsourcing's abstract test cases):

- read models (``read_models.REGISTRY``): the table the fold gives (``fold_sql`` in DuckDB, through
  ``merge_insert``) has exactly the schema's columns, and the oracle's rows name only them; the oracle folds some
  of a small generated log of every domain; a batch applied twice equals once (the plain-Python fold); ``fold_sql``
  agrees with the oracle; merging the fold of a second batch into the first's table gives the fold of both;
- aggregates (``event_store.domains.DOMAINS``): every state ``decide``/``evolve`` reach on the generated commands
  round-trips its snapshot encoding (through JSON), and a state decoded from a snapshot decides the next commands
  as the live one does;
- expectation suites (``expectations.SUITES``): one per read model (that each names only its table's columns is
  ``tests/unit/test_expectations.py``'s, over the same registry).

No Kafka and no Spark (the schema is a pyspark StructType, built without a JVM). That both engines give the same
rows for every model is ``tests/integration/test_engine_contracts.py``'s (slow: broker and Spark)."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

import expectations
import read_models
from event_store import domains
from event_store.decider import execute, initial_state
from event_store.envelope import CommandEnvelope
from event_store.errors import InvalidRecord
from eventlake.generator import (GeneratorConfig, IotGeneratorConfig, SiteGeneratorConfig, generate_commands,
                                 generate_iot_commands, generate_site_commands, interleaved)
from read_models.enrichment import MERCHANT_TABLE, enriched_sql
from read_models.sequence import sequence
from tests.domain_helpers import events_for, events_of, iot_events_for
from tests.iot_events import archive_table, duckdb_rows
from tests.merchant_history import dimension_table, reference

MODELS = list(read_models.REGISTRY)
RECORDED_AT = "2026-02-01T00:00:00.000Z"

# Every built-in domain's commands, small (a second or so of work): fraud and anomaly flags included, so that the
# detectors' models have events too.
ACCOUNTS = GeneratorConfig(accounts=12, commands=160, seed=47, run_id="contract", late_rate=0.05)
DEVICES = IotGeneratorConfig(devices=8, minutes=10, seed=47, run_id="contract")
SITES = SiteGeneratorConfig(sites=2, views=60, minutes=3, seed=47, run_id="contract")
LOG = interleaved(events_for(ACCOUNTS, flag_every=5, forget_after=120), iot_events_for(DEVICES, flag_every=4),
                  events_of(generate_site_commands(SITES)))
ADMITTED = sequence(LOG).admitted
# The merchants dimension the folds that join it read (every case of the as-of join: tests/merchant_history.py).
REFERENCE = reference(ADMITTED)
DIMENSION = dimension_table(ADMITTED)


def _archive(events):
    """``events`` as ``event_archive`` rows with every registered domain's payload columns."""
    return archive_table(events, (domains.EVENTS,))


def _over_events(model, sql: str, events) -> dict[tuple, dict]:
    """``sql`` (reading relation ``events``) in DuckDB over ``events`` of the model's types, joined with the
    contract's ``dim_merchant`` as of each event's time where the model's fold joins it, as
    ``spark_apps.archive_fold`` runs it."""
    archive = _archive([e for e in events if e.event_type in model.event_types])
    if not model.reference_tables:
        return duckdb_rows(sql, {"events": archive}, model.key)
    return duckdb_rows(f"WITH events AS ({enriched_sql('events_plain', model.reference_tables)}) {sql}",
                       {"events_plain": archive, MERCHANT_TABLE: DIMENSION}, model.key)


def _sql_fold(model, events) -> dict[tuple, dict]:
    """``model.fold_sql`` in DuckDB over ``events`` of its types."""
    return _over_events(model, model.fold_sql, events)


def _inserted(model, events) -> dict[tuple, dict]:
    """The table the fold of ``events`` gives a new table: ``fold_sql`` through ``merge_insert`` (or as folded)."""
    columns = ", ".join(f"{sql} AS {c}" for c, sql in model.merge_insert.items()) if model.merge_insert else "*"
    return _over_events(model, f"SELECT {columns} FROM ({model.fold_sql}) s", events)


def _oracle_columns(model, rows: dict[tuple, dict]) -> set[str]:
    return set(model.key) | {c for row in rows.values() for c in row}


def test_the_log_holds_every_domain_and_every_registry_is_complete():
    assert {e.aggregate_type for e in LOG} == set(domains.DOMAINS)
    assert sorted(expectations.SUITES) == sorted(read_models.REGISTRY)


@pytest.mark.parametrize("name", MODELS)
def test_the_schema_is_the_folds_columns(name):
    model = read_models.get(name)
    assert len(set(model.columns)) == len(model.columns), "a column named twice"
    assert set(model.key) <= set(model.columns)
    assert set(model.merge_update) <= set(model.columns) - set(model.key), "merge_update writes a key or a stranger"
    table = _inserted(model, ADMITTED)
    assert table, f"{name}: the generated log gives the model no row; give the contract log events it folds"
    for row in table.values():
        assert list(row) == model.columns  # every column, in the schema's order, and nothing else
    oracle = model.expected_rows(ADMITTED, REFERENCE)
    assert set(oracle) == set(table)
    assert _oracle_columns(model, oracle) <= set(model.columns)


@pytest.mark.parametrize("name", MODELS)
def test_a_batch_applied_twice_equals_once(name):
    model = read_models.get(name)
    once = model.expected_rows(ADMITTED, REFERENCE)
    assert once
    assert model.expected_rows(ADMITTED + ADMITTED, REFERENCE) == once
    # The same records delivered twice in the log (a producer's retry, a replay) are admitted once.
    assert sequence(LOG + LOG).admitted == ADMITTED
    assert model.expected_rows(sequence(LOG + LOG).admitted, REFERENCE) == once


@pytest.mark.parametrize("name", MODELS)
def test_fold_sql_agrees_with_the_oracle(name):
    model = read_models.get(name)
    expected = model.expected_rows(ADMITTED, REFERENCE)
    folded = _inserted(model, ADMITTED)
    assert set(folded) == set(expected)
    for key, row in expected.items():
        assert {c: folded[key][c] for c in row} == row, key


def _merged(model, first, second) -> dict[tuple, dict]:
    """The table after the fold of ``first`` was inserted and the fold of ``second`` MERGE-d into it with
    ``merge_update`` (a key first seen in ``second`` inserted, an INSERT_ONCE row left as it was)."""
    t_rows = _inserted(model, first)
    s_rows = _sql_fold(model, second)
    if not t_rows or not s_rows:
        return {**(_inserted(model, second) if s_rows else {}), **t_rows}
    insert = model.merge_insert or {c: f"s.{c}" for c in model.columns}
    on = " AND ".join(f"t.{k} = s.{k}" for k in model.key)
    update = ", ".join(f"{model.merge_update.get(c, f't.{c}')} AS {c}" for c in model.columns)
    inserted = ", ".join(f"{insert[c]} AS {c}" for c in model.columns)
    missing = " AND ".join(f"t.{k} IS NULL" for k in model.key)
    sql = (f"SELECT {update} FROM t JOIN s ON {on} UNION ALL SELECT {inserted} FROM s LEFT JOIN t ON {on} "
           f"WHERE {missing} UNION ALL SELECT t.* FROM t LEFT JOIN s ON {on} WHERE {missing.replace('t.', 's.')}")
    return duckdb_rows(sql, {"t": pa.Table.from_pylist(list(t_rows.values())),
                             "s": pa.Table.from_pylist(list(s_rows.values()))}, model.key)


@pytest.mark.parametrize("name", MODELS)
def test_merging_a_second_batch_gives_the_fold_of_both(name):
    model = read_models.get(name)
    expected = model.expected_rows(ADMITTED, REFERENCE)
    # ADMITTED is per aggregate, in version order: the last cut puts a forgotten customer's SubjectForgotten in the
    # second batch, after the values the first stored.
    forgotten = next(n for n, e in enumerate(ADMITTED) if e.event_type == "SubjectForgotten")
    for cut in (len(ADMITTED) // 3, len(ADMITTED) // 2, forgotten):
        first, second = ADMITTED[:cut], ADMITTED[cut:]
        merged = _merged(model, first, second)
        assert set(merged) == set(expected), cut
        for key, row in expected.items():
            assert {c: merged[key][c] for c in row} == row, (cut, key)


def _commands():
    for stream in (generate_commands(ACCOUNTS), generate_iot_commands(DEVICES), generate_site_commands(SITES)):
        for _, raw in stream:
            try:
                yield CommandEnvelope.from_json(raw)
            except InvalidRecord:
                continue


COMMANDS = list(_commands())


@pytest.mark.parametrize("aggregate_type", list(domains.DOMAINS))
def test_every_state_round_trips_its_snapshot_encoding_and_decides_as_the_live_one(aggregate_type):
    domain = domains.DOMAINS[aggregate_type]
    mine = [c for c in COMMANDS if c.aggregate_type == aggregate_type]
    assert mine, f"the contract's generators give {aggregate_type} no command"
    live: dict[str, object] = {}
    logged: dict[str, list] = {}
    restored: dict[str, object] = {}
    checked = 0
    for command in mine:
        state = live.get(command.aggregate_id) or initial_state(command)
        snapshot = json.loads(json.dumps(domain.encode_state(state)))  # a snapshot is JSON on a topic
        decoded = domain.decode_state(snapshot)
        assert decoded == state, (aggregate_type, command.aggregate_id)
        live[command.aggregate_id], events, result = execute(state, command, recorded_at=RECORDED_AT)
        # The state restored from the snapshot decides the command as the live one did, to the event.
        restored[command.aggregate_id], again, again_result = execute(decoded, command, recorded_at=RECORDED_AT)
        assert [e.to_json() for e in again] == [e.to_json() for e in events]
        assert (again_result.status, again_result.error_type) == (result.status, result.error_type)
        logged.setdefault(command.aggregate_id, []).extend(events)
        checked += bool(events)
    assert checked, f"no {aggregate_type} command was accepted"
    assert restored == live
    # evolve alone, from the initial state over the logged events (a restore replaying the log), reaches the
    # state decide/evolve reached; and so does a restore from a snapshot taken halfway, then the rest.
    for aggregate_id, events in logged.items():
        folded = domain.initial(aggregate_id)
        for n, event in enumerate(events):
            if n == len(events) // 2:
                folded = domain.decode_state(json.loads(json.dumps(domain.encode_state(folded))))
            folded = domain.evolve(folded, event)
        assert folded == live[aggregate_id], (aggregate_type, aggregate_id)
