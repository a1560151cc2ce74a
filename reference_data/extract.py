"""Extract merchants, streamed, from a landed file (CSV or JSON lines, a local path or a storage URI) or from a SQL
database (any DB-API connection: SQLite here, PostgreSQL elsewhere, through a SQLAlchemy URL or a connection an
Airflow hook gives).

A source yields typed ``pyarrow.RecordBatch``es of ``CHUNK_ROWS`` rows (``merchants.staged_schema``), so memory
follows one chunk, never the file. While it reads it counts the bytes (a file over ``max_bytes`` is refused before a
byte is read, and one that grows past it while read is refused then) and hashes the content (what the load ledger
is keyed by: the same file twice loads once). Everything that makes the input unreadable as merchants is a
``MerchantInputError`` naming the source and the reason: an empty file, a wrong header, a value of the wrong JSON
type, bytes that are not UTF-8, a file over the limit. Whether the values are *good* merchants (ids unique, an MCC
of four digits, ...) is the suite's to say, on the staged batch (``expectations.merchants``).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import urlsplit

from lakehouse.storage import Location, RemoteLocation, location
from reference_data.merchants import COLUMNS, MerchantInputError, staged_schema, typed_row

__all__ = ["FileSource", "DatabaseSource", "source_for", "database_url", "CHUNK_ROWS", "FILE_FORMATS", "DEFAULT_TABLE",
           "DATABASE_SCHEMES"]

CHUNK_ROWS = 10_000
FILE_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
DEFAULT_TABLE = "merchants"
# A source whose URL has one of these schemes (a driver after "+" aside) is a database, any other a file.
DATABASE_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "mssql", "oracle")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")


class _Tap(io.RawIOBase):
    """A raw byte stream that hashes and counts what passes through it and refuses to pass more than ``limit``."""

    def __init__(self, raw, limit: int, name: str):
        self.raw, self.limit, self.name = raw, limit, name
        self.sha = hashlib.sha256()
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.raw.read(len(buffer))
        n = len(data)
        self.count += n
        if self.count > self.limit:
            raise MerchantInputError(f"{self.name}: larger than the limit of {self.limit:,} bytes (setting "
                                     f"reference_max_bytes, EVENTLAKE_REFERENCE_MAX_BYTES); nothing loaded")
        self.sha.update(data)
        buffer[:n] = data
        return n

    def close(self) -> None:
        try:
            self.raw.close()
        finally:
            super().close()


def _open_raw(where: Location):
    """A binary stream of the file at ``where`` (local, or through delta-rs' object store for a URI)."""
    if isinstance(where, RemoteLocation):
        from deltalake.fs import DeltaStorageHandler

        parts = urlsplit(where.uri)
        root = "file:///" if parts.scheme == "file" else f"{parts.scheme}://{parts.netloc}/"
        return DeltaStorageHandler(root, where.options or None).open_input_stream(parts.path.strip("/"))
    return open(where, "rb")


class FileSource:
    """A landed merchants file: CSV with a header, or JSON lines (one object per line), by its suffix."""

    def __init__(self, where: str | Location, max_bytes: int, options=None):
        self.location = location(where, options)
        self.max_bytes = max_bytes
        self.name = str(self.location)
        suffix = Path(self.location.name).suffix.lower()
        if suffix not in FILE_FORMATS:
            raise MerchantInputError(f"{self.name}: not a merchants file (expected a name ending in "
                                     f"{', '.join(FILE_FORMATS)})")
        self.format = FILE_FORMATS[suffix]
        self.content_hash: str | None = None  # known once the file has been read to its end
        self.bytes_read = 0

    def batches(self, chunk_rows: int = CHUNK_ROWS) -> Iterator:
        """The file's merchants as typed record batches; ``content_hash`` is set when the last one is given."""
        try:
            size = self.location.stat().st_size
        except FileNotFoundError:
            raise MerchantInputError(f"{self.name}: no such file") from None
        if size > self.max_bytes:
            raise MerchantInputError(f"{self.name}: {size:,} bytes, over the limit of {self.max_bytes:,} (setting "
                                     f"reference_max_bytes, EVENTLAKE_REFERENCE_MAX_BYTES); nothing loaded")
        if size == 0:
            raise MerchantInputError(f"{self.name}: empty file; nothing loaded")
        tap = _Tap(_open_raw(self.location), self.max_bytes, self.name)
        text = io.TextIOWrapper(io.BufferedReader(tap, 1 << 16), encoding="utf-8-sig", errors="strict", newline="")
        rows = self._csv_rows(text) if self.format == "csv" else self._json_rows(text)
        try:
            yield from _chunks(rows, chunk_rows, self.name)
        except UnicodeDecodeError as e:
            raise MerchantInputError(f"{self.name}: not UTF-8 text (byte 0x{e.object[e.start]:02x} in the "
                                     f"{tap.count:,} bytes read so far: {e.reason}); nothing loaded") from None
        finally:
            text.close()
        self.bytes_read = tap.count
        self.content_hash = tap.sha.hexdigest()

    def _csv_rows(self, text) -> Iterator[tuple[int, dict]]:
        reader = csv.reader(text)
        header = next(reader, None)
        if header is None or not any(h.strip() for h in header):
            raise MerchantInputError(f"{self.name}: empty file (no header); nothing loaded")
        header = [h.strip() for h in header]
        _check_header(self.name, header)
        for fields in reader:
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue
            if len(fields) != len(header):
                raise MerchantInputError(f"{self.name}: line {reader.line_num}: {len(fields)} fields, the header "
                                         f"has {len(header)}; nothing loaded")
            yield reader.line_num, dict(zip(header, fields))

    def _json_rows(self, text) -> Iterator[tuple[int, dict]]:
        for number, line in enumerate(text, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise MerchantInputError(f"{self.name}: line {number}: not JSON ({e.msg}); nothing loaded") from None
            if not isinstance(record, dict):
                raise MerchantInputError(f"{self.name}: line {number}: a JSON {type(record).__name__}, expected "
                                         f"an object with {', '.join(COLUMNS)}; nothing loaded")
            _check_header(f"{self.name}: line {number}", list(record))
            yield number, record


class DatabaseSource:
    """Merchants from a SQL table or query through a DB-API connection: ``connect`` is a function returning one
    (what ``from_url`` makes from a SQLAlchemy URL, or an Airflow hook's ``get_conn``)."""

    def __init__(self, connect: Callable, name: str, max_bytes: int, table: str = DEFAULT_TABLE,
                 query: str | None = None):
        if query is None and not _IDENTIFIER.match(table):
            raise MerchantInputError(f"{name}: {table!r} is not a table name")
        self.connect, self.name, self.max_bytes = connect, name, max_bytes
        # Ordered by id: the same rows give the same content hash, whatever order the database returns them in.
        self.query = query or f"SELECT {', '.join(COLUMNS)} FROM {table} ORDER BY {COLUMNS[0]}"
        self.content_hash: str | None = None
        self.bytes_read = 0

    @classmethod
    def from_url(cls, url: str, max_bytes: int, table: str = DEFAULT_TABLE, query: str | None = None):
        """A source at a SQLAlchemy URL (``sqlite:////path/merchants.db``, ``postgresql://user@host/db``)."""
        def connect():
            import sqlalchemy

            try:
                return sqlalchemy.create_engine(url).raw_connection()
            except Exception as e:  # noqa: BLE001 -- a bad URL or an unreachable server: say which
                raise MerchantInputError(f"{_safe(url)}: cannot connect ({str(e).splitlines()[0][:200]})") from None

        return cls(connect, _safe(url), max_bytes, table, query)

    def batches(self, chunk_rows: int = CHUNK_ROWS) -> Iterator:
        connection = self.connect()
        sha, count = hashlib.sha256(), 0
        try:
            cursor = connection.cursor()
            try:
                cursor.execute(self.query)
            except Exception as e:  # noqa: BLE001 -- each driver has its own errors; the message is what matters
                raise MerchantInputError(f"{self.name}: {self.query!r} failed ({str(e).splitlines()[0][:200]}); "
                                         f"nothing loaded") from None
            header = [d[0] for d in cursor.description]
            _check_header(self.name, header)

            def rows():
                nonlocal count
                number = 0
                while True:
                    fetched = cursor.fetchmany(chunk_rows)
                    if not fetched:
                        return
                    for values in fetched:
                        number += 1
                        record = dict(zip(header, values))
                        encoded = json.dumps([record.get(c) for c in COLUMNS], default=str).encode() + b"\n"
                        count += len(encoded)
                        if count > self.max_bytes:
                            raise MerchantInputError(f"{self.name}: more than the limit of {self.max_bytes:,} bytes "
                                                     f"(setting reference_max_bytes); nothing loaded")
                        sha.update(encoded)
                        yield number, record

            yield from _chunks(rows(), chunk_rows, self.name, what="row")
        finally:
            connection.close()
        self.bytes_read = count
        self.content_hash = sha.hexdigest()


def source_for(text: str, max_bytes: int, options=None, full_table: str = DEFAULT_TABLE):
    """A file path or storage URI -> ``FileSource``; a database URL (``sqlite:``, ``postgresql:`` ...) ->
    ``DatabaseSource``."""
    scheme = urlsplit(text).scheme.split("+")[0]
    if scheme in DATABASE_SCHEMES:
        return DatabaseSource.from_url(text, max_bytes, full_table)
    return FileSource(text, max_bytes, options)


def database_url(conn_id: str, conn_type: str, host: str | None = None, schema: str | None = None,
                 login: str | None = None, password: str | None = None, port: int | None = None) -> str:
    """The SQLAlchemy URL of an Airflow connection's fields (the load_merchants DAG's ``conn_id``): SQLite (the
    file in ``host``, as the SQLite provider keeps it, or in ``schema``, as a ``sqlite:////path`` URI parses) and
    PostgreSQL."""
    from urllib.parse import quote

    if conn_type == "sqlite":
        path = host or schema
        if not path:
            raise MerchantInputError(f"Airflow connection {conn_id!r}: a sqlite connection without a file (host)")
        return f"sqlite:///{path}"
    if conn_type in ("postgres", "postgresql"):
        auth = "" if not login else quote(login, safe="") + (f":{quote(password, safe='')}" if password else "") + "@"
        return f"postgresql://{auth}{host or 'localhost'}{f':{port}' if port else ''}/{schema or ''}"
    raise MerchantInputError(f"Airflow connection {conn_id!r}: type {conn_type!r} is not supported for merchants "
                             f"(sqlite, postgres)")


def _check_header(name: str, header: list[str]) -> None:
    duplicated = sorted({h for h in header if header.count(h) > 1})
    missing = [c for c in COLUMNS if c not in header]
    unknown = [h for h in header if h not in COLUMNS]
    if duplicated or missing or unknown:
        problems = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unknown {', '.join(map(repr, unknown))}"] if unknown else []) + (
            [f"repeated {', '.join(duplicated)}"] if duplicated else [])
        raise MerchantInputError(f"{name}: wrong header ({'; '.join(problems)}); expected the columns "
                                 f"{', '.join(COLUMNS)}; nothing loaded")


def _chunks(rows: Iterator[tuple[int, dict]], chunk_rows: int, name: str, what: str = "line") -> Iterator:
    import pyarrow as pa

    schema = staged_schema()
    chunk, total = [], 0
    for number, values in rows:
        chunk.append({**typed_row(values, f"{name}: {what} {number}"), "source_line": number})
        if len(chunk) >= chunk_rows:
            total += len(chunk)
            yield pa.RecordBatch.from_pylist(chunk, schema=schema)
            chunk = []
    if chunk:
        total += len(chunk)
        yield pa.RecordBatch.from_pylist(chunk, schema=schema)
    if total == 0:
        raise MerchantInputError(f"{name}: no merchants in it (the header only); nothing loaded")


def _safe(url: str) -> str:
    """A URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@", 1)
    return url
