"""A running `eventlake sql-server` for a test module (one start per module), and a real HiveServer2 client.

The server is started with logins off (``sql_server_auth="none"``, allowed on loopback only): the modules that
use this test what SQL may do once connected (functions, literals), not who may connect
(tests/integration/test_sql_server.py does that)."""
from __future__ import annotations

import socket
from contextlib import contextmanager
from typing import Iterator

from eventlake import sql_server
from lakehouse.settings import Settings

__all__ = ["free_port", "server_settings", "running_server", "thrift_rows"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_settings(home) -> Settings:
    """Settings of a server of its own: its home, a free port, few shuffle partitions, no logins."""
    settings = Settings.load({}).replace(home=home, sql_server_port=free_port(), spark_shuffle_partitions=2)
    if hasattr(settings, "sql_server_auth"):
        settings = settings.replace(sql_server_auth="none")
    return settings


@contextmanager
def running_server(settings: Settings) -> Iterator[Settings]:
    """The server over ``settings``' warehouse (its tables written before), stopped on exit."""
    sql_server.start(settings, log=lambda *_: None)
    try:
        yield settings
    finally:
        sql_server.stop(settings, log=lambda *_: None)


def thrift_rows(settings: Settings, sql: str) -> list[tuple]:
    """``sql`` through PyHive (Thrift, SASL PLAIN, as BI tools and beeline connect), on a connection of its own."""
    from pyhive import hive

    with hive.connect(host="127.0.0.1", port=settings.sql_server_port, username="analyst") as conn:
        cursor = conn.cursor()
        cursor.execute(sql)
        return [tuple(r) for r in cursor.fetchall()]
