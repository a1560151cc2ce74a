"""The Python engine's DuckDB merge planning: a read model's part of a batch checked to be on the common path and
folded in DuckDB, and its writes planned."""
from __future__ import annotations

import json
from typing import Callable

from event_store.sealing import unsealed_select
from python_engine import compaction
from python_engine.key_index import KeyIndex, key_hashes
from python_engine.delta_writes import Batch, cast_to, merge_into, register_delta, sql_text
from python_engine.errors import HandOver
from read_models.catalog import SHARED_LATE_EVENTS_TABLE, Generation
from read_models.enrichment import enriched_sql
from read_models.spec import CURRENT_STATE_BY_VERSION, INSERT_ONCE, WINDOWED_SUM, ReadModel

__all__ = ["plan_unit"]


def _fold(con, model: ReadModel, relation: str):
    """``model.fold_sql`` over ``relation`` (its relation ``events``, personal values unsealed: the connection has
    the unsealing function, and a relation per reference table the model joins, ``read_models_batch``) -> an
    Arrow table."""
    columns = [d[0] for d in con.execute(f"SELECT * FROM {relation} LIMIT 0").description]
    unsealed = unsealed_select(relation, columns)
    if model.reference_tables:
        unsealed = enriched_sql(f"({unsealed})", model.reference_tables)
    con.execute(f"CREATE OR REPLACE TEMP VIEW events AS {unsealed}")
    return con.sql(model.fold_sql).to_arrow_table()


def plan_unit(con, batch: Batch, model: ReadModel, generation: Generation,
              key_index: Callable[..., KeyIndex]) -> Callable[[], None]:
    """Check that ``model``'s part of the batch is on the common path (HandOver if not) and return its writes.
    ``key_index(path, columns)``: the engine's index on disk of a table's keys (``PythonProjection.key_index``)."""
    if not model.fold_sql:
        raise HandOver(f"{model.name}: no fold_sql (its fold in DuckDB's SQL)")
    view = f"events_{model.name}"
    con.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM batch WHERE event_type IN "
                f"({sql_text(model.event_types)})")
    target = batch.table(generation.table)
    txn = f"{batch.app_id}/{model.name}"
    on = " AND ".join(f"t.{k} = s.{k}" for k in model.key)
    insert = dict(model.merge_insert) or {f: f"s.{f}" for f in model.columns}

    if model.merge_strategy == CURRENT_STATE_BY_VERSION:
        if batch.done(target, txn):  # a batch run again: this model's part committed in its first run
            return lambda: None
        with batch.timed(f"{model.name}: fold"):
            key = model.key[0]  # the aggregate's id (this strategy's rows are aggregates, as in spark_apps.merge)
            con.register(f"folded_{model.name}", _fold(con, model, view))
            register_delta(con, f"target_{model.name}", generation.table, target)
            con.execute(f"CREATE OR REPLACE TEMP VIEW current_{model.name} AS SELECT {key}, version FROM "
                        f"target_{model.name} SEMI JOIN folded_{model.name} USING ({key})")
            ahead = con.execute(f"SELECT count(*) FROM folded_{model.name} s JOIN current_{model.name} c "
                                f"USING ({key}) WHERE s.first_version <= c.version").fetchall()[0][0]
            if ahead:
                # Rows that already hold some of the batch's versions (a generation a rebuild caught up past the
                # live projection's position): those versions are dropped, as the Spark engine's slow path
                # drops versions already applied (spark_apps.merge._ranked), and the rest folded.
                current = con.sql(f"SELECT {key} AS aggregate_id, version FROM current_{model.name}").to_arrow_table()
                con.register(f"applied_{model.name}", current)
                con.execute(f"CREATE OR REPLACE TEMP VIEW unapplied_{model.name} AS SELECT e.* FROM {view} e "
                            f"LEFT JOIN applied_{model.name} c USING (aggregate_id) "
                            f"WHERE e.aggregate_version > coalesce(c.version, 0)")
                con.register(f"folded_{model.name}", _fold(con, model, f"unapplied_{model.name}"))
            stuck = con.execute(f"SELECT count(*) FROM folded_{model.name} s LEFT JOIN current_{model.name} c "
                                f"USING ({key}) WHERE s.first_version <> coalesce(c.version, 0) + 1 "
                                f"OR s._events <> s.version - s.first_version + 1").fetchall()[0][0]
            if stuck:
                raise HandOver(f"{model.name}: {stuck} key(s) do not continue their row's version")
            source = con.sql(f"SELECT * FROM folded_{model.name}").to_arrow_table()

        def write() -> None:
            with batch.timed(f"{model.name}: merge"):
                merge_into(batch, target, generation.table, txn, source, on, insert, dict(model.merge_update),
                       guard=True)
        return write

    if model.merge_strategy == INSERT_ONCE:
        with batch.timed(f"{model.name}: fold"):
            keys = ", ".join(model.key)
            con.register(f"folded_{model.name}", _fold(con, model, view))
            source = con.sql(f"SELECT DISTINCT ON ({keys}) * FROM folded_{model.name}").to_arrow_table()
        own = con.cursor()  # its own DuckDB connection (to the same database): the write runs on its own thread

        def write() -> None:
            try:
                if model.merge_insert:  # rows computed by SQL over the source: the MERGE evaluates it
                    with batch.timed(f"{model.name}: merge"):
                        merge_into(batch, target, generation.table, txn, source, on, insert)
                    return
                with batch.timed(f"{model.name}: insert"):
                    _insert_once(own, batch, model, generation.table, target, txn, source, on, insert,
                                 key_index(generation.table, model.key))
            finally:
                own.close()
        return write

    if model.merge_strategy == WINDOWED_SUM:
        return _plan_windowed(con, batch, model, generation, target, view, txn, on, insert)
    raise HandOver(f"{model.name}: merge strategy {model.merge_strategy!r} is not on this engine's path")


def _insert_once(con, batch: Batch, model: ReadModel, path, target, txn: str, source, on: str, insert: dict,
                 index: KeyIndex) -> None:
    """An insert-once model's write: when none of the batch's keys is in the table (checked against the engine's
    index of its keys on disk, brought up to the table's version first), a plain append, whose cost does not grow
    with the table as a MERGE's does; else the MERGE (a key seen before keeps its first row). Either way once per
    batch (the same transaction id)."""
    if batch.done(target, txn):
        return
    index.up_to_date(con, target)
    rows = cast_to(source, target)
    con.register(f"new_{model.name}", rows)
    hashes = key_hashes(con, f"new_{model.name}", model.key)
    if index.hits(hashes):
        merge_into(batch, target, path, txn, source, on, insert)
        index.add(target.version(), hashes)  # every key of the batch is in the table now
        return
    version = batch.append(rows, path, model.name, txn=txn, table=target)
    if version is not None:
        index.add(version, hashes)


def _late_rows(con, model: ReadModel, fresh: str, watermark):
    """The late events' rows of ``late_events`` (``spark_apps.merge._windowed_sum``'s): the event as JSON in Spark's
    ``to_json`` shape (null fields left out, times as ``yyyy-MM-dd'T'HH:mm:ss.SSSZ`` in UTC)."""
    import datetime as dt

    import pyarrow as pa

    rows = con.sql(f"SELECT * EXCLUDE (_late) FROM {fresh} WHERE _late").to_arrow_table().to_pylist()
    now = dt.datetime.now(dt.timezone.utc)
    out = {"read_model": [], "event_id": [], "event_type": [], "aggregate_id": [], "event_time": [],
           "watermark": [], "event": [], "recorded_at": []}
    for row in rows:
        for name in ("event_id", "event_type", "aggregate_id"):
            out[name].append(row[name])
        out["read_model"].append(model.name)
        out["event_time"].append(row[model.event_time])
        out["watermark"].append(watermark)
        out["event"].append(json.dumps({k: _spark_json_value(v) for k, v in row.items() if v is not None},
                                       separators=(",", ":")))
        out["recorded_at"].append(now)
    when = pa.timestamp("us", tz="UTC")
    return pa.table(out, schema=pa.schema([("read_model", pa.string()), ("event_id", pa.string()),
                                           ("event_type", pa.string()), ("aggregate_id", pa.string()),
                                           ("event_time", when), ("watermark", when), ("event", pa.string()),
                                           ("recorded_at", when)]))


def _spark_json_value(value):
    import datetime as dt

    if isinstance(value, dt.datetime):
        value = value.astimezone(dt.timezone.utc)
        return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
    return value


def _plan_windowed(con, batch: Batch, model: ReadModel, generation: Generation, target, view: str,
                   txn: str, on: str, insert: dict) -> Callable[[], None]:
    import datetime as dt

    from spark_apps.merge import newest_event_time_on_clock, utc_time, watermark_delay, windowed_watermark

    with batch.timed(f"{model.name}: watermark"):
        metadata = [json.loads(c["userMetadata"]) for c in target.history(5) if c.get("userMetadata")]
        found, newest = newest_event_time_on_clock(metadata)
        again = bool(metadata) and metadata[0].get("app_id") == batch.app_id and \
            metadata[0].get("batch_id") == batch.batch_id
        if not found and not again:
            register_delta(con, "window_table", generation.table, target)
            newest_start = con.execute("SELECT max(window_start) FROM window_table").fetchall()[0][0]
            if newest_start is not None:
                newest = min(newest_start.astimezone(dt.timezone.utc), dt.datetime.now(dt.timezone.utc))
        # A batch run again whose MERGE committed: its events are split by the watermark that commit recorded.
        watermark = utc_time(metadata[0].get("watermark_before")) if again else \
            windowed_watermark(newest, watermark_delay(model))
    with batch.timed(f"{model.name}: not yet applied"):
        register_delta(con, f"applied_{model.name}", generation.applied, batch.table(generation.applied))
        lo, hi = con.execute(f"SELECT min({model.event_time}), max({model.event_time}) FROM {view}").fetchall()[0]
        con.execute(f"CREATE OR REPLACE TEMP TABLE fresh_{model.name} AS SELECT * FROM {view} ANTI JOIN "
                    f"(SELECT event_id FROM applied_{model.name} WHERE event_time IS NULL OR event_time BETWEEN "
                    f"$lo AND $hi) USING (event_id)", {"lo": lo, "hi": hi})
        fresh = f"fresh_{model.name}"
        is_late = "false" if watermark is None else \
            f"{model.event_time} < TIMESTAMPTZ '{watermark.isoformat()}'"
        con.execute(f"ALTER TABLE {fresh} ADD COLUMN _late BOOLEAN")
        con.execute(f"UPDATE {fresh} SET _late = coalesce({is_late}, false)")
        newest_on_clock = con.execute(f"SELECT max(least({model.event_time}, recorded_at, now())) "
                                      f"FROM {fresh}").fetchall()[0][0]
        if newest_on_clock is not None:
            newest_on_clock = newest_on_clock.astimezone(dt.timezone.utc)
            newest = newest_on_clock if newest is None else max(newest, newest_on_clock)
        con.execute(f"CREATE OR REPLACE TEMP VIEW on_time_{model.name} AS SELECT * EXCLUDE (_late) FROM {fresh} "
                    f"WHERE NOT _late")
        source = _fold(con, model, f"on_time_{model.name}")
        clustered = "window_start" in model.key and "window_start" in source.column_names
        if source.num_rows and clustered:
            # The rows this MERGE can match lie in the source's windows: said in its condition, delta-rs skips
            # every file whose windows lie elsewhere (without it, each live batch reads the whole table).
            con.register(f"windows_{model.name}", source.select(["window_start"]))
            first, last = con.execute(f"SELECT strftime(min(window_start), '%Y-%m-%dT%H:%M:%S.%fZ'), "
                                      f"strftime(max(window_start), '%Y-%m-%dT%H:%M:%S.%fZ') "
                                      f"FROM windows_{model.name}").fetchall()[0]
            on = f"{on} AND t.window_start >= '{first}' AND t.window_start <= '{last}'"
        ledger = con.sql(f"SELECT event_id, {model.event_time} AS event_time, _late FROM {fresh}").to_arrow_table()
        late = _late_rows(con, model, fresh, watermark)
    extra = {"watermark_before": None if watermark is None else watermark.isoformat(),
             "watermark_newest_event_time": None if newest is None else newest.isoformat()}

    def write() -> None:
        if source.num_rows:
            with batch.timed(f"{model.name}: merge"):
                metrics = merge_into(batch, target, generation.table, txn, source, on, insert, dict(model.merge_update),
                                 **extra)
            if clustered:
                batch.windowed.add(str(generation.table))
                if metrics.get("num_target_rows_copied", 0) >= compaction.CLUSTER_AFTER_COPIED_ROWS:
                    batch.to_cluster.add(str(generation.table))
        if late.num_rows:
            with batch.timed(f"{model.name}: late events"):
                batch.append(late, generation.late_events, SHARED_LATE_EVENTS_TABLE, writer=model.name)
        if ledger.num_rows:
            with batch.timed(f"{model.name}: applied ledger"):
                batch.append(ledger, generation.applied, f"_applied/{model.name}")
    return write
