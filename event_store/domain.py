"""What a domain gives the write side: one aggregate type, its pure core, its schemas, upcasters and snapshots.

A domain lives in its own subpackage (``event_store/<domain>/``) and exposes one :class:`Domain`; the registry
(``event_store.domains``) collects them, and the framework (decider, handler, partition rebuild, snapshots,
envelopes) knows domains only through it. What the registry loads of a domain (its package's ``__init__`` and
the modules that imports) may use from the framework only this module, ``event_store.fields`` and
``event_store.errors``, since everything else imports the registry back (``tests/unit/test_layering.py`` fails on
the cycle). A domain's processes that the registry does not load (the account's fraud policy) may use the rest
(docs/DESIGN.md, "Adding a domain").

What the framework guarantees for every aggregate, whatever its domain: versions 1, 2, 3 ... without a gap,
``expected_version`` (checked by the decider before ``decide`` runs), an idempotent ``command_id``, one Kafka
transaction per batch, snapshots, dead letters and the quarantine of an aggregate whose log cannot be read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Protocol

from event_store.fields import Field
from lakehouse.errors import Refused

__all__ = ["Domain", "State", "Command", "Event", "NewEvent", "CommandRejected", "Upcaster", "decide_quarantine"]


class CommandRejected(Refused):
    """A command the aggregate refuses; ``error_type`` is machine-readable, the message is for people."""

    def __init__(self, error_type: str, reason: str):
        super().__init__(reason)
        self.error_type = error_type
        self.reason = reason


class NewEvent(NamedTuple):
    """An event ``decide`` wants appended; the decider adds the envelope (ids, version, timestamps)."""
    event_type: str
    payload: Mapping[str, Any]
    occurred_at: str


class State(Protocol):
    """An aggregate's state: immutable, with the version of the last event folded into it (0: none yet)."""
    version: int


class Command(Protocol):
    """What ``decide`` reads of a command (``event_store.envelope.CommandEnvelope`` has these)."""
    command_id: str
    command_type: str
    aggregate_id: str
    payload: Mapping[str, Any]
    expected_version: int | None
    issued_at: str


class Event(Protocol):
    """What ``evolve`` reads of an event: a logged ``EventEnvelope`` (which also has ``aggregate_version``, and
    ``evolve`` then sets the state's version to it) or a bare :class:`NewEvent` (version unchanged)."""
    event_type: str
    payload: Mapping[str, Any]


Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


def decide_quarantine(aggregate: str, quarantine: tuple[str, str] | None, command: Command, resolve_command: str,
                      resolved_event: str, refused_as: str, how_to_resolve: Callable[[str], str]) -> list[NewEvent]:
    """The quarantine rule every domain follows (docs/DESIGN.md, "Quarantine"), for an aggregate (``aggregate``:
    its kind and id, e.g. "account acc-1") whose ``quarantine`` is (record, why) or None: while quarantined it takes
    only ``resolve_command`` naming its record, answered by ``resolved_event``; ``resolve_command`` is taken only
    while quarantined. Any other command is refused as ``refused_as``, its reason ending with ``how_to_resolve``."""
    p = command.payload
    if quarantine is None:
        raise CommandRejected("NotQuarantined", f"{aggregate} is not quarantined; nothing to resolve")
    record, why = quarantine
    if command.command_type != resolve_command:
        raise CommandRejected(
            refused_as, f"{aggregate} is quarantined: the events topic holds a record of it that cannot be read "
                        f"({record}: {why}); it takes no command until {how_to_resolve(record)}")
    if p["record"] != record:
        raise CommandRejected("QuarantineRecordMismatch", f"{aggregate} is quarantined by record {record}, not {p['record']}")
    return [NewEvent(resolved_event, {"record": record, "reason": p["reason"], "resolved_by": p["resolved_by"],
                                      "evidence": why}, command.issued_at)]


class _Fields(NamedTuple):
    event_type: str
    payload: Mapping[str, Any]
    aggregate_version: int | None


@dataclass(frozen=True)
class Domain:
    """One aggregate type and everything the write side needs of it. All functions are pure (no I/O)."""
    aggregate_type: str
    # The state of an aggregate that has no event yet, for its id.
    initial: Callable[[str], Any]
    # The events a command causes on a state (possibly none), or CommandRejected. expected_version is checked
    # before, by the decider; a quarantined state must refuse what the domain's quarantine rules say.
    decide: Callable[[Any, Command], list[NewEvent]]
    # The state after one event: a new value, the old one left as it was (states are immutable, so a snapshot
    # is a cut of them taken by copying references, written while the handler goes on; event_store.snapshots).
    evolve: Callable[[Any, Event], Any]
    # Payload schemas by command type and by event type (each type belongs to exactly one domain).
    commands: Mapping[str, Mapping[str, Field]]
    events: Mapping[str, Mapping[str, Field]]
    # The schema version each event type is written at today; older ones need an upcaster.
    event_schema_versions: Mapping[str, int]
    # The state as a JSON object in a snapshot, and back.
    encode_state: Callable[[Any], dict]
    decode_state: Callable[[dict], Any]
    # The state once a record of it ("topic/partition/offset") turned out unreadable: it must then refuse
    # commands until an operator resolves it (docs/DESIGN.md, "Quarantine").
    quarantined: Callable[[Any, str, str], Any]
    # The event that records an operator's resolution of a quarantine; its payload's ``record`` names the
    # unreadable record resolved (what ``eventlake status`` lists as no longer quarantining its aggregate).
    quarantine_resolved_event: str = ""
    # (event type, from version) -> payload at from version + 1.
    upcasters: Mapping[tuple[str, int], Upcaster] = field(default_factory=dict)
    # ``evolve`` from an event's type, payload and (if not None) version, without an envelope: the handler's hot
    # path. Optional; by default ``evolve`` of a light stand-in for the event.
    evolve_fields: Callable[[Any, str, Mapping[str, Any], int | None], Any] | None = None
    # The order of the domain's payload fields as columns of the flattened event rows that Spark writes
    # (event_archive, the sequence tables, dead letters: spark_apps.events). Fields it does not name follow, in
    # the order the event schemas first name them. Tables keep the order they were created with, so once they
    # exist a new field is appended here, never inserted.
    payload_column_order: tuple[str, ...] = ()
    # The vectorised twin of ``upcasters``: (event type, from version) -> {column: expression}, each expression a
    # function of ``pyspark.sql.functions`` (passed in, so that no domain module imports pyspark) giving the
    # column at from version + 1 from the flattened row's columns (spark_apps.events.upcast_rows).
    spark_upcasters: Mapping[tuple[str, int], Mapping[str, Callable[[Any], Any]]] = field(default_factory=dict)
    # An index of keys per aggregate kept in the handler's state store beside its state rather than in it (issue
    # 42: the account's payment ids), so a state does not grow with its history. ``index_split(state)`` gives
    # (the state without the keys it holds, those keys) when the state is stored; ``index_probe(command)`` the
    # key whose presence ``decide`` needs (or None); ``index_known(state, key)`` the state that knows ``key`` is
    # in the index (the handler hands ``decide`` that one). All three pure; None: the state holds everything.
    index_split: Callable[[Any], tuple[Any, Any]] | None = None
    index_probe: Callable[[Command], str | None] | None = None
    index_known: Callable[[Any, str], Any] | None = None
    # The data subject of a command on a state (issue 45, docs/forgetting.md): the pseudonymous id of the person
    # its aggregate's personal data is about (the account's customer_id), whose key seals the personal fields of
    # the events it causes; None when there is none yet. Pure. None: the domain has no personal data (its schemas
    # mark no field personal; ``event_store.sealing`` refuses a domain that marks some without a subject).
    subject: Callable[[Any, Command], str | None] | None = None
    # The payload field that names the data subject in the events that name it (the account's ``customer_id`` of
    # ``AccountOpened``): how a reader of the event tables finds a subject's aggregates whose events were written
    # with sealing off, when no token names the subject (``read_models.forgetting``). "": no such field.
    subject_field: str = ""
    # The command ``eventlake forget`` sends each of a forgotten subject's aggregates (the account's ForgetSubject,
    # naming the subject by ``subject_field``), answered by an event that records it on the log. The handler lets it
    # through though the subject is forgotten (``event_store.sealing.Sealer``). "": the domain has none.
    forget_command: str = ""

    def fold_fields(self, state: Any, event_type: str, payload: Mapping[str, Any], version: int | None) -> Any:
        """``evolve`` from an event's parts (``evolve_fields`` when the domain has one)."""
        if self.evolve_fields is not None:
            return self.evolve_fields(state, event_type, payload, version)
        return self.evolve(state, _Fields(event_type, payload, version))
