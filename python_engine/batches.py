"""The Python engine's two batches: the archive's (an append of every valid event) and the read models' (the
sequence gate's check, then each model's writes side by side)."""
from __future__ import annotations

from python_engine.key_index import key_hashes
from python_engine.delta_writes import Batch, register_delta, side_by_side
from python_engine.errors import HandOver
from python_engine.merge_planning import plan_unit
from read_models.catalog import ARCHIVE_TABLE, SHARED_LATE_EVENTS_TABLE, held_table, ledger_table
from read_models.spec import CURRENT_STATE_BY_VERSION
from spark_apps.event_rows import Records

__all__ = ["archive_batch", "read_models_batch"]


# -- the archive's batch ---------------------------------------------------------------------------------------
def archive_batch(query, records: Records, batch: Batch) -> None:
    engine = query.engine
    with batch.timed("parse"):
        if engine.shared is not None and engine.shared[0] == records.span:
            events = engine.shared[1]  # the read models' batch: the same records, parsed already
        else:
            events, _ = engine.parser.parse(records, engine.settings.events_topic)
        engine.shared = None
    with batch.timed("append"):
        batch.append(events, query.engine.settings.table_path(ARCHIVE_TABLE), ARCHIVE_TABLE)


# -- the read models' batch ------------------------------------------------------------------------------------
def read_models_batch(query, records: Records, batch: Batch) -> dict:
    """-> the batch's figures for ``QueryFigures.add_outcomes``: every event applied (the Python engine's common
    path admits them all: anything else goes to the Spark engine), the windowed models' late ones, and the newest
    event's ``recorded_at``."""
    import duckdb
    import pyarrow.compute as pc

    engine = query.engine
    settings = engine.settings
    with batch.timed("parse"):
        events, bad = engine.parser.parse(records, settings.events_topic)
        engine.shared = (records.span, events) if len(engine.queries) > 1 else None
    if bad:
        partition, offset, reason = bad[0]
        raise HandOver(f"{len(bad)} record(s) that are not valid events (partition {partition} offset {offset}: "
                       f"{reason[:200]}) -> the dead-letter table")
    generations = engine.tables.generations_for_batch(query.batch_id)
    con = duckdb.connect(config={"threads": 2})
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("batch", events)
        # The models' folds read personal values unsealed (null once forgotten: event_store.sealing); the batch
        # itself, and what is kept of its events (the archive, late events), stays sealed.
        engine.unsealer.refresh()
        engine.unsealer.register(con)
        with batch.timed("sequence: check"):
            ledger_name = ledger_table(query.name)
            ledger_path = settings.table_path(ledger_name)
            ledger = batch.table(ledger_path)
            rerun = batch.done(ledger, f"{query.app_id}/{ledger_name}/")
            held_path = settings.table_path(held_table(query.name))
            register_delta(con, "held", held_path, batch.table(held_path))
            held = con.execute("SELECT count(*) FROM held WHERE aggregate_id IN (SELECT aggregate_id FROM batch)"
                               ).fetchall()[0][0]
            if held:
                raise HandOver(f"{held} event(s) of this batch's aggregates are held after a version gap")
            if rerun:
                register_delta(con, "ledger", ledger_path, ledger)
                # Run again after a crash, its ledger rows written: when its first run admitted every event (the
                # common path), the rest of its writes are done here, each skipped where it committed; else Spark's
                # re-run path takes it.
                admitted_by = f"{query.app_id}/{query.batch_id}"
                mine, missing = con.execute(f"""
                    SELECT (SELECT count(*) FROM ledger WHERE admitted_by = '{admitted_by}'),
                           (SELECT count(*) FROM batch ANTI JOIN (SELECT event_id FROM ledger
                                                                 WHERE admitted_by = '{admitted_by}') USING (event_id))
                    """).fetchall()[0]
                if missing or mine != events.num_rows:
                    raise HandOver("a batch run again after a crash, whose first run did not admit every event")
                engine.log(f"{query.name}: batch {query.batch_id}: run again after a crash; its sequence ledger "
                           f"rows are written, the writes not yet committed are done now")
            else:
                # Against the engine's index of the ledger on disk (python_engine.key_index: its heads and event
                # ids, brought up to the ledger's version first): the batch's own aggregates and ids only, however
                # long the ledger.
                index = engine.key_index(ledger_path, ("event_id",), heads=True)
                index.up_to_date(con, ledger)
                runs = con.execute("SELECT aggregate_id, min(aggregate_version), max(aggregate_version), count(*), "
                                   "count(DISTINCT aggregate_version) FROM batch GROUP BY 1").fetchall()
                repeated = con.execute("SELECT count(*) - count(DISTINCT event_id) FROM batch").fetchall()[0][0]
                heads = index.heads(aggregate for aggregate, *_ in runs)
                off_head = sum(1 for aggregate, first, last, n, distinct in runs
                               if first != heads.get(aggregate, 0) + 1 or n != distinct
                               or n != last - first + 1)
                del heads
                ids = key_hashes(con, "batch", ["event_id"])
                known = 0
                if index.hits(ids):  # maybe admitted before (or a hash shared): the ledger decides
                    register_delta(con, "ledger", ledger_path, ledger)
                    known = con.execute("SELECT count(*) FROM ledger WHERE event_id IN (SELECT event_id FROM batch)"
                                        ).fetchall()[0][0]
                if repeated or known or off_head:
                    raise HandOver(f"not every aggregate simply continues its head ({repeated} event id(s) repeated "
                                   f"in the batch, {known} admitted before, {off_head} aggregate(s) off their head)")
        with batch.timed("pending"):
            for model, generation in engine.plan.units(generations):
                pending = batch.table(generation.pending) if model.merge_strategy == CURRENT_STATE_BY_VERSION \
                    else None
                if pending is not None and pending.file_uris() and pending.to_pyarrow_dataset().count_rows():
                    raise HandOver(f"{model.name}: events wait in {generation.pending} for an earlier version")
        types = {t for (t,) in con.execute("SELECT DISTINCT event_type FROM batch").fetchall()}
        units = [(m, g) for m, g in engine.plan.units(generations) if types.intersection(m.event_types)]
        with batch.timed("reference tables"):
            for name in sorted({t for m, _ in units for t in m.reference_tables}):
                con.register(name, engine.reference.arrow(name))  # read again only when its version moved
        writes = [plan_unit(con, batch, model, generation, engine.key_index) for model, generation in units]
        with batch.timed("sequence: ledger"):
            admitted = con.sql(f"SELECT aggregate_id, aggregate_version, event_id, kafka_partition, kafka_offset, "
                               f"'{query.app_id}/{query.batch_id}' AS admitted_by FROM batch").to_arrow_table()
            version = batch.append(admitted, ledger_path, ledger_name, table=ledger)
            if version is not None and not rerun:
                index.add(version, ids, {aggregate: last for aggregate, _, last, _, _ in runs})
        with batch.timed("the models' writes, side by side"):
            side_by_side(writes)
        newest = pc.max(events["recorded_at"]).as_py() if events.num_rows else None
        late = sum(n for (name, _), n in batch.appended.items() if name == SHARED_LATE_EVENTS_TABLE)
        return {"events": {"applied": events.num_rows, "late": late}, "held": 0,
                "newest_event_at": newest.timestamp() if newest is not None else None}
    except HandOver:
        raise
    except Exception as e:  # noqa: BLE001 -- a lost commit race, a table in a shape this engine cannot write ...
        raise HandOver(f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}") from e
    finally:
        con.close()
