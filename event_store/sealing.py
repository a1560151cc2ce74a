"""Personal data on the way to the log and back (issue 45, docs/forgetting.md): the handler's sealer and the readers'
unsealer, both through ``event_store.personal_data`` (the one module that seals and unseals).

- :class:`Sealer` (the command handler): a command of a forgotten data subject is refused (``SubjectForgotten``)
  before its aggregate decides, whether or not ``personal_data_seal`` is on; with it on, the personal fields of the
  events a command causes are sealed under its subject's key (``Domain.subject``) *before* the events are folded
  into the aggregate's state and encoded, so the events topic, the handler's states, its state store and its snapshots hold tokens, never the
  plain values. Event ids derive from the aggregate, version and command (``decider.event_id_for``), not from the
  payload: a re-decided command seals with fresh nonces (other bytes) under the same event ids.
- :class:`Unsealer` (every Python reader): tokens back to their values, a forgotten subject's as null, plain values
  (events written with sealing off) as they are. Its key store is opened on the first token met, so a log without
  any never needs one; ``refresh`` once per batch sees a forgetting done by another process.
- :func:`sealing_on` reads the setting. The Spark projection, rebuild and reprocessing unseal with Spark's own
  functions (``spark_apps.unsealing``); the Spark fraud detector, a streaming query, with an ``Unsealer`` in its
  Python workers (``spark_apps.fraud_detector``).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Iterator, Mapping

from event_store.domain import CommandRejected, Domain, NewEvent
from event_store.domains import DOMAINS
from event_store.personal_data import (SubjectForgotten, SubjectKeys, TOKEN_PREFIX, is_sealed, keys_dir,
                                       personal_fields_by_type)
from lakehouse.settings import Settings, SettingsError

__all__ = ["Sealer", "Unsealer", "sealing_on", "personal_columns", "subject_keys",
           "unsealed_select", "DUCKDB_UNSEAL", "personal_event_fields"]

# The DuckDB function a reader's connection unseals with (``Unsealer.register``): (value, field name) -> value.
DUCKDB_UNSEAL = "eventlake_unseal"


def sealing_on(settings: Settings) -> bool:
    """Whether the handler seals personal data (``personal_data_seal``: "on" or "off")."""
    value = settings.personal_data_seal
    if value not in ("on", "off"):
        raise SettingsError(f"setting personal_data_seal={value!r}: expected on or off "
                            f"(EVENTLAKE_PERSONAL_DATA_SEAL)")
    return value == "on"


def subject_keys(settings: Settings, defer_sync: bool = False) -> SubjectKeys:
    """The key store of ``settings``' home, following the keys topic unless ``subject_keys_topic`` is off."""
    from event_store.keys_topic import KeysTopic, keys_topic_on

    topic = KeysTopic(settings) if keys_topic_on(settings) else None
    return SubjectKeys(keys_dir(settings.home), defer_sync=defer_sync, topic=topic)


def unsealed_select(relation: str, columns: Iterable[str]) -> str:
    """``SELECT * FROM relation`` with each personal column among ``columns`` unsealed by ``DUCKDB_UNSEAL`` (the
    connection must have it: ``Unsealer.register``). What a DuckDB fold reads its events through, while the
    tables it keeps of the events themselves (held, pending, late) are written from the sealed relation."""
    personal = sorted(personal_columns().intersection(columns))
    if not personal:
        return f"SELECT * FROM {relation}"
    replaced = ", ".join(f"{DUCKDB_UNSEAL}(\"{c}\", '{c}') AS \"{c}\"" for c in personal)
    return f"SELECT * REPLACE ({replaced}) FROM {relation}"


def personal_event_fields() -> dict[str, frozenset[str]]:
    """Event type -> the payload fields it marks personal (every registered domain's)."""
    out: dict[str, frozenset[str]] = {}
    for domain in DOMAINS.values():
        out.update(personal_fields_by_type(domain.events))
    return out


def personal_columns() -> frozenset[str]:
    """Every payload field some registered event type marks personal: the columns of the flattened event rows a
    reader unseals (only the tokens among their values: another type's plain field of the same name passes)."""
    return frozenset(name for fields in personal_event_fields().values() for name in fields)


class Sealer:
    """The handler's side: refuses a forgotten subject's commands, seals the personal fields of new events. With
    ``seal=False`` (``personal_data_seal`` off) it only refuses: a subject ``eventlake forget`` forgot must not get
    new data in plain text either."""

    def __init__(self, keys: SubjectKeys, seal: bool = True):
        self.keys = keys
        self.sealing = seal
        self.personal = personal_event_fields()
        for domain in DOMAINS.values():
            if domain.subject is None and any(t in self.personal for t in domain.events):
                raise ValueError(f"domain {domain.aggregate_type}: its events mark personal fields but it names no "
                                 f"data subject (Domain.subject)")

    @classmethod
    def for_settings(cls, settings: Settings) -> Sealer:
        """The sealer of the handler of ``settings``: with sealing off, one that only refuses the commands of
        forgotten subjects (the home's key store holds their tombstones; a missing store is an empty one). The keys
        it makes are made durable once per transaction (:meth:`sync`), not once per key."""
        return cls(subject_keys(settings, defer_sync=True), seal=sealing_on(settings))

    def sync(self) -> None:
        """Before a transaction commits: the keys its events were sealed with are on the keys topic, first of their
        subjects (else ``KeyRaceLost``), and on disk (fsynced), so no committed event ever holds a token whose key a
        power cut or another machine's key could take away (``SubjectKeys.sync``)."""
        self.keys.sync()

    def refresh(self) -> None:
        """Once per transaction: a subject forgotten by another process since is refused from now on."""
        self.keys.refresh()

    def check(self, domain: Domain, state: Any, command: Any) -> None:
        """CommandRejected (``SubjectForgotten``) when ``command``'s data subject was forgotten: every command of
        it, whether or not it carries personal data (the relationship has ended; docs/forgetting.md)."""
        if not self.keys.forgotten_any:  # nobody forgotten (as of the last refresh): nothing to refuse
            return
        if command.command_type == domain.forget_command and domain.forget_command:
            return  # what records the forgetting on the log (the aggregate decides it)
        subject = domain.subject(state, command) if domain.subject is not None else None
        if subject is not None and self.keys.state(subject) == "forgotten":
            raise CommandRejected("SubjectForgotten", _forgotten(domain, command, subject))

    def seal(self, domain: Domain, state: Any, command: Any, new_events: list[NewEvent]) -> list[NewEvent]:
        """``new_events`` with their personal fields sealed under the subject of ``command`` on ``state`` (as they
        are when sealing is off)."""
        if not self.sealing:
            return new_events
        personal = self.personal
        out = None
        subject, subject_known = None, False  # worked out once per command, at its first personal value
        for i, new in enumerate(new_events):
            fields = personal.get(new.event_type)
            if not fields:
                continue
            payload = new.payload
            sealed = None
            for name in fields:
                value = payload.get(name)
                if value is None:
                    continue
                if not subject_known:
                    subject = domain.subject(state, command) if domain.subject is not None else None
                    subject_known = True
                if subject is None:
                    raise CommandRejected("InvalidCommand", f"command {command.command_id}: {new.event_type} "
                                                            f"carries personal data but {domain.aggregate_type} "
                                                            f"{command.aggregate_id} has no data subject")
                if sealed is None:
                    sealed = dict(payload)
                try:
                    sealed[name] = self.keys.seal(subject, name, value)
                except SubjectForgotten:  # forgotten meanwhile, by another process
                    raise CommandRejected("SubjectForgotten", _forgotten(domain, command, subject)) from None
            if sealed is not None:
                if out is None:
                    out = list(new_events)
                out[i] = NewEvent(new.event_type, sealed, new.occurred_at)
        return new_events if out is None else out


def _forgotten(domain: Domain, command: Any, subject: str) -> str:
    return (f"command {command.command_id}: the data subject {subject!r} of {domain.aggregate_type} "
            f"{command.aggregate_id} was forgotten; its commands are refused and its data is never stored again "
            f"(docs/forgetting.md)")


_UNOPENED = object()
_OPENED_MAX = 500_000  # tokens per field an Unsealer remembers between refreshes (each ~200 bytes with its value)


class Unsealer:
    """The readers' side: tokens in events, payloads or event rows back to their values (null once forgotten)."""

    def __init__(self, settings: Settings | None = None, keys: SubjectKeys | None = None):
        if settings is None and keys is None:
            raise ValueError("Unsealer needs settings (its home's key store) or a key store")
        self._settings = settings
        self._keys = keys
        self.personal = personal_event_fields()
        self.columns = personal_columns()
        # field name -> token -> value: what DUCKDB_UNSEAL opened in this batch. A batch's tokens are unsealed once
        # however many read models fold them (each model's fold reads the batch's personal columns again); emptied
        # by refresh(), so a subject forgotten since reads as null from the next batch on.
        self._opened: dict[str, dict[str, Any]] = {}

    @property
    def keys(self) -> SubjectKeys:
        if self._keys is None:
            self._keys = subject_keys(self._settings)
        return self._keys

    def refresh(self) -> None:
        """Once per batch: a subject forgotten by another process since reads as null from now on."""
        self._opened = {}
        if self._keys is not None:
            self._keys.refresh()

    def value(self, value: Any, field_name: str) -> Any:
        """A payload value as a reader sees it: a token unsealed (None when its subject was forgotten; the token
        must have been sealed for ``field_name``), anything else as it is."""
        if not is_sealed(value):
            return value
        return self.keys.unseal(value, field_name=field_name)

    def payload(self, event_type: str, payload: Mapping[str, Any]) -> Mapping[str, Any]:
        """``payload`` of an ``event_type`` event with its personal fields unsealed (the same object when it holds
        no token)."""
        fields = self.personal.get(event_type)
        if not fields or not any(is_sealed(payload.get(name)) for name in fields):
            return payload
        return {name: self.value(v, name) if name in fields else v for name, v in payload.items()}

    def event(self, event: Any) -> Any:
        """An event envelope with its personal fields unsealed."""
        payload = self.payload(event.event_type, event.payload)
        return event if payload is event.payload else dataclasses.replace(event, payload=payload)

    def events(self, events: Iterable[Any]) -> Iterator[Any]:
        for e in events:
            yield self.event(e)

    def register(self, con) -> None:
        """Give the DuckDB connection ``con`` the function ``DUCKDB_UNSEAL(value, field name)``: a batch of values
        at a time (Arrow), the tokens among them unsealed, the rest as they are (``unsealed_select``)."""
        import duckdb
        import pyarrow as pa
        import pyarrow.compute as pc

        def unseal(values, field_names):
            if not pc.any(pc.starts_with(values, TOKEN_PREFIX)).as_py():
                return values
            out = []
            opened_by_field = self._opened
            for value, field_name in zip(values.to_pylist(), field_names.to_pylist()):
                if value is None or not value.startswith(TOKEN_PREFIX):
                    out.append(value)
                    continue
                opened = opened_by_field.get(field_name)
                if opened is None or len(opened) >= _OPENED_MAX:  # bounded: a rebuild folds a whole archive
                    opened = opened_by_field[field_name] = {}
                plain = opened.get(value, _UNOPENED)
                if plain is _UNOPENED:
                    plain = opened[value] = self.keys.unseal(value, field_name=field_name)
                out.append(plain)
            return pa.array(out, type=pa.string())

        try:
            # "special": nulls come in (and pass through) and go out (a forgotten subject's value).
            con.create_function(DUCKDB_UNSEAL, unseal, ["VARCHAR", "VARCHAR"], "VARCHAR", type="arrow",
                                null_handling="special")
        except duckdb.NotImplementedException:  # registered on this connection already
            pass

    def rows(self, table):
        """A pyarrow table of event rows (``spark_apps.event_rows``) with the tokens of its personal columns
        unsealed: the columns keep their names and types, a forgotten subject's values become null. The same
        table when it holds no token."""
        import pyarrow as pa
        import pyarrow.compute as pc

        for name in sorted(self.columns.intersection(table.column_names)):
            column = table[name]
            if column.null_count == len(column) or not pc.any(pc.starts_with(column, TOKEN_PREFIX)).as_py():
                continue
            opened = pa.array([self.value(v, name) for v in column.to_pylist()], type=column.type)
            table = table.set_column(table.column_names.index(name), table.schema.field(name), opened)
        return table
