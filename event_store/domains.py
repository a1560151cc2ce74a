"""The registry of domains: aggregate type -> :class:`~event_store.domain.Domain`, and every command and event
type -> the aggregate type it belongs to.

This is the only framework module that imports domain packages (``tests/unit/test_layering.py`` holds it to
that). A new domain is one subpackage plus one line in ``_BUILT_IN`` (docs/DESIGN.md, "Adding a domain").
Command and event type names form one namespace across domains, so that a command without an
``aggregate_type`` is routed by its ``command_type`` and an event's type says its domain: a name used twice
fails at import.

``COMMANDS``, ``EVENTS``, ``EVENT_SCHEMA_VERSIONS`` and ``UPCASTERS`` are the unions over the registered domains
(``event_store.schemas`` and ``event_store.upcasting`` hand out these same dicts). :func:`register` and
:func:`unregister` update them in place, so every module that imported them sees a domain registered later
(a test's domain, say).

A domain may also bring verbs of the ``eventlake`` command (``event_store.verbs.Verb``): ``VERBS`` holds them by
aggregate type, and the CLI adds every one (the account's ``resolve-quarantine``, ``policy``, ``detect-fraud``);
and its data generator (``event_store.verbs.Generate``), in ``GENERATORS``: ``eventlake generate --domain``.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

from event_store import account, iot, site
from event_store.account import verbs as account_verbs
from event_store.domain import Domain, Upcaster
from event_store.errors import InvalidRecord
from event_store.fields import Field
from event_store.verbs import Generate, Verb

__all__ = ["DOMAINS", "COMMAND_TYPES", "EVENT_TYPES", "COMMANDS", "EVENTS", "EVENT_SCHEMA_VERSIONS", "UPCASTERS",
           "VERBS", "GENERATORS", "register", "unregister", "registered", "domain_of", "route_command", "on_change", "verbs"]

_BUILT_IN: tuple[Domain, ...] = (account.DOMAIN, iot.DOMAIN, site.DOMAIN)
_BUILT_IN_VERBS: dict[str, tuple[Verb, ...]] = {account.DOMAIN.aggregate_type: account_verbs.VERBS}
# Each domain's data generator (event_store/<domain>/generator.py), by the name ``eventlake generate --domain`` uses.
_BUILT_IN_GENERATORS: dict[str, Generate] = {
    account.DOMAIN.aggregate_type: Generate("accounts", "event_store.account.generator:records_for_cli"),
    iot.DOMAIN.aggregate_type: Generate("iot", "event_store.iot.generator:records_for_cli"),
    site.DOMAIN.aggregate_type: Generate("site", "event_store.site.generator:records_for_cli")}

DOMAINS: dict[str, Domain] = {}
COMMAND_TYPES: dict[str, str] = {}  # command type -> aggregate type
EVENT_TYPES: dict[str, str] = {}    # event type -> aggregate type
COMMANDS: dict[str, Mapping[str, Field]] = {}
EVENTS: dict[str, Mapping[str, Field]] = {}
EVENT_SCHEMA_VERSIONS: dict[str, int] = {}
UPCASTERS: dict[tuple[str, int], Upcaster] = {}
VERBS: dict[str, tuple[Verb, ...]] = {}  # aggregate type -> the eventlake verbs its domain brings
GENERATORS: dict[str, Generate] = {}  # aggregate type -> its domain's data generator
_LISTENERS: list[Callable[[], None]] = []


def register(domain: Domain, verbs: tuple[Verb, ...] = (), generate: Generate | None = None) -> None:
    """Add ``domain`` (and the ``eventlake`` verbs and data generator it brings); ValueError when its aggregate
    type, one of its command or event types, a verb's name or its generator's name is taken."""
    name = domain.aggregate_type
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"domain {domain!r}: aggregate_type must be a non-empty string")
    if name in DOMAINS:
        raise ValueError(f"aggregate type {name!r} is registered twice")
    for kind, types, owners in (("command", domain.commands, COMMAND_TYPES), ("event", domain.events, EVENT_TYPES)):
        taken = sorted(t for t in types if t in owners)
        if taken:
            raise ValueError(f"domain {name!r}: {kind} type(s) {', '.join(taken)} already belong to aggregate type(s) "
                             f"{', '.join(sorted({owners[t] for t in taken}))}; command and event type names are "
                             f"unique across domains")
    if set(domain.event_schema_versions) != set(domain.events):
        raise ValueError(f"domain {name!r}: event_schema_versions must name exactly its event types")
    strays = sorted(f"{t}@{v}" for t, v in domain.upcasters if t not in domain.events)
    if strays:
        raise ValueError(f"domain {name!r}: upcasters for event types it does not have: {', '.join(strays)}")
    names = [v.name for v in verbs]
    registered_verbs = {v.name for domain_verbs in VERBS.values() for v in domain_verbs}
    taken = sorted({n for n in names if names.count(n) > 1 or n in registered_verbs})
    if taken:
        raise ValueError(f"domain {name!r}: verb(s) {', '.join(taken)} already registered")
    if generate is not None and generate.name in {g.name for g in GENERATORS.values()}:
        raise ValueError(f"domain {name!r}: a generator named {generate.name!r} is already registered")
    DOMAINS[name] = domain
    VERBS[name] = tuple(verbs)
    if generate is not None:
        GENERATORS[name] = generate
    COMMAND_TYPES.update(dict.fromkeys(domain.commands, name))
    EVENT_TYPES.update(dict.fromkeys(domain.events, name))
    COMMANDS.update(domain.commands)
    EVENTS.update(domain.events)
    EVENT_SCHEMA_VERSIONS.update(domain.event_schema_versions)
    UPCASTERS.update(domain.upcasters)
    _changed()


def unregister(aggregate_type: str) -> None:
    """Remove a registered domain (tests register domains of their own and remove them again)."""
    domain = DOMAINS.pop(aggregate_type)
    VERBS.pop(aggregate_type, None)
    GENERATORS.pop(aggregate_type, None)
    for name in domain.commands:
        COMMAND_TYPES.pop(name, None)
        COMMANDS.pop(name, None)
    for name in domain.events:
        EVENT_TYPES.pop(name, None)
        EVENTS.pop(name, None)
        EVENT_SCHEMA_VERSIONS.pop(name, None)
    for key in domain.upcasters:
        UPCASTERS.pop(key, None)
    _changed()


@contextmanager
def registered(domain: Domain) -> Iterator[Domain]:
    """``domain`` registered for the duration of a ``with`` block; a domain that is already registered (the same
    object: a built-in one) stays registered after the block."""
    if DOMAINS.get(domain.aggregate_type) is domain:
        yield domain
        return
    register(domain)
    try:
        yield domain
    finally:
        unregister(domain.aggregate_type)


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener`` whenever a domain is registered or removed (modules that derive values from the
    unions, such as the event envelope's list of known event types, refresh them)."""
    _LISTENERS.append(listener)


def _changed() -> None:
    for listener in _LISTENERS:
        listener()


def verbs() -> list[Verb]:
    """Every registered domain's ``eventlake`` verbs, in the order of registration."""
    return [verb for domain_verbs in VERBS.values() for verb in domain_verbs]


def domain_of(aggregate_type: str | None) -> Domain | None:
    """The registered domain of ``aggregate_type``, or None."""
    return DOMAINS.get(aggregate_type)  # type: ignore[arg-type]


def route_command(command_type: str, aggregate_type: Any, what: str) -> str:
    """The aggregate type a command of ``command_type`` goes to: the one it names (``aggregate_type``), which
    must be registered and own ``command_type``, or, when it names none, the owner of ``command_type``.
    InvalidRecord naming the input otherwise (``what`` says which command)."""
    owner = COMMAND_TYPES.get(command_type)
    if aggregate_type is None:
        if owner is None:
            raise InvalidRecord(f"{what}: unknown command_type {_short(command_type)}; known: "
                                f"{', '.join(COMMAND_TYPES)}")
        return owner
    if aggregate_type not in DOMAINS:
        raise InvalidRecord(f"{what}: unknown aggregate_type {_short(aggregate_type)}; known: "
                            f"{', '.join(DOMAINS)}")
    if owner != aggregate_type:
        raise InvalidRecord(f"{what}: command_type {_short(command_type)} is not a command of aggregate type "
                            f"{_short(aggregate_type)}" + (f" (it belongs to {owner!r})" if owner else "")
                            + f"; {aggregate_type}'s commands: {', '.join(DOMAINS[aggregate_type].commands)}")
    return aggregate_type


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text):,} characters)"


for _domain in _BUILT_IN:
    register(_domain, _BUILT_IN_VERBS.get(_domain.aggregate_type, ()),
             _BUILT_IN_GENERATORS.get(_domain.aggregate_type))
