"""The SQL verbs: query, sql-server (and its users), history."""
from __future__ import annotations

import sys

from lakehouse.settings import Settings

__all__ = ["ROLES", "add_verbs"]

# The Kafka principal each verb runs as when SASL is on (the others: admin); see eventlake.cli.roles.
ROLES = {"query": "reader", "sql-server": "reader", "history": "reader"}


def _cmd_query(settings: Settings, args) -> int:
    from eventlake.query import (QueryError, describe_as_of, format_csv, format_json_lines, format_table,
                                 logical_tables, parse_as_of, query_duckdb, query_spark)

    run = query_spark if args.engine == "spark" else query_duckdb
    try:
        as_of = None if args.as_of is None else parse_as_of(args.as_of)
        travelled = {} if as_of is None else logical_tables(settings, as_of)
        if travelled:
            print(f"eventlake query: {describe_as_of(travelled, as_of)}", file=sys.stderr)
        columns, rows = run(settings, args.sql, as_of)
    except QueryError as e:
        print(f"eventlake query: {e}", file=sys.stderr)
        return 2
    if args.format == "csv":
        text = format_csv(columns, rows)
    elif args.format == "json":
        text = format_json_lines(columns, rows)
    else:
        text = format_table(columns, rows, max_rows=args.max_rows)
    if text:
        print(text)
    return 0


def _cmd_history(settings: Settings, args) -> int:
    from eventlake.history import HistoryError, format_history, history

    try:
        what, lines = history(settings, args.name, args.generation, args.limit)
    except HistoryError as e:
        print(f"eventlake history: {e}", file=sys.stderr)
        return 2
    print(format_history(what, lines))
    return 0


def _read_new_password(name: str, from_stdin: bool) -> str:
    """A password from one line of stdin, or typed twice at a prompt that does not echo it."""
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    import getpass

    password = getpass.getpass(f"password for {name}: ")
    if getpass.getpass(f"password for {name} (again): ") != password:
        raise ValueError(f"the two passwords typed for user {name} differ; nothing changed")
    return password


def _cmd_sql_users(settings: Settings, args) -> int:
    from eventlake import sql_users

    try:
        if args.users_action == "list":
            users = sql_users.list_users(settings)
            for user in users:
                print(user.describe())
            if not users:
                print(f"no users yet ({sql_users.users_file(settings)}); `eventlake sql-server start` makes one")
        elif args.users_action == "add":
            tables = None if args.tables is None else args.tables.split(",")
            password = _read_new_password(args.name, args.password_stdin)
            existed = sql_users.add_user(settings, args.name, password, tables)
            grant = "every table" if tables is None else ", ".join(t.strip() for t in tables if t.strip())
            print(f"sql-server: user {args.name} {'changed' if existed else 'added'} (may read {grant}); "
                  f"takes effect at their next login")
        else:
            sql_users.remove_user(settings, args.name)
            print(f"sql-server: user {args.name} removed; new logins as {args.name} are refused")
    except ValueError as e:  # SqlUsersError, or passwords typed differently
        print(f"eventlake sql-server users: {e}", file=sys.stderr)
        return 2
    return 0


def _cmd_sql_server(settings: Settings, args) -> int:
    from eventlake import sql_server

    if args.action == "users":
        return _cmd_sql_users(settings, args)
    try:
        if args.action == "start":
            sql_server.start(settings)
        elif args.action == "stop":
            sql_server.stop(settings)
        elif args.action == "serve":
            sql_server.serve(settings)
        else:
            state = sql_server.status(settings)
            print(state.describe())
            return 0 if state.running else 3
    except sql_server.SqlServerError as e:
        print(f"eventlake sql-server: {e}", file=sys.stderr)
        return 1
    return 0


def add_verbs(sub) -> None:
    """Add this group's verbs to the ``eventlake`` parser's subparsers."""
    p = sub.add_parser("query", help="run SQL over the read models and print the rows (read-only)",
                       description="Runs one read (SELECT, WITH ..., DESCRIBE, SHOW, EXPLAIN) over the read models, "
                                   "each resolved through the catalog to its current generation; a statement that "
                                   "would change a table, or names a table folder by path, is refused.")
    p.add_argument("sql")
    p.add_argument("--engine", choices=("duckdb", "spark"), default="duckdb",
                   help="duckdb: embedded and fast (default); spark: Spark SQL")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="table: aligned columns, the first --max-rows rows (default); csv: every row, with a "
                        "header; json: every row as one JSON object per line")
    p.add_argument("--max-rows", type=int, default=50, help="rows shown by --format table (default 50)")
    p.add_argument("--as-of", metavar="VERSION|TIME",
                   help="time travel: every table at this Delta version, or as it was at this UTC time (the "
                        "generations current then, e.g. 2026-11-24T06:00:00Z); `eventlake history NAME` lists them")
    p.set_defaults(run=_cmd_query)

    p = sub.add_parser("sql-server", help="Spark's Thrift (JDBC/ODBC) server over the read models, read-only",
                       description="start: runs the server in the background and waits until it accepts JDBC "
                                   "connections at jdbc:hive2://HOST:PORT/default (EVENTLAKE_SQL_SERVER_HOST, default "
                                   "127.0.0.1; EVENTLAKE_SQL_SERVER_PORT, default 10000); stop: SIGTERM; status: "
                                   "exit 0 when running, 3 when not; serve: the server in the foreground (what start "
                                   "runs). Every read model, late_events, event_archive and event_dead_letters is a "
                                   "table of that name, following the catalog's switches without a restart. "
                                   "Logins need a user and password (users: manage them; the first start makes "
                                   "the user eventlake and prints its password once); docs/sql-security.md says "
                                   "how a BI tool connects, with TLS (EVENTLAKE_SQL_SERVER_TLS=on).")
    actions = p.add_subparsers(dest="action", required=True, metavar="{start,stop,status,serve,users}")
    for action in ("start", "stop", "status", "serve"):
        actions.add_parser(action)
    users = actions.add_parser("users", help="who may log in, and which tables each may read",
                               description="Users of the SQL server, their hashed passwords and grants, in the "
                                           "users file (EVENTLAKE_SQL_SERVER_USERS_FILE, default "
                                           "<home>/sql-server/users). Changes count from the next login, without "
                                           "a restart.")
    user_actions = users.add_subparsers(dest="users_action", required=True)
    add = user_actions.add_parser("add", help="add a user, or change their password and grant",
                                  description="Prompts for the password twice (not echoed), or reads one line of "
                                              "stdin with --password-stdin.")
    add.add_argument("name")
    add.add_argument("--tables", metavar="A,B", help="the only tables (read models) this user may read; "
                                                     "default: every table")
    add.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    user_actions.add_parser("remove", help="remove a user").add_argument("name")
    user_actions.add_parser("list", help="the users and what each may read")
    p.set_defaults(run=_cmd_sql_server)

    p = sub.add_parser("history", help="a table's commits (version, time, operation, rows, by whom), newest first",
                       description="A read model's current generation (or --generation N): its Delta commits with the "
                                   "projection batch, rebuild or reprocess that made each, and the catalog's changes "
                                   "of the name (created, switched, dropped); also event_archive, "
                                   "event_dead_letters. A version is what `eventlake query --as-of VERSION` reads.")
    p.add_argument("name")
    p.add_argument("--generation", type=int, help="a generation other than the current one")
    p.add_argument("--limit", type=int, default=30, help="the newest commits shown (default 30)")
    p.set_defaults(run=_cmd_history)
