"""decide/evolve of the ``site`` aggregate (a website and its page views): given these commands, expect these
events, states and reasons.

The domain is not in the registry's built-ins yet (new domains are registered together once their Spark folds have
run end to end), so every test here registers it for its duration, as tests/unit/test_iot.py does with devices."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from event_store import domains, schemas, site
from event_store.decider import EventTimeLimit, execute, execute_encoded, initial_state
from event_store.envelope import CommandEnvelope, EventEnvelope, parse_time
from event_store.errors import InvalidRecord
from event_store.partition_rebuild import PartitionRebuilder
from event_store.site import SiteState, decide, evolve, quarantined
from event_store.site.schemas import HOST_PATTERN, PAGE_MAX_LENGTH, PAGE_PATTERN
from event_store.snapshots import PartitionState, load_snapshot, snapshot_records
from lakehouse.settings import Settings

T0 = "2026-01-01T10:00:00.000Z"
SITE = "site-1"


def test_the_site_domain_is_built_in():
    assert domains.DOMAINS["site"] is site.DOMAIN and schemas.COMMANDS["RecordPageView"] is site.DOMAIN.commands[
        "RecordPageView"]


def cmd(kind, payload, site_id=SITE, **kw):
    return CommandEnvelope.create(kind, site_id, payload, **kw)


def register(name="Shop", host="shop.example.com", site_id=SITE, **kw):
    return cmd("RegisterSite", {"site_name": name, "host": host}, site_id, **kw)


def view(view_id="v1", page="/", visitor="u1", at=T0, site_id=SITE, **kw):
    return cmd("RecordPageView", {"view_id": view_id, "page": page, "visitor_id": visitor, "viewed_at": at},
               site_id, **kw)


def run(*commands, state=None):
    state, all_events, results = state or SiteState(SITE), [], []
    for c in commands:
        state, events, result = execute(state, c)
        all_events += events
        results.append(result)
    return state, all_events, results


def rejection(state, command):
    with pytest.raises(site.CommandRejected) as e:
        decide(state, command)
    return e.value.error_type, e.value.reason


def test_register_site_records_its_name_and_host():
    state, events, _ = run(register())
    assert [(e.event_type, e.aggregate_type, e.aggregate_version) for e in events] == [("SiteRegistered", "site", 1)]
    assert events[0].payload == {"site_name": "Shop", "host": "shop.example.com"}
    assert state == SiteState(SITE, 1, True, "active", "Shop", "shop.example.com")


def test_re_registering_a_site_is_rejected_even_after_retiring_it():
    state, _, _ = run(register())
    assert rejection(state, register()) == (
        "SiteAlreadyRegistered", "site site-1 is already registered (active, 'Shop' at shop.example.com); a site id "
                                 "is registered once and never reused")
    state, _, _ = run(cmd("RetireSite", {}), state=state)
    assert rejection(state, register())[0] == "SiteAlreadyRegistered"


def test_page_views_are_recorded_at_their_viewing_time_also_late_and_out_of_order():
    late = "2026-01-01T09:00:00.000Z"
    state, events, results = run(register(), view("v1", "/pricing", "u1"), view("v2", "/", "u2"),
                                 view("v3", "/pricing", "u1", at=late))
    assert all(r.accepted for r in results)
    assert [(e.event_type, e.aggregate_version, e.occurred_at, e.payload) for e in events[1:]] == [
        ("PageViewed", 2, T0, {"view_id": "v1", "page": "/pricing", "visitor_id": "u1"}),
        ("PageViewed", 3, T0, {"view_id": "v2", "page": "/", "visitor_id": "u2"}),
        ("PageViewed", 4, late, {"view_id": "v3", "page": "/pricing", "visitor_id": "u1"})]
    assert (state.page_views_recorded, state.version) == (3, 4)


def test_a_page_view_for_a_site_never_registered_is_rejected_with_a_reason():
    _, events, [result] = run(view("v7", "/about"))
    assert events == [] and (result.status, result.error_type, result.version) == ("rejected", "SiteNotFound", 0)
    assert result.reason == "site site-1 is not registered; send RegisterSite first (view v7 of /about not recorded)"


def test_retiring_a_site_never_registered_is_rejected_too():
    assert rejection(SiteState(SITE), cmd("RetireSite", {})) == (
        "SiteNotFound", "site site-1 is not registered; send RegisterSite first")


def test_a_retired_site_records_no_view_and_retiring_twice_changes_nothing():
    state, events, results = run(register(), view("v1"), cmd("RetireSite", {"reason": "closed"}),
                                 cmd("RetireSite", {}))
    assert [e.event_type for e in events] == ["SiteRegistered", "PageViewed", "SiteRetired"]
    assert events[-1].payload == {"reason": "closed"}
    assert results[-1].accepted and results[-1].event_ids == () and state.status == "retired"
    assert rejection(state, view("v2", "/a", at="2026-01-01T09:59:00.000Z")) == (
        "SiteNotActive", "site site-1 is retired; view v2 of /a (viewed at 2026-01-01T09:59:00.000Z) is not recorded")


def test_a_view_re_sent_with_its_command_id_gives_the_same_events():
    """Idempotent as a device's reading: the sender derives the command_id from the site and the view id, and the
    handler's idempotency window answers the repeat (tests/unit/test_domains.py shows the window across domains)."""
    state, _, _ = run(register())
    again = view("v9", command_id="site-1/v9")
    assert execute(state, again, recorded_at=T0)[1] == execute(state, again, recorded_at=T0)[1]


def test_evolve_refuses_unknown_event_types():
    with pytest.raises(ValueError, match="site aggregate cannot apply unknown event type 'Teleported'"):
        evolve(SiteState("s"), site.NewEvent("Teleported", {}, T0))


def test_decide_refuses_a_command_of_another_aggregate():
    other = SimpleNamespace(command_type="OpenAccount", payload={}, issued_at=T0)
    assert rejection(SiteState(SITE, 1, True), other) == (
        "UnknownCommand", "command type 'OpenAccount' is not handled by the site aggregate")


@pytest.mark.parametrize("page, message", [
    ("pricing", "'pricing' is not a URL path"),
    ("", "'' is not a URL path"),
    ("/a b", "'/a b' is not a URL path"),
    ("/a\tb", "is not a URL path"),
    ("/a\n", "is not a URL path"),
    ("/\x00", "is not a URL path"),
    ("/caf\u00e9", "is not a URL path"),
    ("/a\u00a0b", "is not a URL path"),  # non-ASCII whitespace: Python's \s and Java's disagree, so none is allowed
    ("/search?q=x", "is not a URL path"),
    ("/a#top", "is not a URL path"),
    ("/" + "a" * PAGE_MAX_LENGTH, f"is {PAGE_MAX_LENGTH + 1:,} characters long; at most {PAGE_MAX_LENGTH}"),
])
def test_a_page_that_is_not_a_path_is_refused_naming_the_field(page, message):
    body = {"view_id": "v1", "page": page, "visitor_id": "u1", "viewed_at": T0}
    with pytest.raises(InvalidRecord, match=f"field 'page' .*{re.escape(message)}"):
        cmd("RecordPageView", body)


@pytest.mark.parametrize("page", ["/", "/pricing", "/a/b/", "/caf%C3%A9", "/p;v=1/x:y@z", "/" + "a" * 1023])
def test_url_paths_are_pages(page):
    assert cmd("RecordPageView", {"view_id": "v", "page": page, "visitor_id": "u", "viewed_at": T0})


@pytest.mark.parametrize("payload, message", [
    ({"viewed_at": "2026-01-01T10:00:00"}, "field 'viewed_at' '2026-01-01T10:00:00' is not an ISO-8601"),
    ({"viewed_at": "1899-12-31T23:59:59Z"}, "field 'viewed_at' '1899-12-31T23:59:59Z' is out of range"),
    ({"viewed_at": "9999-01-01T00:00:00Z"}, "field 'viewed_at' '9999-01-01T00:00:00Z' is out of range"),
    ({"view_id": " "}, "field 'view_id' must not be empty"),
    ({"visitor_id": None}, "missing required field 'visitor_id'"),
    ({"visitor_id": 7}, "field 'visitor_id' must be str, got int"),
])
def test_invalid_page_views_are_refused_naming_the_field_and_the_reason(payload, message):
    body = {"view_id": "v1", "page": "/", "visitor_id": "u1", "viewed_at": T0, **payload}
    with pytest.raises(InvalidRecord, match=re.escape(message)):
        cmd("RecordPageView", body)


@pytest.mark.parametrize("payload, message", [
    ({"host": "Shop.example.com"}, "field 'host' 'Shop.example.com' is not a lower-case host name"),
    ({"host": "https://shop.example.com"}, "is not a lower-case host name"),
    ({"host": "shop.example.com:8080"}, "is not a lower-case host name"),
    ({"host": "shop..com"}, "is not a lower-case host name"),
    ({"host": "-shop.com"}, "is not a lower-case host name"),
    ({"site_name": "   "}, "field 'site_name' '   ' is not a name of printable ASCII characters, not blank"),
    ({"site_name": "Shop\n"}, "field 'site_name' 'Shop\\n' is not a name"),
    ({"site_name": None}, "missing required field 'site_name'"),
])
def test_invalid_registrations_are_refused_naming_the_field(payload, message):
    body = {"site_name": "Shop", "host": "shop.example.com", **payload}
    with pytest.raises(InvalidRecord, match=re.escape(message)):
        cmd("RegisterSite", body)


def test_the_patterns_are_ascii_only_and_bounded_so_python_and_java_read_them_alike():
    """Spark checks the same patterns with Java's regex (``(?U)``, ``\\z`` for ``\\Z``): ASCII ranges and literal
    characters mean the same there; no ``\\s``, ``\\w``, ``\\S`` or ``.`` whose meaning differs outside ASCII."""
    for pattern in (PAGE_PATTERN, HOST_PATTERN, site.DOMAIN.commands["RegisterSite"]["site_name"].pattern):
        assert pattern.startswith(r"\A") and pattern.endswith(r"\Z") and pattern.isascii()
        assert not re.search(r"\\[sSwWdDbB]|(?<!\\)\.(?![^\[]*\])", pattern[2:-2]), pattern


def test_the_sites_payload_fields_mean_what_they_mean_in_other_domains():
    """Readers flatten payloads into one column per field name (spark_apps/events.py), so a name has one kind
    across domains: the site's reason, record, resolved_by and evidence are the account's and the device's, and its
    own names are nobody else's."""
    from event_store import account, iot

    def fields(domain):
        return {name: spec for kind in (domain.commands, domain.events) for f in kind.values()
                for name, spec in f.items()}

    mine = fields(site.DOMAIN)
    for other in (fields(account.DOMAIN), fields(iot.DOMAIN)):
        shared = mine.keys() & other.keys()
        assert shared == {"reason", "record", "resolved_by", "evidence"}
        assert {n: mine[n].kind for n in shared} == {n: other[n].kind for n in shared}
    own = {"site_name", "host", "view_id", "page", "visitor_id", "viewed_at"}
    assert own <= set(mine) and not own & (set(fields(account.DOMAIN)) | set(fields(iot.DOMAIN)))


def test_site_commands_route_to_the_site_aggregate_through_the_generic_decider():
    raw = json.dumps({"command_id": "c1", "command_type": "RegisterSite", "aggregate_id": SITE,
                      "issued_at": T0, "payload": register().payload}).encode()
    command = CommandEnvelope.from_json(raw)
    assert command.aggregate_type == "site" and initial_state(command) == SiteState(SITE)
    state, events, result = execute(initial_state(command), command, recorded_at=T0)
    assert result.accepted and state.version == 1
    # A logged event reads back through the registry's schemas and folds to the same state.
    assert evolve(SiteState(SITE), EventEnvelope.from_json(events[0].to_json())) == state
    assert execute_encoded(SiteState(SITE), command, T0)[1] == [events[0].to_json()]
    stale = execute(state, view(expected_version=0))[2]
    assert (stale.error_type, stale.reason) == ("ConcurrencyConflict",
                                                "expected version 0 of site site-1, but it is at version 1")
    with pytest.raises(InvalidRecord, match="command_type 'RecordPageView' is not a command of aggregate type "
                                            "'account' \\(it belongs to 'site'\\)"):
        CommandEnvelope.from_dict({**json.loads(view().to_json()), "aggregate_type": "account"})


def test_a_view_beyond_the_handlers_clock_is_rejected_by_the_decider():
    limit = EventTimeLimit.at(parse_time(T0, "now"), 60)
    state, _, _ = run(register())
    _, events, result = execute(state, view(at="2026-01-01T11:00:00.000Z"), time_limit=limit)
    assert (events, result.error_type) == ([], "EventTimeInFuture")
    assert result.reason.startswith(f"command {result.command_id}: viewed_at 2026-01-01T11:00:00.000Z "
                                    f"(PageViewed) lies 3,600s ahead of the handler's clock")


def test_a_site_survives_a_snapshot_and_the_rebuild_folds_its_events():
    state, events, _ = run(register(), view("v1"), view("v2", "/b"), cmd("RetireSite", {}))
    rebuilder = PartitionRebuilder(Settings.load({}), log=lambda *_: None)
    part = PartitionState(0)
    for offset, event in enumerate(events):
        rebuilder.apply_logged(part, EventEnvelope.from_json(event.to_json()),
                               SimpleNamespace(topic="events", offset=offset))
    assert part.states == {("site", SITE): state}
    part.states[("site", "site-q")] = quarantined(SiteState("site-q"), "events/0/7", "not JSON")
    records = [SimpleNamespace(key=k, value=v) for k, v in snapshot_records(part)]
    assert load_snapshot(records, 0, 100).states == part.states


def test_a_quarantined_site_takes_only_the_resolution_that_names_its_record():
    state, _, _ = run(register())
    state = quarantined(state, "events/2/41", "aggregate_version: must be > 0, got -1")
    assert quarantined(state, "events/2/99", "another") == state
    error, reason = rejection(state, view())
    assert error == "SiteQuarantined" and "events/2/41: aggregate_version: must be > 0" in reason
    assert "ResolveSiteQuarantine with record 'events/2/41'" in reason
    resolve = {"record": "events/2/41", "reason": "forged record", "resolved_by": "ops-anna"}
    assert rejection(state, cmd("ResolveSiteQuarantine", {**resolve, "record": "events/2/40"})) == (
        "QuarantineRecordMismatch", "site site-1 is quarantined by record events/2/41, not events/2/40")
    state, events, result = execute(state, cmd("ResolveSiteQuarantine", resolve))
    assert [e.event_type for e in events] == [site.DOMAIN.quarantine_resolved_event]
    assert events[0].payload == {**resolve, "evidence": "aggregate_version: must be > 0, got -1"}
    assert result.accepted and state.quarantine is None and state.version == 2
    assert execute(state, view())[2].accepted
    assert rejection(state, cmd("ResolveSiteQuarantine", resolve))[0] == "NotQuarantined"


_COMMANDS = st.one_of(
    st.builds(lambda: register()),
    st.builds(lambda minute, page, visitor: view(f"v{minute}", page, visitor, f"2026-01-01T10:{minute:02d}:00Z"),
              st.integers(0, 59), st.sampled_from(["/", "/a", "/b/c"]), st.sampled_from(["u1", "u2"])),
    st.builds(lambda: cmd("RetireSite", {})),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_COMMANDS, max_size=25))
def test_any_command_sequence_folds_from_its_events_to_the_deciders_state_and_through_a_snapshot(commands):
    """Whatever is sent: versions run 1, 2, 3 without a gap, folding the logged events again gives the decider's
    state, views are recorded only while registered and active, and the state survives a snapshot."""
    state, events, results = run(*commands)
    assert [e.aggregate_version for e in events] == list(range(1, len(events) + 1))
    refolded = SiteState(SITE)
    for e in events:
        refolded = evolve(refolded, EventEnvelope.from_json(e.to_json()))
    assert refolded == state
    assert state.page_views_recorded == sum(e.event_type == "PageViewed" for e in events)
    for c, r in zip(commands, results):
        if c.command_type == "RecordPageView" and not r.accepted:
            assert r.error_type in ("SiteNotFound", "SiteNotActive")
    assert site.DOMAIN.decode_state(json.loads(json.dumps(site.DOMAIN.encode_state(state)))) == state


def test_the_spark_side_carries_the_sites_payload_fields_next_to_the_other_domains():
    """Registered after the device domain, the site adds its own columns after the others' to the event rows, and
    no field name is refused (one kind per name across domains; none named like a column of the rows)."""
    from spark_apps.events import payload_columns

    assert list(domains.DOMAINS)[:3] == ["account", "device", "site"]
    verbs, generate = domains.VERBS.get("site", ()), domains.GENERATORS.get("site")  # put back with it below
    domains.unregister("site")  # built in: registered again below, after the device
    try:
        before = payload_columns()
        with domains.registered(site.DOMAIN):
            assert payload_columns() == (*before, "site_name", "host", "view_id", "page", "visitor_id")
    finally:
        if "site" not in domains.DOMAINS:
            domains.register(site.DOMAIN, verbs, generate)
