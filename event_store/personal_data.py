"""Personal data on the write side: per-subject data keys, sealed values, and the schemas' personal fields (issue 45).

Crypto-shredding: every personal value is encrypted (AES-256-GCM) under a key of its *data subject* (the person it
is about, named by a pseudonymous id such as ``customer_id``), so that deleting the subject's key erases every copy
of the value at once, wherever the ciphertext went (the events topic, the archive, Delta history, snapshots, dead
letters). This module is the one place that seals and unseals; every reader goes through it (docs/forgetting.md).

- :class:`SubjectKeys`: the key store under a directory (``<home>/subject-keys/``; its files, a snapshot and a
  journal, are ``event_store.key_files``'). A key is made on first use; :meth:`SubjectKeys.forget` replaces it
  with a tombstone, for good: a forgotten subject never gets a key again, and :meth:`SubjectKeys.seal` refuses
  (:class:`SubjectForgotten`) to seal new data of it. Refused rather than stored as null: a null would silently drop
  a value a command carried (and break a required field's schema), while a refusal becomes the command's rejection
  with a reason, never a silent loss; and a fresh key would make the person readable again, which is what the
  forgetting promised would not happen. Its records (:class:`KeyRecord`: subject id -> key, or a tombstone) are
  what the compacted keys topic carries: given one (``event_store.keys_topic``), the store follows it as the truth
  and its files are this machine's copy.
- Tokens (:func:`seal_value`, :func:`unseal_value`): ``elk1:<subject>:<field>:<sealed>``, the subject id in
  base64url, the field name as it is, and base64url of the 12-byte nonce followed by the ciphertext and GCM tag.
  The associated data binds the token to its subject and field, so an edited subject or field fails to
  authenticate; the payload helpers also check that a token sits in the field and under the subject it names.
- :func:`personal_fields`: the names of a schema's fields marked ``Field(personal=True)``.
"""
from __future__ import annotations

import json
import os
import re
from collections import OrderedDict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from event_store.fields import Field
from event_store.key_files import COMPACT_AFTER, KEY_BYTES, KeyFiles, KeyRecord
from event_store.key_files import b64url as _b64
from event_store.key_files import unb64url as _unb64
from lakehouse.errors import BadInput, NotFound, Refused
from lakehouse.faults import fault_point

__all__ = ["SubjectKeys", "KeyRecord", "SealedValueError", "SubjectForgotten", "SubjectKeyMissing", "KeyRaceLost",
           "TOKEN_PREFIX",
           "keys_dir", "is_sealed", "token_head", "token_subject", "associated_data", "personal_fields",
           "personal_fields_by_type", "seal_payload", "unseal_payload"]

TOKEN_PREFIX = "elk1:"
_PREFIX_LENGTH = len(TOKEN_PREFIX)
_NONCE_BYTES = 12  # GCM's standard nonce; random per value (2^32 values per subject stay far inside its bound)
_FIELD_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
_SCALARS = (str, int, float, bool, type(None))
_ENCODE = json.JSONEncoder(allow_nan=False).encode  # json.dumps with allow_nan=False builds an encoder per call
_ENCODE_STR = json.encoder.encode_basestring_ascii  # what _ENCODE does with a str, without its Python frames
_DECODE = msgspec.json.decode  # the JSON text a token holds (a scalar): as json.loads reads it, faster
# What a key store keeps per subject besides its record, bounded (issue 42: a process's memory must not follow the
# number of subjects it ever met): AES-GCM contexts (~2.5 KB each in cryptography 50, made again in ~1 us: at most
# ~40 MB), and the heads of tokens worked out for sealing and for opening (~0.4 KB each: at most ~25 MB each).
# Unbounded, a store that sealed or opened values of 50k subjects held 3.1 / 2.7 KB more per subject
# (bench/key_store_memory.py): ~300 MB in a handler sealing for 100k customers.
CIPHERS_KEPT = 16384
HEADS_KEPT = 65536


class _Recent(OrderedDict):
    """A dict of at most ``most`` entries: adding one more drops the oldest added (an OrderedDict's: a plain dict's
    oldest key is found by skipping the slots of the keys dropped before it)."""

    def __init__(self, most: int, items=()):
        self.most = most
        super().__init__()
        for key, value in items:
            self[key] = value

    def __setitem__(self, key, value) -> None:
        if len(self) >= self.most and key not in self:
            self.popitem(last=False)
        super().__setitem__(key, value)


class SealedValueError(BadInput, ValueError):
    """A token that cannot be unsealed: not a token, corrupt, tampered with, or moved to another field or subject."""


class SubjectForgotten(Refused):
    """New personal data of a subject whose key was deleted: refused, so that it is never readable again."""


class SubjectKeyMissing(NotFound):
    """A token of a subject the key store never knew (neither a key nor a tombstone): the wrong store, or a lost
    one. Never read as null: that would make a misconfigured home look like an erasure."""


class KeyRaceLost(Refused):
    """Keys this process made were not the first of their subjects on the keys topic (another process made one at
    the same moment): what was sealed with them must not commit. Decided again, the winners are used."""


def keys_dir(home: str | os.PathLike) -> Path:
    """Where a home keeps its subject keys."""
    return Path(home) / "subject-keys"


class SubjectKeys:
    """The data keys of every subject, in files under ``directory``, durable across restarts: a snapshot and a
    journal (``event_store.key_files``: making a key appends one line; forgetting compacts, so a key's bytes leave
    the files; several processes share them; a kill at any moment loses nothing written).

    A reader that meets a subject it does not know reads the new journal lines once (another process may have made
    the key); one that holds a key forgotten elsewhere since still reads with it until it :meth:`refresh` es (the
    keys topic tells every reader within ``keys_topic_follow_s``). ``defer_sync`` (the command handler's): appended
    keys are fsynced by :meth:`sync`, once per transaction before it commits, not once per key.

    With a ``topic`` (``event_store.keys_topic.KeysTopic``) the store follows the keys topic: :meth:`refresh` reads
    what it gained, a subject unknown here is looked up there (a machine without this home's files restores what
    it reads), a key made here is provisional (in memory) until :meth:`sync` publishes it and finds it first on the
    topic (else :class:`KeyRaceLost`), and :meth:`forget` writes its tombstone there first."""

    def __init__(self, directory: str | os.PathLike, defer_sync: bool = False, compact_after: int = COMPACT_AFTER,
                 topic=None):
        self.topic = topic
        self._provisional: dict[str, KeyRecord] = {}  # keys made here, not yet on the topic (with a topic only)
        self._ciphers: dict[str, AESGCM] = _Recent(CIPHERS_KEPT)
        # (subject, field) -> (associated data, head)
        self._sealing: dict[tuple[str, str], tuple[bytes, str]] = _Recent(HEADS_KEPT)
        # (subject as in tokens, field) -> (subject, associated data): what unseal worked out of a token's head
        self._opening: dict[tuple[str, str], tuple[str, bytes]] = _Recent(HEADS_KEPT)
        self._files = KeyFiles(directory, defer_sync, compact_after, on_reload=self._reloaded)
        self.directory, self.path, self.journal = self._files.directory, self._files.path, self._files.journal

    # -- the records --------------------------------------------------------------------------------------------

    def reload(self) -> None:
        """Read the snapshot and the journal again (missing files are an empty store)."""
        self._files.reload()

    def _reloaded(self) -> None:
        # Keys never change, so a cipher made from a subject's key stays right while the subject keeps it.
        self._ciphers = _Recent(CIPHERS_KEPT, ((s, c) for s, c in self._ciphers.items()
                                               if s in self._files.records and not self._files.records[s].forgotten))

    def refresh(self) -> bool:
        """Read what another process changed since (a key made, a subject forgotten): two stats when nothing did, the
        new journal lines when keys were made, everything after a compaction; and, with a topic, what the keys topic
        gained (at most every ``keys_topic_follow_s``). A long-running reader or writer calls it once per batch, so
        a forgetting elsewhere reaches it within a batch. True if something was read."""
        changed = self._files.refresh()
        if self.topic is not None:
            changed = self.topic.follow(self) or changed
        return changed

    def take(self, records: Iterable[KeyRecord]) -> list[KeyRecord]:
        """Take the keys topic's ``records``, in its order, into this store and its files: a subject's first key
        stays (a later, different one lost a race and is ignored), a tombstone wins over a key. -> what changed."""
        def change(current: Mapping[str, KeyRecord]) -> list[KeyRecord]:
            seen: dict[str, KeyRecord] = {}
            out = []
            for record in records:
                known = seen.get(record.subject) or current.get(record.subject)
                if known is None or (record.forgotten and not known.forgotten):
                    seen[record.subject] = record
                    out.append(record)
            return out
        taken = self._change(change)
        self._files.sync()  # durable before the topic's position is recorded past them (keys_topic)
        for record in taken:
            if record.forgotten:
                self._ciphers.pop(record.subject, None)
        return taken

    @property
    def _records(self) -> dict[str, KeyRecord]:
        return self._files.records

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

    @property
    def forgotten_any(self) -> bool:
        """Whether this store holds a tombstone (as of its last read): while none, no subject is refused."""
        return self._files.forgotten > 0

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
            record = self._from_topic(subject)
        if record is None:
            raise SubjectKeyMissing(f"subject {subject!r}: the key store {self.path}{self._and_topic} has no key "
                                    f"and no tombstone for this subject (another home's token, or a lost key store)")
        return record.key

    def forget(self, subject: str) -> bool:
        """Delete ``subject``'s key for good, leaving a tombstone (so it is never made again). True if this call
        forgot it, False if it was forgotten already. A subject never seen is tombstoned too: its data, should any
        arrive, is refused."""
        _check_subject(subject)
        tombstone = KeyRecord(subject, None, datetime.now(timezone.utc).isoformat(timespec="seconds"))
        if self.topic is not None:  # the truth first: every process's store follows it
            self._files.refresh()
            self.topic.follow(self, force=True)
            already = self.state(subject) == "forgotten"
            # Written even then: a tombstone only these files hold (made with the topic off) must reach the others.
            self._provisional.pop(subject, None)
            self.topic.publish([tombstone])
            fault_point("after-topic-tombstone")  # killed here, the next forget finds the tombstone and goes on
            self.topic.follow(self, force=True)
            self._ciphers.pop(subject, None)
            return not already

        def change(current: Mapping[str, KeyRecord]) -> list[KeyRecord]:
            if subject in current and current[subject].forgotten:
                return []
            return [tombstone]
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
        else:
            cipher = self._ciphers.get(subject) or self._cipher(subject, create=True, field_name=field_name)
        if not isinstance(value, _SCALARS):
            raise BadInput(f"field '{field_name}': {type(value).__name__} cannot be sealed; personal values are "
                           f"JSON scalars (str, int, float, bool or null)")
        try:
            # \u escapes keep even lone surrogates
            plain = (_ENCODE_STR(value) if type(value) is str else _ENCODE(value)).encode("ascii")
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
                sealed = _unb64(parts[2])
                if sealed is not None and len(sealed) >= _NONCE_BYTES + 16:
                    cipher = self._ciphers.get(known[0])
                    if cipher is None:  # dropped from the bounded cache, or its subject forgotten
                        cipher = self._cipher(known[0], create=False, field_name=parts[1])
                        if cipher is None:
                            return None  # forgotten: its values read as null
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
        if field_name is not None and token_field != field_name:
            raise SealedValueError(f"field '{field_name}' of subject {token_subject!r}: the token was sealed for "
                                   f"field '{token_field}' (moved between fields)")
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
            raise SealedValueError(f"field '{field_name or token_field}' of subject {token_subject!r}: the token does "
                                   f"not authenticate (tampered with, corrupt, or sealed under another key)") from None
        self._opening[(parts[0], token_field)] = (token_subject, associated)
        try:
            return _DECODE(plain)
        except msgspec.MsgspecError:  # what msgspec reads otherwise (a lone surrogate)
            return json.loads(plain)

    # -- inside ---------------------------------------------------------------------------------------------------

    def _cipher(self, subject: str, create: bool, field_name: str) -> AESGCM | None:
        cipher = self._ciphers.get(subject)
        if cipher is not None:
            return cipher
        record = self._records.get(subject)
        if record is None and self.refresh():  # the lines another process appended since, not the whole store
            record = self._records.get(subject)
        if record is None and self.topic is not None:
            # Made by this process in the transaction under way; or, for a reader, on the topic and not here yet.
            # (A writer does not ask the topic for each new subject: a key another process made since the last
            # follow is found by sync, which then refuses this one.)
            record = self._provisional.get(subject) or (None if create else self._from_topic(subject))
        if record is None:
            if not create:
                raise SubjectKeyMissing(f"field '{field_name}' of subject {subject!r}: the key store "
                                        f"{self.path}{self._and_topic} has no key and no tombstone for this subject "
                                        f"(another home's token, or a lost key store)")
            record = self._make_key(subject)
        if record.forgotten:
            if create:
                raise SubjectForgotten(f"field '{field_name}' of subject {subject!r}: the subject was forgotten "
                                       f"({record.forgotten_at}); its new data is refused, never sealed under a "
                                       f"new key")
            return None
        cipher = self._ciphers[subject] = AESGCM(record.key)
        return cipher

    @property
    def _and_topic(self) -> str:
        return "" if self.topic is None else f" and the keys topic {self.topic.name}"

    def _from_topic(self, subject: str) -> KeyRecord | None:
        """``subject``'s record as the keys topic has it (read now; then from its start, should this store have lost
        records its saved position claims); None without a topic or when it has none."""
        if self.topic is None:
            return None
        self.topic.follow(self, force=True)
        if subject not in self._records:
            self.topic.follow(self, from_start=True)
        return self._records.get(subject)

    def _make_key(self, subject: str) -> KeyRecord:
        if self.topic is not None:  # provisional until sync() finds it first on the topic
            record = self._provisional[subject] = KeyRecord(subject, AESGCM.generate_key(bit_length=KEY_BYTES * 8))
            return record

        def change(current: Mapping[str, KeyRecord]) -> list[KeyRecord]:
            if subject in current:  # another process may have made it, or forgotten it, meanwhile
                return []
            return [KeyRecord(subject, AESGCM.generate_key(bit_length=KEY_BYTES * 8))]
        self._change(change)
        return self._records[subject]

    def _change(self, change) -> list[KeyRecord]:
        return self._files.change(change)

    @property
    def unsynced(self) -> bool:
        """Keys made and not yet durable (appended and not fsynced with ``defer_sync``, or provisional, not yet on
        the keys topic): :meth:`sync` is due before they are used in a commit."""
        return self._files.unsynced or bool(self._provisional)

    def sync(self) -> None:
        """Make the keys made since the last call durable: before a transaction whose events were sealed with them
        commits. With a topic, the provisional keys are published, the topic read back, and each must be the first
        key of its subject there: else :class:`KeyRaceLost` (the winners are this store's keys from now on, so the
        same work decided again seals with them). ``KeysTopicError`` when the topic cannot be written or read."""
        if self._provisional:
            made = list(self._provisional.values())
            self.topic.publish(made)
            self._provisional.clear()
            self.topic.follow(self, force=True)
            lost = [r.subject for r in made if self._records.get(r.subject) != r]
            if lost:
                for subject in lost:
                    self._ciphers.pop(subject, None)
                # Compaction keeps a subject's *latest* record: left last, the key that lost would be the one a
                # home that reads the compacted topic later takes (and a tombstone it followed would be gone).
                # The winners are written again, after it.
                self.topic.publish([self._records[s] for s in lost if s in self._records])
                raise KeyRaceLost(f"the keys of {len(lost)} subject(s) made here (first: {lost[0]!r}) were not the "
                                  f"first on the keys topic {self.topic.name} (made elsewhere at the same moment, or "
                                  f"forgotten): what they sealed is decided again")
        self._files.sync()


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


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text):,} characters)"
