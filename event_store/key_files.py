"""The subject key store's files (issue 45): the one owner of their format, in a directory of a home
(``<home>/subject-keys/``, files of mode 0600). ``event_store.personal_data.SubjectKeys`` seals and unseals with the
keys; this module keeps them.

- ``keys.json``: a snapshot of every record, written whole (a temporary file, fsync, rename, fsync of the
  directory);
- ``keys.journal``: the records made since, one JSON line each, appended under the store's lock (``.lock``, flock)
  and fsynced (at once, or by :meth:`KeyFiles.sync` once per transaction with ``defer_sync``). Making a key appends
  one line, whatever the number of subjects (the first version rewrote the whole file per key: its cost grew with
  the customers, bench/commands.py --sealing). Forgetting a subject **compacts**: a new snapshot with the tombstone
  and without the key, then a new empty journal (the old one held the key's bytes); so does a journal grown past
  ``compact_after`` lines (and the snapshot's records).

Several processes on one home share the files; a kill at any moment leaves the old snapshot or the new one, and at
most a partial last journal line, which readers ignore and the next writer cuts off. The files hold subject ids and
keys only, never a value. :class:`KeyRecord` is a record of either file, and what a compacted Kafka keys topic
would carry.
"""
from __future__ import annotations

import binascii
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from lakehouse.errors import BadInput
from lakehouse.files import write_whole

__all__ = ["KeyRecord", "KeyFiles", "KEY_BYTES", "SNAPSHOT_FILE", "JOURNAL_FILE", "COMPACT_AFTER", "b64url",
           "unb64url", "merge_record"]

FORMAT = "eventlake-subject-keys/1"
SNAPSHOT_FILE = "keys.json"
JOURNAL_FILE = "keys.journal"
COMPACT_AFTER = 4096  # journal lines: beyond these (and beyond the snapshot's records), the next change compacts
KEY_BYTES = 32   # AES-256
_URL_SAFE = bytes.maketrans(b"+/", b"-_")
_FROM_URL_SAFE = bytes.maketrans(b"-_", b"+/")


def b64url(raw: bytes) -> str:
    """``raw`` as base64url without padding."""
    return binascii.b2a_base64(raw, newline=False).translate(_URL_SAFE).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes | None:
    """base64url without padding -> bytes; None for anything else (other characters, padding, a bad length)."""
    if "+" in text or "/" in text or "=" in text:
        return None
    try:
        raw = (text + "=" * (-len(text) % 4)).encode("ascii").translate(_FROM_URL_SAFE)
        return binascii.a2b_base64(raw, strict_mode=True)
    except (binascii.Error, ValueError):  # UnicodeEncodeError is a ValueError
        return None


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One subject's entry: its data key, or a tombstone saying when it was forgotten. As a record of a compacted
    Kafka topic (:meth:`encode`) the tombstone is a value of its own, not Kafka's null value: compaction removes
    null tombstones after ``delete.retention.ms``, and with them the memory that the subject must never get a key
    again. Every key store holds one per subject in memory: ~263 bytes with its dict entry (392 without slots)."""
    subject: str
    key: bytes | None
    forgotten_at: str | None = None

    @property
    def forgotten(self) -> bool:
        return self.key is None

    def to_json(self) -> dict[str, Any]:
        if self.key is None:
            return {"subject": self.subject, "forgotten_at": self.forgotten_at}
        return {"subject": self.subject, "key": b64url(self.key)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> KeyRecord:
        subject, key = obj.get("subject"), obj.get("key")
        if not isinstance(subject, str) or not subject:
            raise BadInput(f"subject key record {obj!r}: no subject id")
        if key is None:
            return cls(subject, None, obj.get("forgotten_at"))
        raw = unb64url(key) if isinstance(key, str) else None
        if raw is None or len(raw) != KEY_BYTES:
            raise BadInput(f"subject key record of {subject!r}: the key is not {KEY_BYTES} bytes of base64url")
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


def merge_record(records: dict[str, KeyRecord], record: KeyRecord) -> bool:
    """``record`` taken into ``records``: a tombstone wins over a key, a subject's first key stays. -> whether it
    added a tombstone."""
    known = records.get(record.subject)
    if known is None or (record.forgotten and not known.forgotten):
        records[record.subject] = record
        return record.forgotten
    return False


class KeyFiles:
    """The records of a key store's directory, in memory (``records``: subject -> record) and on disk (module
    docstring). ``on_reload`` is called after every whole read (the store was compacted, by a forgetting or a
    long journal, here or in another process)."""

    def __init__(self, directory: str | os.PathLike, defer_sync: bool = False, compact_after: int = COMPACT_AFTER,
                 on_reload: Callable[[], None] = lambda: None):
        self.directory = Path(directory)
        self.compact_after = compact_after
        self.path = self.directory / SNAPSHOT_FILE
        self.journal = self.directory / JOURNAL_FILE
        self.defer_sync = defer_sync
        self.records: dict[str, KeyRecord] = {}
        self.forgotten = 0  # tombstones among the records
        self._on_reload = on_reload
        self._unsynced = False
        self._stamp: tuple[int, int, int] | None = None  # the snapshot's (inode, mtime, size) when read
        self._journal_at: tuple[int, int] | None = None  # the journal's (inode, bytes read) when read
        self._journal_lines = 0
        self._snapshot_size = 0  # records in the snapshot
        self.reload()

    def reload(self) -> None:
        """Read the snapshot and the journal again (missing files are an empty store)."""
        for _ in range(20):
            stamp = _stamp_of(self.path)
            records = self._read_snapshot()
            snapshot_size = len(records)
            journal = self._read_journal(records, 0, None, 0)
            if _stamp_of(self.path) == stamp:  # no compaction meanwhile (else its journal may miss records)
                break
        self.records, self._stamp, self._snapshot_size = records, stamp, snapshot_size
        self._journal_at, self._journal_lines, _ = journal
        self.forgotten = sum(1 for r in records.values() if r.forgotten)
        self._on_reload()

    def _read_snapshot(self) -> dict[str, KeyRecord]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format') if isinstance(doc, dict) else None!r}, "
                                 f"not {FORMAT!r}")
            return {r.subject: r for r in (KeyRecord.from_json(obj) for obj in doc["records"])}
        except (ValueError, KeyError, TypeError) as e:
            raise BadInput(f"subject key store {self.path}: unreadable ({e}); it is not rewritten, so no key is "
                           f"lost: restore it from a backup or the keys topic") from e

    def _read_journal(self, records: dict[str, KeyRecord], offset: int, inode: int | None,
                      lines_before: int) -> tuple[tuple[int, int] | None, int, int]:
        """Apply the journal's whole lines from ``offset`` (of the file ``inode``; another inode: from its start) to
        ``records`` (in place) -> (the journal's (inode, bytes read), its lines read in all, ``lines_before`` being
        those before ``offset``, the tombstones it added). A partial last line (a writer killed while appending) is
        left unread."""
        try:
            with open(self.journal, "rb") as f:
                stat = os.fstat(f.fileno())
                if inode is not None and stat.st_ino != inode:
                    offset, lines_before = 0, 0
                f.seek(offset)
                raw = f.read()
        except FileNotFoundError:
            return None, 0, 0
        whole = raw[:raw.rfind(b"\n") + 1]
        lines = whole.splitlines()
        tombstones = 0
        for n, line in enumerate(lines):
            try:
                tombstones += merge_record(records, KeyRecord.from_json(json.loads(line)))
            except (ValueError, TypeError) as e:
                raise BadInput(f"subject key store {self.journal}: line {lines_before + n + 1} unreadable ({e}); it "
                               f"is not rewritten, so no key is lost: restore it from a backup or the keys "
                               f"topic") from e
        return (stat.st_ino, offset + len(whole)), lines_before + len(lines), tombstones

    def refresh(self) -> bool:
        """Read what another process changed since (a key made, a subject forgotten): two stats when nothing did, the
        new journal lines when keys were made, everything after a compaction. True if something was read."""
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
        self._journal_at, self._journal_lines, tombstones = self._read_journal(
            self.records, self._journal_at[1], self._journal_at[0], self._journal_lines)
        self.forgotten += tombstones
        if _stamp_of(self.path) != self._stamp:  # compacted meanwhile: its new journal may miss records
            self.reload()
        return True

    def change(self, change: Callable[[Mapping[str, KeyRecord]], list[KeyRecord]]) -> list[KeyRecord]:
        """Under the store's lock: read what changed, ask ``change`` (given the records, read-only) for the records it
        makes, then append them to the journal (fsynced now, or by :meth:`sync` with ``defer_sync``), or compact when
        one forgets a subject (a key's bytes must leave the files) or the journal grew long -> those records. Its
        cost does not grow with the store (but a compaction's, once per as many keys as the snapshot holds)."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(self.directory / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.refresh()
            made = change(self.records)
            if not made:
                return made
            grown = self._journal_lines + len(made) > max(self.compact_after, self._snapshot_size)
            if grown or any(r.forgotten for r in made):
                current = dict(self.records)
                for record in made:
                    merge_record(current, record)
                self._compact(current)
            else:
                self._append(made)
                for record in made:  # keys only: a tombstone compacts
                    merge_record(self.records, record)
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
        doc = {"format": FORMAT, "records": [r.to_json() for r in records.values()]}
        write_whole(self.path, json.dumps(doc, indent=0, sort_keys=True), mode=0o600, durable=True)
        if self.journal.exists():
            write_whole(self.journal, b"", mode=0o600, durable=True)
        self._unsynced = False
        self.reload()


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
