"""Personal data on the write side: per-subject data keys, sealed values, and the schemas' personal fields (issue 45).

Crypto-shredding: every personal value is encrypted (AES-256-GCM) under a key of its *data subject* (the person it
is about, named by a pseudonymous id such as ``customer_id``), so that deleting the subject's key erases every copy
of the value at once, wherever the ciphertext went (the events topic, the archive, Delta history, snapshots, dead
letters). This module is the one place that seals and unseals; every reader goes through it (docs/forgetting.md).

- :class:`SubjectKeys`: the key store under a directory (``<home>/subject-keys/``, files of mode 0600): a snapshot
  (``keys.json``, written whole and atomically) and a journal of the keys made since (``keys.journal``, one record
  per line, appended). A key is made on first use; :meth:`SubjectKeys.forget` replaces it
  with a tombstone, for good: a forgotten subject never gets a key again, and :meth:`SubjectKeys.seal` refuses
  (:class:`SubjectForgotten`) to seal new data of it. Refused rather than stored as null: a null would silently drop
  a value a command carried (and break a required field's schema), while a refusal becomes the command's rejection
  with a reason, never a silent loss; and a fresh key would make the person readable again, which is what the
  forgetting promised would not happen. Its records (:class:`KeyRecord`: subject id -> key, or a tombstone) are
  what a compacted Kafka keys topic will carry later.
- Tokens (:func:`seal_value`, :func:`unseal_value`): ``elk1:<subject>:<field>:<sealed>``, the subject id in
  base64url, the field name as it is, and base64url of the 12-byte nonce followed by the ciphertext and GCM tag.
  The associated data binds the token to its subject and field, so an edited subject or field fails to
  authenticate; the payload helpers also check that a token sits in the field and under the subject it names.
- :func:`personal_fields`: the names of a schema's fields marked ``Field(personal=True)``.
"""
from __future__ import annotations

import binascii
import fcntl
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from event_store.fields import Field
from lakehouse.errors import BadInput, NotFound, Refused
from lakehouse.files import write_whole

__all__ = ["SubjectKeys", "KeyRecord", "SealedValueError", "SubjectForgotten", "SubjectKeyMissing", "TOKEN_PREFIX",
           "keys_dir", "is_sealed", "token_head", "token_subject", "associated_data", "personal_fields",
           "personal_fields_by_type", "seal_payload", "unseal_payload"]

TOKEN_PREFIX = "elk1:"
_PREFIX_LENGTH = len(TOKEN_PREFIX)
_FORMAT = "eventlake-subject-keys/1"
_FILE = "keys.json"
_JOURNAL = "keys.journal"
_COMPACT_AFTER = 4096  # journal lines: beyond these (and beyond the snapshot's records), the next change compacts
_KEY_BYTES = 32   # AES-256
_NONCE_BYTES = 12  # GCM's standard nonce; random per value (2^32 values per subject stay far inside its bound)
_FIELD_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
_SCALARS = (str, int, float, bool, type(None))
_ENCODE = json.JSONEncoder(allow_nan=False).encode  # json.dumps with allow_nan=False builds an encoder per call
_DECODE = msgspec.json.decode  # the JSON text a token holds (a scalar): as json.loads reads it, faster


class SealedValueError(BadInput, ValueError):
    """A token that cannot be unsealed: not a token, corrupt, tampered with, or moved to another field or subject."""


class SubjectForgotten(Refused):
    """New personal data of a subject whose key was deleted: refused, so that it is never readable again."""


class SubjectKeyMissing(NotFound):
    """A token of a subject the key store never knew (neither a key nor a tombstone): the wrong store, or a lost
    one. Never read as null: that would make a misconfigured home look like an erasure."""


def keys_dir(home: str | os.PathLike) -> Path:
    """Where a home keeps its subject keys."""
    return Path(home) / "subject-keys"


@dataclass(frozen=True)
class KeyRecord:
    """One subject's entry: its data key, or a tombstone saying when it was forgotten. As a record of a compacted
    Kafka topic (:meth:`encode`) the tombstone is a value of its own, not Kafka's null value: compaction removes
    null tombstones after ``delete.retention.ms``, and with them the memory that the subject must never get a key
    again."""
    subject: str
    key: bytes | None
    forgotten_at: str | None = None

    @property
    def forgotten(self) -> bool:
        return self.key is None

    def to_json(self) -> dict[str, Any]:
        if self.key is None:
            return {"subject": self.subject, "forgotten_at": self.forgotten_at}
        return {"subject": self.subject, "key": _b64(self.key)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> KeyRecord:
        subject, key = obj.get("subject"), obj.get("key")
        if not isinstance(subject, str) or not subject:
            raise BadInput(f"subject key record {obj!r}: no subject id")
        if key is None:
            return cls(subject, None, obj.get("forgotten_at"))
        raw = _unb64(key) if isinstance(key, str) else None
        if raw is None or len(raw) != _KEY_BYTES:
            raise BadInput(f"subject key record of {subject!r}: the key is not {_KEY_BYTES} bytes of base64url")
        return cls(subject, raw)

    def encode(self) -> tuple[bytes, bytes]:
        """(Kafka key, value) of this record on a compacted keys topic: the subject id, and the record's JSON."""
        return self.subject.encode("utf-8"), json.dumps(self.to_json(), sort_keys=True).encode("utf-8")

    @classmethod
    def decode(cls, key: bytes, value: bytes) -> KeyRecord:
        record = cls.from_json(json.loads(value))
        if record.subject != key.decode("utf-8"):
            raise BadInput(f"subject key record keyed {key!r} names subject {record.subject!r}")
        return record


class SubjectKeys:
    """The data keys of every subject, in files under ``directory``, durable across restarts.

    A snapshot (``keys.json``, every record, written whole: a temporary file, fsync, rename, fsync of the directory)
    and a journal (``keys.journal``: the records of the keys made since, one JSON line each, appended under the
    store's lock and fsynced). Making a key appends one line, whatever the number of subjects (the first version
    rewrote the whole file per key: its cost grew with the customers, bench/commands.py --sealing). Forgetting a
    subject **compacts**: a new snapshot with the tombstone and without the key, then a new empty journal (the old
    one held the key's bytes); so does a journal grown past ``compact_after`` lines (and the snapshot's records). Several processes on one home
    share the files; a kill at any moment leaves the old snapshot or the new one, and at most a partial last journal
    line, which readers ignore and the next writer cuts off. The files hold subject ids and keys only, never a value.

    A reader that meets a subject it does not know reads the new journal lines once (another process may have made
    the key); one that holds a key forgotten elsewhere since still reads with it until it :meth:`refresh` es (the
    keys topic of a later slice tells every reader at once). ``defer_sync`` (the command handler's): appended keys
    are fsynced by :meth:`sync`, once per transaction before it commits, not once per key."""

    def __init__(self, directory: str | os.PathLike, defer_sync: bool = False, compact_after: int = _COMPACT_AFTER):
        self.directory = Path(directory)
        self.compact_after = compact_after
        self.path = self.directory / _FILE
        self.journal = self.directory / _JOURNAL
        self.defer_sync = defer_sync
        self._unsynced = False
        self._records: dict[str, KeyRecord] = {}
        self._ciphers: dict[str, AESGCM] = {}
        self._sealing: dict[tuple[str, str], tuple[bytes, str]] = {}  # (subject, field) -> (associated data, head)
        # (subject as in tokens, field) -> (subject, associated data): what unseal worked out of a token's head
        self._opening: dict[tuple[str, str], tuple[str, bytes]] = {}
        self._stamp: tuple[int, int, int] | None = None  # the snapshot's (inode, mtime, size) when read
        self._journal_at: tuple[int, int] | None = None  # the journal's (inode, bytes read) when read
        self._journal_lines = 0
        self._snapshot_size = 0  # records in the snapshot
        self.reload()

    # -- the records --------------------------------------------------------------------------------------------

    def reload(self) -> None:
        """Read the snapshot and the journal again (missing files are an empty store)."""
        for _ in range(20):
            stamp = _stamp_of(self.path)
            records = self._read_snapshot()
            snapshot_size = len(records)
            journal = self._read_journal(records, 0, None, 0)
            if _stamp_of(self.path) == stamp:  # no compaction meanwhile (else its journal may miss records)
                break
        self._records, self._stamp, self._snapshot_size = records, stamp, snapshot_size
        self._journal_at, self._journal_lines = journal
        # Keys never change, so a cipher made from a subject's key stays right while the subject keeps it.
        self._ciphers = {s: c for s, c in self._ciphers.items()
                         if s in self._records and not self._records[s].forgotten}

    def _read_snapshot(self) -> dict[str, KeyRecord]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
                raise ValueError(f"format {doc.get('format') if isinstance(doc, dict) else None!r}, "
                                 f"not {_FORMAT!r}")
            return {r.subject: r for r in (KeyRecord.from_json(obj) for obj in doc["records"])}
        except (ValueError, KeyError, TypeError) as e:
            raise BadInput(f"subject key store {self.path}: unreadable ({e}); it is not rewritten, so no key is "
                           f"lost: restore it from a backup or the keys topic") from e

    def _read_journal(self, records: dict[str, KeyRecord], offset: int, inode: int | None,
                      lines_before: int) -> tuple[tuple[int, int] | None, int]:
        """Apply the journal's whole lines from ``offset`` (of the file ``inode``; another inode: from its start) to
        ``records`` (in place) -> (the journal's (inode, bytes read), its lines read in all, ``lines_before`` being
        those before ``offset``). A partial last line (a writer killed while appending) is left unread."""
        try:
            with open(self.journal, "rb") as f:
                stat = os.fstat(f.fileno())
                if inode is not None and stat.st_ino != inode:
                    offset, lines_before = 0, 0
                f.seek(offset)
                raw = f.read()
        except FileNotFoundError:
            return None, 0
        whole = raw[:raw.rfind(b"\n") + 1]
        lines = whole.splitlines()
        for n, line in enumerate(lines):
            try:
                _merge(records, KeyRecord.from_json(json.loads(line)))
            except (ValueError, TypeError) as e:
                raise BadInput(f"subject key store {self.journal}: line {lines_before + n + 1} unreadable ({e}); it "
                               f"is not rewritten, so no key is lost: restore it from a backup or the keys "
                               f"topic") from e
        return (stat.st_ino, offset + len(whole)), lines_before + len(lines)

    def refresh(self) -> bool:
        """Read what another process changed since (a key made, a subject forgotten): two stats when nothing did, the
        new journal lines when keys were made, everything after a compaction. A long-running reader or writer calls
        it once per batch, so a forgetting elsewhere reaches it within a batch. True if something was read."""
        stamp = _stamp_of(self.path)
        if stamp != self._stamp:
            self.reload()
            return True
        journal = _stamp_of(self.journal)
        if journal is None and self._journal_at is None:
            return False
        if journal is None or self._journal_at is None or journal[0] != self._journal_at[0]:
            self.reload()
            return True
        if journal[2] == self._journal_at[1]:
            return False
        self._journal_at, self._journal_lines = self._read_journal(self._records, self._journal_at[1],
                                                                   self._journal_at[0], self._journal_lines)
        if _stamp_of(self.path) != self._stamp:  # compacted meanwhile: its new journal may miss records
            self.reload()
        return True

    def __len__(self) -> int:
        """How many subjects this store knows (keys and tombstones): 0 for a home that never sealed a value."""
        return len(self._records)

    def records(self) -> Iterator[KeyRecord]:
        """Every subject's record, keys and tombstones (what a compacted keys topic would hold)."""
        return iter(list(self._records.values()))

    def apply(self, records: Iterable[KeyRecord]) -> None:
        """Take ``records`` (from another store, or a keys topic) into this one and write it. A tombstone always
        wins over a key, and a subject's existing key is never replaced by another."""
        def change(current: Mapping[str, KeyRecord]) -> list[KeyRecord]:
            taken: dict[str, KeyRecord] = {}
            for record in records:
                known = taken.get(record.subject) or current.get(record.subject)
                if record.forgotten and (known is None or not known.forgotten):
                    taken[record.subject] = record
                elif not record.forgotten and known is None:
                    taken[record.subject] = record
                elif not record.forgotten and not known.forgotten and known.key != record.key:
                    raise Refused(f"subject {record.subject!r} has another key in {self.path}; keys never change")
            return list(taken.values())
        self._change(change)

    def state(self, subject: str) -> str:
        """"key", "forgotten" or "unknown"."""
        record = self._records.get(subject)
        return "unknown" if record is None else "forgotten" if record.forgotten else "key"

    def key_of(self, subject: str) -> bytes | None:
        """``subject``'s data key, for a reader that decrypts elsewhere (Spark's ``aes_decrypt``, with the token's
        nonce and tag and the same associated data); None when the subject was forgotten. Raises
        :class:`SubjectKeyMissing` when this store never knew it (after reading the file again once)."""
        record = self._records.get(subject)
        if record is None and self.refresh():  # the lines another process appended since, not the whole store
            record = self._records.get(subject)
        if record is None:
            raise SubjectKeyMissing(f"subject {subject!r}: the key store {self.path} has no key and no tombstone "
                                    f"for this subject (another home's token, or a lost key store)")
        return record.key

    def forget(self, subject: str) -> bool:
        """Delete ``subject``'s key for good, leaving a tombstone (so it is never made again). True if this call
        forgot it, False if it was forgotten already. A subject never seen is tombstoned too: its data, should any
        arrive, is refused."""
        _check_subject(subject)
        def change(current: Mapping[str, KeyRecord]) -> list[KeyRecord]:
            if subject in current and current[subject].forgotten:
                return []
            return [KeyRecord(subject, None, datetime.now(timezone.utc).isoformat(timespec="seconds"))]
        done = self._change(change)
        self._ciphers.pop(subject, None)
        return bool(done)

    # -- values ---------------------------------------------------------------------------------------------------

    def seal(self, subject: str, field_name: str, value: Any) -> str:
        """``value`` (a JSON scalar: str, int, float, bool or None) as a token only ``subject``'s key opens, bound to
        ``field_name``. Makes the subject's key on first use; refuses a forgotten subject (:class:`SubjectForgotten`)."""
        # The handler seals every personal value of every event: what depends only on (subject, field) is made
        # once per pair (checks, associated data, the token's head) while the subject keeps its key.
        made = self._sealing.get((subject, field_name))
        if made is None:
            _check_subject(subject)
            _check_field(field_name)
            made = (_associated(subject, field_name), f"{TOKEN_PREFIX}{_b64(subject.encode('utf-8'))}:{field_name}:")
        cipher = self._cipher(subject, create=True, field_name=field_name)
        self._sealing[(subject, field_name)] = made
        if not isinstance(value, _SCALARS):
            raise BadInput(f"field '{field_name}': {type(value).__name__} cannot be sealed; personal values are "
                           f"JSON scalars (str, int, float, bool or null)")
        try:
            plain = _ENCODE(value).encode("ascii")  # \u escapes keep even lone surrogates
        except ValueError as e:
            raise BadInput(f"field '{field_name}': {value!r} cannot be sealed ({e})") from e
        nonce = os.urandom(_NONCE_BYTES)
        return made[1] + _b64(nonce + cipher.encrypt(nonce, plain, made[0]))

    def unseal(self, token: Any, *, subject: str | None = None, field_name: str | None = None) -> Any:
        """The value ``token`` holds, with its type; None when its subject was forgotten (no error). With
        ``subject`` or ``field_name`` given, a token naming another one is refused as moved. Raises
        :class:`SealedValueError` naming the field and the reason when the token is not one, corrupt or tampered
        with, and :class:`SubjectKeyMissing` when this store never knew its subject."""
        if type(token) is str and token.startswith(TOKEN_PREFIX):
            # The readers' hot path: a token of a (subject, field) opened before, whose subject keeps its key.
            parts = token[_PREFIX_LENGTH:].split(":")
            known = self._opening.get((parts[0], parts[1])) if len(parts) == 3 else None
            if known is not None and (field_name is None or field_name == parts[1]) \
                    and (subject is None or subject == known[0]):
                cipher = self._ciphers.get(known[0])
                sealed = _unb64(parts[2]) if cipher is not None else None
                if sealed is not None and len(sealed) >= _NONCE_BYTES + 16:
                    try:
                        plain = cipher.decrypt(sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:], known[1])
                    except InvalidTag:
                        plain = None  # the full path below names it
                    if plain is not None:
                        try:
                            return _DECODE(plain)
                        except msgspec.MsgspecError:  # what msgspec reads otherwise (a lone surrogate)
                            return json.loads(plain)
        return self._unseal(token, subject, field_name)

    def _unseal(self, token: Any, subject: str | None, field_name: str | None) -> Any:
        where = f"field '{field_name}'" if field_name else "a sealed value"
        if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX):
            raise SealedValueError(f"{where}: {_short(token)} is not a sealed value (a token starts with "
                                   f"{TOKEN_PREFIX!r})")
        parts = token[len(TOKEN_PREFIX):].split(":")
        raw_subject = _unb64(parts[0]) if len(parts) == 3 else None
        sealed = _unb64(parts[2]) if len(parts) == 3 else None
        try:
            token_subject = raw_subject.decode("utf-8") if raw_subject else None
        except UnicodeDecodeError:
            token_subject = None
        if token_subject is None or sealed is None or not _FIELD_NAME.match(parts[1]) \
                or len(sealed) < _NONCE_BYTES + 16:
            if field_name is None and len(parts) == 3 and _FIELD_NAME.match(parts[1]):
                where = f"field '{parts[1]}'"
            raise SealedValueError(f"{where}: the token is corrupt (not {TOKEN_PREFIX}<subject>:<field>:<sealed> "
                                   f"with base64url parts and a whole nonce and tag)")
        token_field = parts[1]
        where = f"field '{field_name or token_field}' of subject {token_subject!r}"
        if field_name is not None and token_field != field_name:
            raise SealedValueError(f"{where}: the token was sealed for field '{token_field}' (moved between fields)")
        if subject is not None and token_subject != subject:
            raise SealedValueError(f"field '{token_field}' of subject {subject!r}: the token was sealed for subject "
                                   f"{token_subject!r} (moved between subjects)")
        cipher = self._cipher(token_subject, create=False, field_name=token_field)
        if cipher is None:
            return None
        associated = _associated(token_subject, token_field)
        try:
            plain = cipher.decrypt(sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:], associated)
        except InvalidTag:
            raise SealedValueError(f"{where}: the token does not authenticate (tampered with, corrupt, or sealed "
                                   f"under another key)") from None
        self._opening[(parts[0], token_field)] = (token_subject, associated)
        return json.loads(plain)

    # -- inside ---------------------------------------------------------------------------------------------------

    def _cipher(self, subject: str, create: bool, field_name: str) -> AESGCM | None:
        cipher = self._ciphers.get(subject)
        if cipher is not None:
            return cipher
        record = self._records.get(subject)
        if record is None and self.refresh():  # the lines another process appended since, not the whole store
            record = self._records.get(subject)
        if record is None:
            if not create:
                raise SubjectKeyMissing(f"field '{field_name}' of subject {subject!r}: the key store {self.path} "
                                        f"has no key and no tombstone for this subject (another home's token, or a "
                                        f"lost key store)")
            record = self._make_key(subject)
        if record.forgotten:
            if create:
                raise SubjectForgotten(f"field '{field_name}' of subject {subject!r}: the subject was forgotten "
                                       f"({record.forgotten_at}); its new data is refused, never sealed under a "
                                       f"new key")
            return None
        cipher = self._ciphers[subject] = AESGCM(record.key)
        return cipher

    def _make_key(self, subject: str) -> KeyRecord:
        def change(current: Mapping[str, KeyRecord]) -> list[KeyRecord]:
            if subject in current:  # another process may have made it, or forgotten it, meanwhile
                return []
            return [KeyRecord(subject, AESGCM.generate_key(bit_length=_KEY_BYTES * 8))]
        self._change(change)
        return self._records[subject]

    def _change(self, change) -> list[KeyRecord]:
        """Under the store's lock: read what changed, ask ``change`` (given the records, read-only) for the records it
        makes, then append them to the journal (fsynced now, or by :meth:`sync` with ``defer_sync``), or compact when
        one forgets a subject (a key's bytes must leave the files) or the journal grew long -> those records. Its
        cost does not grow with the store (but a compaction's, once per as many keys as the snapshot holds)."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(self.directory / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.refresh()
            made = change(self._records)
            if not made:
                return made
            grown = self._journal_lines + len(made) > max(self.compact_after, self._snapshot_size)
            if grown or any(r.forgotten for r in made):
                current = dict(self._records)
                for record in made:
                    _merge(current, record)
                self._compact(current)
            else:
                self._append(made)
                for record in made:
                    _merge(self._records, record)
        return made

    def _append(self, records: list[KeyRecord]) -> None:
        """The journal lines of ``records``, appended (after cutting off a partial last line a killed writer left)."""
        created = not self.journal.exists()
        fd = os.open(self.journal, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            whole = self._journal_at[1] if self._journal_at and self._journal_at[0] == os.fstat(fd).st_ino else 0
            if size > whole:  # a partial line: refresh() read every whole line, under this lock
                os.ftruncate(fd, whole)
            os.lseek(fd, whole, os.SEEK_SET)
            data = b"".join(json.dumps(r.to_json(), sort_keys=True).encode("utf-8") + b"\n" for r in records)
            os.write(fd, data)
            if self.defer_sync:
                self._unsynced = True
            else:
                os.fsync(fd)
            self._journal_at = (os.fstat(fd).st_ino, whole + len(data))
            self._journal_lines += len(records)
        finally:
            os.close(fd)
        if created:
            _sync_directory(self.directory)

    @property
    def unsynced(self) -> bool:
        """Keys appended and not yet fsynced (``defer_sync``): :meth:`sync` is due before they are used in a commit."""
        return self._unsynced

    def sync(self) -> None:
        """Make the keys appended since the last call durable (``defer_sync``): before a transaction whose events
        were sealed with them commits."""
        if not self._unsynced:
            return
        fd = os.open(self.journal, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._unsynced = False

    def _compact(self, records: dict[str, KeyRecord]) -> None:
        """A new snapshot of ``records``, then a new empty journal (the old one's bytes gone with its inode)."""
        doc = {"format": _FORMAT, "records": [r.to_json() for r in records.values()]}
        write_whole(self.path, json.dumps(doc, indent=0, sort_keys=True), mode=0o600, durable=True)
        if self.journal.exists():
            write_whole(self.journal, b"", mode=0o600, durable=True)
        self._unsynced = False
        self.reload()


def _merge(records: dict[str, KeyRecord], record: KeyRecord) -> None:
    """``record`` taken into ``records``: a tombstone wins over a key, a subject's first key stays."""
    known = records.get(record.subject)
    if known is None or (record.forgotten and not known.forgotten):
        records[record.subject] = record


def _stamp_of(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- payloads -------------------------------------------------------------------------------------------------------

def is_sealed(value: Any) -> bool:
    """Whether ``value`` looks like a token (a string with the token prefix)."""
    return isinstance(value, str) and value.startswith(TOKEN_PREFIX)


def token_head(subject: str) -> str:
    """What every token of ``subject`` starts with (``<prefix><subject, base64url>:``): the subject's tokens in a
    column are the values ``LIKE token_head(subject) || '%'``."""
    _check_subject(subject)
    return f"{TOKEN_PREFIX}{_b64(subject.encode('utf-8'))}:"


def token_subject(value: Any) -> str | None:
    """The subject a token names (not checked against its key: ``unseal`` does that); None when ``value`` is no
    well-formed token."""
    if not is_sealed(value):
        return None
    parts = value[_PREFIX_LENGTH:].split(":")
    raw = _unb64(parts[0]) if len(parts) == 3 else None
    try:
        return raw.decode("utf-8") if raw else None
    except UnicodeDecodeError:
        return None


def seal_payload(keys: SubjectKeys, subject: str, payload: Mapping[str, Any],
                 personal: Iterable[str]) -> dict[str, Any]:
    """A copy of ``payload`` with each of its ``personal`` fields sealed under ``subject``'s key. An absent or null
    field stays so (a null holds nothing to protect, and an optional field keeps its JSON shape)."""
    out = dict(payload)
    for name in personal:
        if out.get(name) is not None:
            out[name] = keys.seal(subject, name, out[name])
    return out


def unseal_payload(keys: SubjectKeys, subject: str, payload: Mapping[str, Any], personal: Iterable[str],
                   plaintext_ok: bool = False) -> dict[str, Any]:
    """A copy of ``payload`` with each of its ``personal`` fields unsealed (null when ``subject`` was forgotten);
    a token sealed for another field or subject is refused. A personal field holding a plain value is refused too,
    unless ``plaintext_ok`` (events written before sealing was on): then it is passed through as it is."""
    out = dict(payload)
    for name in personal:
        value = out.get(name)
        if value is None:
            continue
        if not is_sealed(value):
            if plaintext_ok:
                continue
            raise SealedValueError(f"field '{name}' of subject {subject!r}: holds a plain value where a sealed one "
                                   f"is expected")
        out[name] = keys.unseal(value, subject=subject, field_name=name)
    return out


def personal_fields(schema: Mapping[str, Field]) -> frozenset[str]:
    """The names of ``schema``'s fields marked personal (``Field(personal=True)``)."""
    return frozenset(name for name, spec in schema.items() if spec.personal)


def personal_fields_by_type(schemas: Mapping[str, Mapping[str, Field]]) -> dict[str, frozenset[str]]:
    """Command or event type -> its personal fields, for the types that have any."""
    return {kind: found for kind, schema in schemas.items() if (found := personal_fields(schema))}


def associated_data(subject: str, field_name: str) -> bytes:
    """The associated data a token of ``subject``'s ``field_name`` is sealed with (for a reader that decrypts
    elsewhere: Spark)."""
    return _associated(subject, field_name)


def _associated(subject: str, field_name: str) -> bytes:
    # Unambiguous for any subject id (a JSON array, not a join with a separator the id could contain).
    return json.dumps(["elk1", subject, field_name], ensure_ascii=False).encode("utf-8")


def _check_subject(subject: Any) -> None:
    if not isinstance(subject, str) or not subject.strip():
        raise BadInput(f"subject id {subject!r}: must be a non-blank string")


def _check_field(field_name: Any) -> None:
    if not isinstance(field_name, str) or not _FIELD_NAME.match(field_name):
        raise BadInput(f"field name {field_name!r}: must be an identifier (letters, digits, _)")


_URL_SAFE = bytes.maketrans(b"+/", b"-_")


def _b64(raw: bytes) -> str:
    return binascii.b2a_base64(raw, newline=False).translate(_URL_SAFE).rstrip(b"=").decode("ascii")


_FROM_URL_SAFE = bytes.maketrans(b"-_", b"+/")


def _unb64(text: str) -> bytes | None:
    """base64url without padding -> bytes; None for anything else (other characters, padding, a bad length)."""
    if "+" in text or "/" in text or "=" in text:
        return None
    try:
        raw = (text + "=" * (-len(text) % 4)).encode("ascii").translate(_FROM_URL_SAFE)
        return binascii.a2b_base64(raw, strict_mode=True)
    except (binascii.Error, ValueError):  # UnicodeEncodeError is a ValueError
        return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text):,} characters)"
