"""The SQL server's users: ``eventlake sql-server users add|remove|list``, and the password file they live in.

One user a line, ``name:pbkdf2-sha512:iterations:salt:hash:tables`` (salt and hash in base64; tables ``*`` for every
table, or the comma-separated read models the user may read), mode 0600. Passwords are stored only as salted
PBKDF2-HMAC-SHA512 hashes, the same function the server's login check (``infra/sql_guard``:
``eventlake.sql.PasswordFileAuthenticator``) computes in Java; grants are enforced on the server by
``eventlake.sql.GrantsExtension``. The server reads the file again whenever it changes: a user added, removed or
re-granted counts from their next login or statement, without a restart.
"""
from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from lakehouse.settings import Settings
from lakehouse.errors import BadInput
from lakehouse.files import write_whole

__all__ = ["SqlUser", "SqlUsersError", "DEFAULT_USER", "users_file", "list_users", "add_user", "remove_user",
           "ensure_default_user"]

DEFAULT_USER = "eventlake"
SCHEME = "pbkdf2-sha512"
# OWASP's figure for PBKDF2-HMAC-SHA512; a login costs the server ~0.1-0.3 s of one core.
ITERATIONS = 210_000
MIN_PASSWORD = 8
_USER = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_TABLE = re.compile(r"[a-z][a-z0-9_]{0,127}")
_HEADER = ("# eventlake sql-server users (`eventlake sql-server users add|remove|list`): "
           f"name:{SCHEME}:iterations:salt:hash:tables (\"*\" = every table)\n")


class SqlUsersError(BadInput, ValueError):
    """A user name, password or grant that cannot be used, or a user that is not there; the message says which."""


@dataclass(frozen=True)
class SqlUser:
    name: str
    # None: every table; otherwise the only tables this user may read.
    tables: tuple[str, ...] | None

    def describe(self) -> str:
        return f"{self.name}\t{'all tables' if self.tables is None else ', '.join(self.tables) or 'no table'}"


def users_file(settings: Settings) -> Path:
    return settings.sql_server_users_file or settings.home / "sql-server" / "users"


def _read(path: Path) -> dict[str, str]:
    """name -> its whole line, in file order."""
    if not path.exists():
        return {}
    lines = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            lines[line.split(":", 1)[0]] = line
    return lines


def _write(path: Path, lines: dict[str, str]) -> None:
    # A new file renamed over the old: the server never reads half a file, and sees a new inode.
    write_whole(path, _HEADER + "".join(f"{line}\n" for line in lines.values()), mode=0o600)


def list_users(settings: Settings) -> list[SqlUser]:
    users = []
    for name, line in _read(users_file(settings)).items():
        tables = line.rsplit(":", 1)[1]
        users.append(SqlUser(name, None if tables == "*" else tuple(t for t in tables.split(",") if t)))
    return users


def _check_name(name: str) -> None:
    if not _USER.fullmatch(name or ""):
        raise SqlUsersError(f"user name {name!r} is refused: use 1 to 64 letters, digits or _ . @ -")


def add_user(settings: Settings, name: str, password: str, tables: list[str] | None = None) -> bool:
    """Add ``name`` (or replace their password and grants) -> whether they were there already. ``tables``: the
    only tables they may read (None: every table)."""
    _check_name(name)
    if len(password) < MIN_PASSWORD:
        raise SqlUsersError(f"the password for user {name} is refused: it must have at least {MIN_PASSWORD} "
                            f"characters")
    if tables is not None:
        tables = [t.strip().lower() for t in tables if t.strip()]
        bad = [t for t in tables if not _TABLE.fullmatch(t)]
        if bad or not tables:
            raise SqlUsersError(f"the grant of user {name} is refused: {', '.join(bad) or 'no table'} is not a "
                                f"table name (the read models' names, e.g. account_summary,payments)")
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, ITERATIONS)
    grant = "*" if tables is None else ",".join(dict.fromkeys(tables))
    path = users_file(settings)
    lines = _read(path)
    existed = name in lines
    lines[name] = (f"{name}:{SCHEME}:{ITERATIONS}:{base64.b64encode(salt).decode()}:"
                   f"{base64.b64encode(digest).decode()}:{grant}")
    _write(path, lines)
    return existed


def remove_user(settings: Settings, name: str) -> None:
    path = users_file(settings)
    lines = _read(path)
    if name not in lines:
        raise SqlUsersError(f"user {name} is not a user of the SQL server ({path})")
    del lines[name]
    _write(path, lines)


def ensure_default_user(settings: Settings) -> str | None:
    """On a fresh machine (password logins and no users file yet): the user ``eventlake`` with a generated
    password -> that password, for the caller to show once; None when the file exists."""
    path = users_file(settings)
    if settings.sql_server_auth != "password" or path.exists():
        return None
    password = secrets.token_urlsafe(18)
    add_user(settings, DEFAULT_USER, password)
    return password
