"""The CLI's verbs: a domain brings its own through the registry, and an EventlakeError a verb raises ends the
command with its message and its kind's exit code, a bug with its traceback."""
from __future__ import annotations

import pytest

from event_store import domains
from event_store.account import DOMAIN as ACCOUNT
from event_store.verbs import Verb, option
from eventlake.cli import build_parser, main, roles
from lakehouse.errors import NotFound, Refused


def _subcommands(parser) -> dict:
    [sub] = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return sub.choices


def fail_not_found(settings, args, host) -> int:
    raise NotFound(f"no such thing {args.what!r}; known: a, b")


def fail_refused(settings, args, host) -> int:
    raise Refused("the lock is held by someone else")


def fail_with_a_bug(settings, args, host) -> int:
    raise KeyError("a bug")


def succeed(settings, args, host) -> int:
    print(f"done with {args.what}")
    return 0


VERBS = tuple(Verb(f"cli-test-{name.replace('_', '-')}", help="a test verb", run=f"{__name__}:{name}",
                   options=(option("what"),), role="reader", needs_broker=False)
              for name in ("fail_not_found", "fail_refused", "fail_with_a_bug", "succeed"))


@pytest.fixture
def test_domain():
    """The account domain registered again under another name (its commands renamed away), with test verbs."""
    from dataclasses import replace

    domain = replace(ACCOUNT, aggregate_type="cli_test_account", commands={}, events={}, event_schema_versions={},
                     upcasters={})
    domains.register(domain, VERBS)
    try:
        yield domain
    finally:
        domains.unregister(domain.aggregate_type)


def test_the_account_domain_brings_its_verbs():
    verbs = _subcommands(build_parser())
    for name in ("resolve-quarantine", "policy", "detect-fraud"):
        assert name in verbs and roles()[name] == "client"
    options = {a.dest: a for a in verbs["resolve-quarantine"]._actions}
    assert options["record"].required and options["reason"].required and options["timeout"].default == 30.0
    assert {a.dest: a.default for a in verbs["detect-fraud"]._actions}["engine"] == "python"


def test_a_domain_registered_later_adds_its_verbs_and_takes_them_away(test_domain):
    assert "cli-test-succeed" in _subcommands(build_parser()) and roles()["cli-test-succeed"] == "reader"
    domains.unregister(test_domain.aggregate_type)
    try:
        assert "cli-test-succeed" not in _subcommands(build_parser())
    finally:
        domains.register(test_domain, VERBS)


def test_a_verb_name_is_taken_once():
    with pytest.raises(ValueError, match="verb.*policy.*already registered"):
        domains.register(type(ACCOUNT)(**{**ACCOUNT.__dict__, "aggregate_type": "cli_test_twice", "commands": {},
                                          "events": {}, "event_schema_versions": {}, "upcasters": {}}),
                         (Verb("policy", help="again", run=f"{__name__}:succeed"),))
    assert "cli_test_twice" not in domains.DOMAINS


def test_an_eventlake_error_ends_with_its_message_and_exit_code(test_domain, capsys):
    assert main(["cli-test-fail-not-found", "x"]) == 2
    assert capsys.readouterr().err == "eventlake: no such thing 'x'; known: a, b\n"
    assert main(["cli-test-fail-refused", "x"]) == 1
    assert "the lock is held by someone else" in capsys.readouterr().err
    assert main(["cli-test-succeed", "y"]) == 0
    assert capsys.readouterr().out == "done with y\n"


def test_a_bug_is_not_swallowed(test_domain):
    with pytest.raises(KeyError, match="a bug"):
        main(["cli-test-fail-with-a-bug", "x"])


def test_each_domain_brings_its_generator():
    from event_store.domains import GENERATORS

    assert {g.name for g in GENERATORS.values()} == {"accounts", "iot", "site"}
    [domain] = [a for a in _subcommands(build_parser())["generate"]._actions if a.dest == "domain"]
    assert set(domain.choices) == {"accounts", "iot", "site"} and domain.default == "accounts"
    import argparse
    import importlib

    args = argparse.Namespace(devices=9, minutes=12, seed=1, run_id="t", sites=2, views=40)
    for name in ("iot", "site"):
        [generate] = [g for g in GENERATORS.values() if g.name == name]
        module, _, function = generate.run.partition(":")
        records, what = getattr(importlib.import_module(module), function)(None, args)
        assert records and what in ("9 devices", "2 sites")
