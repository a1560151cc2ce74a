"""SQL over the read models.

The embedded path (default) reads the Delta tables through delta-rs (``deltalake``) into DuckDB: no
JVM, answers in well under a second. ``engine="spark"`` runs the same SQL on Spark SQL instead.
Every read model is a view named after it; so are ``late_events`` and ``event_archive``; the event dead
letters are ``event_dead_letters``.
"""
from __future__ import annotations

from pathlib import Path

import read_models
from eventlake.settings import Settings

__all__ = ["QueryError", "table_paths", "query_duckdb", "query_spark", "format_table"]


class QueryError(RuntimeError):
    """The SQL could not be run: no tables yet, or DuckDB/Spark refused it."""


def table_paths(settings: Settings) -> dict[str, Path]:
    """View name -> Delta table path, for the tables that exist."""
    candidates = {name: settings.table_path(name) for name in read_models.REGISTRY}
    candidates["event_dead_letters"] = settings.table_path("_dead_letters/events")
    candidates["late_events"] = settings.table_path("late_events")
    candidates["event_archive"] = settings.table_path("event_archive")
    return {name: path for name, path in candidates.items() if (path / "_delta_log").is_dir()}


def query_duckdb(settings: Settings, sql: str) -> tuple[list[str], list[tuple]]:
    import duckdb

    from eventlake.tables import dataset

    tables = table_paths(settings)
    if not tables:
        raise QueryError(f"no read model tables under {settings.warehouse} yet; run `eventlake demo` or "
                         f"`eventlake project --until-caught-up` first")
    con = duckdb.connect()
    try:
        for name, path in tables.items():
            con.register(name, dataset(path))
        try:
            result = con.execute(sql)
        except duckdb.Error as e:
            raise QueryError(f"{e}\n(tables: {', '.join(tables)})") from None
        columns = [d[0] for d in result.description] if result.description else []
        return columns, result.fetchall()
    finally:
        con.close()


def query_spark(settings: Settings, sql: str) -> tuple[list[str], list[tuple]]:
    from spark_apps.session import build_session

    spark = build_session(settings, app_name="eventlake-query")
    tables = table_paths(settings)
    for name, path in tables.items():
        spark.read.format("delta").load(str(path)).createOrReplaceTempView(name)
    try:
        df = spark.sql(sql)
    except Exception as e:  # AnalysisException, ParseException: show Spark's own message
        raise QueryError(f"{e}\n(tables: {', '.join(tables)})") from None
    return df.columns, [tuple(r) for r in df.collect()]


def format_table(columns: list[str], rows: list[tuple], max_rows: int = 50) -> str:
    shown = rows[:max_rows]
    cells = [[("NULL" if v is None else str(v)) for v in row] for row in shown]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = lambda vals: " | ".join(v.ljust(w) for v, w in zip(vals, widths))  # noqa: E731
    out = [line(columns), "-+-".join("-" * w for w in widths), *(line(r) for r in cells)]
    more = f", showing {max_rows}" if len(rows) > max_rows else ""
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''}{more})")
    return "\n".join(out)
