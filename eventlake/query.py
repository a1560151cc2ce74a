"""SQL over the read models.

The embedded path (default) reads the Delta tables through delta-rs (``deltalake``) into DuckDB: no
JVM, answers in well under a second. ``engine="spark"`` runs the same SQL on Spark SQL instead.
Every read model is a view named after it; so are ``late_events`` and ``event_archive``; the event dead
letters are ``event_dead_letters``. A read model's name resolves through the catalog (read_models/catalog.py) to
its current generation's table, and ``late_events`` is the union of the current generations' late events.
Both engines only read (eventlake/read_only.py): a statement that would change a table is refused, and so is a
function that runs code (reflection, user-defined functions). Both read a string literal alike: DuckDB's way,
a backslash is a character and ``''`` a quote (Spark's statements are rewritten to that effect).
"""
from __future__ import annotations

import re
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple, Union

from eventlake.sql_guard import GuardBuildError
from eventlake.read_only import WriteRefused, check_duckdb, check_spark, lock_duckdb, spark_guard
from lakehouse.settings import Settings
from lakehouse.storage import delta_table
from read_models.catalog import ARCHIVE_TABLE, DEAD_LETTER_TABLE, Catalog, late_events_sources
from lakehouse.errors import BadInput

__all__ = ["QueryError", "TablePart", "AsOf", "parse_as_of", "describe_as_of", "erased_after", "logical_tables", "query_duckdb", "query_spark", "spark_frame",
           "format_table", "format_csv", "format_json_lines"]


class QueryError(BadInput, RuntimeError):
    """The SQL could not be run: no tables yet, or DuckDB, delta-rs, pyarrow or Spark refused it; the message
    is the engine's own, followed by the tables there are."""


class TablePart(NamedTuple):
    """One Delta table that makes (part of) a logical table; ``read_models``: keep only its rows with these
    ``read_model`` values (None: every row); ``version``: the table's version to read (None: the newest)."""
    path: Path
    read_models: tuple[str, ...] | None = None
    version: int | None = None
    generation: int | None = None  # a read model's table: its generation


AsOf = Union[int, datetime]  # a table version, or a point in time (aware, UTC)


def parse_as_of(text: str) -> AsOf:
    """``--as-of``: a table version (``12``) or a UTC time (``2026-11-24T06:00:00Z``, ``2026-11-24 06:00``,
    ``2026-11-24``; without a zone: UTC)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise QueryError(f"--as-of {text!r} is neither a table version (a whole number) nor an ISO 8601 time "
                         f"such as 2026-11-24T06:00:00Z") from None
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def logical_tables(settings: Settings, as_of: AsOf | None = None) -> dict[str, list[TablePart]]:
    """The names a user queries -> the physical tables behind them (those that exist), resolved through the
    catalog in one read: each read model -> its current generation's table; ``late_events`` -> the current
    generations' late-events tables; ``event_archive`` and ``event_dead_letters`` -> their own tables.

    ``as_of`` a time: the generations current then, each table at its newest version committed by then (a table
    not yet created then is left out); ``as_of`` a version: each table at that version (left out where it has
    no such version)."""
    moment = as_of if isinstance(as_of, datetime) else None
    current = Catalog(settings).current_all(as_of=moment)
    candidates = {name: [TablePart(g.table, generation=g.number)] for name, g in current.items()}
    candidates["event_dead_letters"] = [TablePart(settings.table_path(DEAD_LETTER_TABLE))]
    candidates["late_events"] = [TablePart(path, tuple(names)) for path, names in late_events_sources(current)]
    candidates["event_archive"] = [TablePart(settings.table_path(ARCHIVE_TABLE))]
    existing = {name: parts for name, parts in candidates.items()
                if parts and all((p.path / "_delta_log").is_dir() for p in parts)}
    if as_of is None:
        return existing
    travelled = {}
    for name, parts in existing.items():
        versions = [_version_as_of(p.path, as_of) for p in parts]
        if all(v is not None for v in versions):
            travelled[name] = [p._replace(version=v) for p, v in zip(parts, versions)]
    return travelled


def _version_as_of(path: Path, as_of: AsOf) -> int | None:
    """The table's version to read for ``as_of`` (None: the table had no such version, or did not exist then)."""
    history = delta_table(path).history()  # newest first; commits whose log files are still there
    versions = {int(c["version"]): int(c["timestamp"]) for c in history if "version" in c}
    if isinstance(as_of, int):
        return as_of if as_of in versions else None
    cutoff = as_of.timestamp() * 1000
    committed = [v for v, ms in versions.items() if ms <= cutoff]
    return max(committed) if committed else None


def erased_after(settings: Settings, sql: str, as_of: AsOf) -> str | None:
    """Why ``sql`` cannot be read ``as_of`` where a table it names was erased later (``eventlake forget``: the old
    files and log entries that held the erased values are deleted, so the versions before the erasure may not be
    read, issue 45), or None. Names the erasure's version, time and reason."""
    from lakehouse.erasure import REASON_KEY

    notes = []
    for name, parts in _mentioned(sql, logical_tables(settings)).items():
        for part in parts:
            for commit in sorted(delta_table(part.path).history(), key=lambda c: c.get("version", -1)):
                if REASON_KEY not in commit or "version" not in commit:
                    continue
                later = (commit["version"] > as_of if isinstance(as_of, int)
                         else commit["timestamp"] > as_of.timestamp() * 1000)
                if later:
                    when = datetime.fromtimestamp(commit["timestamp"] / 1000, timezone.utc)
                    notes.append(f"{name} was erased at version {commit['version']} ({when:%Y-%m-%d %H:%M} UTC, "
                                 f"reason {commit[REASON_KEY]!r})")
                    break
    if not notes:
        return None
    when = f"version {as_of}" if isinstance(as_of, int) else as_of.isoformat()
    return (f"as of {when}: " + "; ".join(notes) + ". The files and log entries that held the erased values before "
            "it were deleted, so what they held cannot be read as of an earlier moment; read at the erasure's "
            "version or later (`eventlake history NAME` lists the versions)")


def describe_as_of(tables: dict[str, list[TablePart]], as_of: AsOf) -> str:
    """One line naming what each table is read at, for the user (stderr)."""
    parts = []
    for name, table_parts in tables.items():
        versions = "+".join(str(p.version) for p in table_parts)
        generation = "".join(f"generation {p.generation}, " for p in table_parts if p.generation is not None)
        parts.append(f"{name} ({generation}version {versions})")
    when = f"version {as_of}" if isinstance(as_of, int) else as_of.isoformat()
    return f"as of {when}: " + (", ".join(parts) or "no table")


def _erased(settings: Settings, sql: str, as_of: AsOf | None) -> QueryError | None:
    """A query as of a moment before an erasure of a table it names fails (a file or log entry gone) or finds the
    table missing: say so, rather than the engine's message about a missing file or table."""
    why = erased_after(settings, sql, as_of) if as_of is not None else None
    return QueryError(why) if why else None


def _existing_tables(settings: Settings, as_of: AsOf | None = None, sql: str = "") -> dict[str, list[TablePart]]:
    tables = logical_tables(settings, as_of)
    erased = _erased(settings, sql, as_of) if as_of is not None and set(_mentioned(sql, logical_tables(settings))) \
        - set(tables) else None
    if erased is not None:  # a table the query names had no version then any more
        raise erased
    if not tables and as_of is not None and logical_tables(settings):
        when = f"version {as_of}" if isinstance(as_of, int) else as_of.isoformat()
        raise QueryError(f"no table under {settings.warehouse} has {when} (the tables: "
                         f"{', '.join(logical_tables(settings))}); `eventlake history NAME` lists a table's versions")
    if not tables:
        raise QueryError(f"no read model tables under {settings.warehouse} yet; run `eventlake demo` or "
                         f"`eventlake project --until-caught-up` first")
    return tables


def _engine_errors() -> tuple[type[BaseException], ...]:
    """What the read engines raise for a query they cannot run or data they cannot read: SQL errors, missing
    or unreadable files, values one library cannot convert (e.g. pyarrow's timestamp casts). Anything else is
    a bug and keeps its traceback."""
    import duckdb
    import pyarrow as pa
    from deltalake.exceptions import DeltaError

    from lakehouse.tables import TableNotFound

    errors: list[type[BaseException]] = [duckdb.Error, pa.ArrowException, DeltaError, TableNotFound, OSError,
                                         UnicodeError]
    try:  # Spark is optional for the embedded path
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        errors += [PySparkException, Py4JError]
    except ImportError:
        pass
    return tuple(errors)


def _refused(engine: str, error: BaseException, tables: dict[str, Path]) -> QueryError:
    # One paragraph: the engine's blank lines dropped (DuckDB's before its "LINE 1: ..." pointer, Spark's
    # before a plan); a JVM stack trace after Spark's message says nothing more to a person writing SQL.
    lines = [line for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    message = "\n".join(lines if len(lines) <= 20 else lines[:20] + [f"... ({len(lines) - 20} more lines)"])
    return QueryError(f"{engine} could not run the query: {message}\n(tables: {', '.join(tables)})")


def _read_only(error: WriteRefused, tables) -> QueryError:
    return QueryError(f"read-only: {error}\n(tables: {', '.join(tables)})")


def query_duckdb(settings: Settings, sql: str, as_of: AsOf | None = None) -> tuple[list[str], list[tuple]]:
    """Run ``sql`` with DuckDB over the current versions of the Delta tables (read with delta-rs + pyarrow), or
    over their versions ``as_of`` a version or a time."""
    from lakehouse.tables import dataset

    tables = _existing_tables(settings, as_of, sql)
    con = _duckdb_connection()
    try:
        # Reading the data (fetchall) is where bad bytes or unconvertible values surface, so it is inside too.
        try:
            for name, parts in _named_in(sql, tables).items():
                _register_duckdb(con, name, parts, dataset)
            check_duckdb(con, sql)
            result = con.execute(sql)
            columns = [d[0] for d in result.description] if result.description else []
            return columns, result.fetchall()
        except WriteRefused as e:
            raise _read_only(e, tables) from None
        except _engine_errors() as e:
            raise (_erased(settings, sql, as_of) or _refused("DuckDB", e, tables)) from None
    finally:
        con.close()


_DUCKDB = None
_DUCKDB_LOCK = threading.Lock()


def _duckdb_connection():
    """A connection of its own (a cursor: its registered tables and temporary views are its own) to this process's
    one DuckDB database. Opening a database costs about 30 ms, a cursor next to nothing, and a point lookup is a
    few ms. File access is switched off and the configuration locked for the whole database, once."""
    global _DUCKDB
    import duckdb

    with _DUCKDB_LOCK:
        if _DUCKDB is None:
            database = duckdb.connect()
            lock_duckdb(database)
            _DUCKDB = database
        return _DUCKDB.cursor()


def _named_in(sql: str, tables: dict[str, list[TablePart]]) -> dict[str, list[TablePart]]:
    """The tables whose names the SQL mentions (as words; opening each table's Delta log costs a few ms), or all
    of them when it names none (SHOW TABLES, information_schema ...)."""
    return _mentioned(sql, tables) or tables


def _mentioned(sql: str, tables: dict[str, list[TablePart]]) -> dict[str, list[TablePart]]:
    """The tables whose names the SQL mentions, as words."""
    return {name: parts for name, parts in tables.items()
            if re.search(rf"(?<![\w$]){re.escape(name)}(?![\w$])", sql, re.IGNORECASE)}


def query_spark(settings: Settings, sql: str, as_of: AsOf | None = None) -> tuple[list[str], list[tuple]]:
    """Run ``sql`` with Spark SQL (the process's active session, or a new one) over the Delta tables (``as_of``:
    the versions ``logical_tables`` picks, the same as the embedded path's)."""
    tables = _existing_tables(settings, as_of, sql)  # before starting a JVM for nothing
    from spark_apps.session import build_session

    spark = build_session(settings, app_name="eventlake-query")
    _quiet_spark_error_logs()
    try:
        # The SQL server's guard (eventlake/read_only.py): literals as DuckDB reads them, then no command, no
        # path, and no function that runs code, checked on the parsed statement and again once analyzed.
        guard = spark_guard(spark, settings)
        sql = guard.standard_literals(sql)
        check_spark(spark, sql)
        guard.check_parsed(sql)
        for name, parts in tables.items():
            spark_frame(spark, parts).createOrReplaceTempView(name)
        df = spark.sql(sql)
        guard.check_analyzed(df)
        return df.columns, [tuple(r) for r in df.collect()]
    except GuardBuildError as e:  # no JDK to compile the guard with
        raise QueryError(f"Spark SQL cannot run a query without its read-only guard: {e}") from None
    except WriteRefused as e:
        raise _read_only(e, tables) from None
    except _engine_errors() as e:  # AnalysisException, ParseException, a failed job: Spark's own message
        raise (_erased(settings, sql, as_of) or _refused("Spark SQL", e, tables)) from None


def _register_duckdb(con, name: str, parts: list[TablePart], dataset) -> None:
    """A logical table as a DuckDB view over the parts' current versions (lazy pyarrow datasets)."""
    import pyarrow.dataset as ds

    sources = []
    for part in parts:
        if part.version is None:
            data = dataset(part.path)
        else:
            data = dataset(delta_table(part.path, version=part.version))
        if part.read_models is not None:
            data = data.filter(ds.field("read_model").isin(list(part.read_models)))
        sources.append(data)
    if len(sources) == 1:
        con.register(name, sources[0])
        return
    hidden = [f"_eventlake_{name}_{i}" for i in range(len(sources))]
    for view, data in zip(hidden, sources):
        con.register(view, data)
    con.execute(f"CREATE TEMP VIEW {name} AS " + " UNION ALL BY NAME ".join(f"SELECT * FROM {v}" for v in hidden))


def spark_frame(spark, parts: list[TablePart]):
    from pyspark.sql import functions as F

    frames = []
    for part in parts:
        reader = spark.read.format("delta")
        if part.version is not None:
            reader = reader.option("versionAsOf", part.version)
        df = reader.load(str(part.path))
        frames.append(df if part.read_models is None else df.filter(F.col("read_model").isin(*part.read_models)))
    out = frames[0]
    for df in frames[1:]:
        out = out.unionByName(df, allowMissingColumns=True)
    return out


def _quiet_spark_error_logs() -> None:
    """PySpark logs each SQL error it raises, JVM stack trace included, as a JSON line on stderr; the error
    itself becomes the one message the user sees, so those logs are off for this process."""
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:  # an older PySpark: no such logs
        return
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True


def format_table(columns: list[str], rows: list[tuple], max_rows: int = 50) -> str:
    shown = rows[:max_rows]
    cells = [[_cell(v) for v in row] for row in shown]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = lambda vals: " | ".join(v.ljust(w) for v, w in zip(vals, widths))  # noqa: E731
    out = [line(columns), "-+-".join("-" * w for w in widths), *(line(r) for r in cells)]
    more = f", showing {max_rows}" if len(rows) > max_rows else ""
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''}{more})")
    return "\n".join(out)


def _cell(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (bytes, bytearray, memoryview)):  # binary columns (e.g. raw_bytes) as Python shows bytes
        return repr(bytes(value))
    return str(value)


def format_csv(columns: list[str], rows: list[tuple]) -> str:
    """Every row, RFC 4180 CSV with a header; NULL is an empty field, timestamps ISO 8601, bytes as hex."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([["" if v is None else _plain(v) for v in row] for row in rows])
    return out.getvalue().rstrip("\n")


def format_json_lines(columns: list[str], rows: list[tuple]) -> str:
    """Every row as one JSON object per line (JSON Lines): NULL is null, timestamps ISO 8601 strings, decimals
    exact (as strings), bytes as hex strings."""
    import json

    def value(v):
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, (list, tuple)):
            return [value(x) for x in v]
        if isinstance(v, dict):
            return {str(k): value(x) for k, x in v.items()}
        return _plain(v)

    return "\n".join(json.dumps({c: value(v) for c, v in zip(columns, row)}, ensure_ascii=False) for row in rows)


def _plain(value) -> str:
    import datetime as dt

    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    return str(value)
