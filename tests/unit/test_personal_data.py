"""Personal data (issue 45, first slice): per-subject keys, sealed values, forgetting, the schemas' personal fields.

Pure logic on a temporary directory: no Kafka, no Spark. docs/forgetting.md describes the design."""
from __future__ import annotations

import base64
import json
import os

import pytest

from event_store.account.schemas import COMMANDS as ACCOUNT_COMMANDS
from event_store.account.schemas import EVENTS as ACCOUNT_EVENTS
from event_store.fields import ID, Field, payload_decoder, validate_payload
from event_store.iot.schemas import COMMANDS as IOT_COMMANDS
from event_store.iot.schemas import EVENTS as IOT_EVENTS
from event_store.personal_data import (CIPHERS_KEPT, HEADS_KEPT, TOKEN_PREFIX, KeyRecord, SealedValueError, SubjectForgotten,
                                       SubjectKeyMissing, SubjectKeys, is_sealed, keys_dir, personal_fields,
                                       personal_fields_by_type, seal_payload, unseal_payload)
from event_store.site.schemas import COMMANDS as SITE_COMMANDS
from event_store.site.schemas import EVENTS as SITE_EVENTS
from lakehouse.errors import BadInput, EventlakeError, NotFound, Refused

SUBJECT = "cus-1"


@pytest.fixture
def keys(tmp_path):
    return SubjectKeys(keys_dir(tmp_path))


def _tamper(token: str, part: int, change) -> str:
    """``token`` with its ``part``-th ':'-separated part (0: the subject, 1: the field, 2: the sealed bytes) changed."""
    prefix, rest = token[:len(TOKEN_PREFIX)], token[len(TOKEN_PREFIX):].split(":")
    rest[part] = change(rest[part])
    return prefix + ":".join(rest)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# -- values --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["US-NYC", "", "Zoë Å 東京 \U0001F600", "a\ud800b", 0, -7, 10 ** 30, 2.5, -0.0,
                                   1e300, True, False, None])
def test_a_value_comes_back_with_its_type(keys, value):
    token = keys.seal(SUBJECT, "location", value)
    assert token.startswith(TOKEN_PREFIX) and is_sealed(token)
    back = keys.unseal(token)
    assert back == value and type(back) is type(value)
    assert keys.unseal(token, subject=SUBJECT, field_name="location") == value


def test_a_token_names_no_value_and_differs_each_time(keys):
    one, two = keys.seal(SUBJECT, "location", "US-NYC"), keys.seal(SUBJECT, "location", "US-NYC")
    assert one != two  # a fresh nonce per value: equal values are not seen to be equal
    assert "US-NYC" not in one and b"US-NYC" not in _unb64(one.split(":")[3])


@pytest.mark.parametrize("value", [[1], {"a": 1}, b"x", float("nan"), float("inf")])
def test_only_json_scalars_are_sealed(keys, value):
    with pytest.raises(BadInput, match="field 'location'"):
        keys.seal(SUBJECT, "location", value)


def test_a_token_moved_to_another_field_or_subject_is_refused(keys):
    token = keys.seal(SUBJECT, "location", "US-NYC")
    keys.seal("cus-2", "location", "GB-LON")  # the other subject has a key: only the binding can refuse it
    with pytest.raises(SealedValueError, match=r"field 'evidence'.*sealed for field 'location'.*moved"):
        keys.unseal(token, field_name="evidence")
    with pytest.raises(SealedValueError, match=r"field 'location' of subject 'cus-2'.*subject 'cus-1'.*moved"):
        keys.unseal(token, subject="cus-2")
    # Rewriting the names inside the token does not get past the associated data.
    as_evidence = _tamper(token, 1, lambda _: "evidence")
    with pytest.raises(SealedValueError, match=r"field 'evidence' of subject 'cus-1'.*does not authenticate"):
        keys.unseal(as_evidence, field_name="evidence")
    as_other = _tamper(token, 0, lambda _: _b64(b"cus-2"))
    with pytest.raises(SealedValueError, match=r"field 'location' of subject 'cus-2'.*does not authenticate"):
        keys.unseal(as_other)


def test_a_tampered_token_is_refused_naming_field_and_reason(keys):
    token = keys.seal(SUBJECT, "location", "US-NYC")

    def flip(part: str) -> str:
        raw = bytearray(_unb64(part))
        raw[-1] ^= 1
        return _b64(bytes(raw))

    with pytest.raises(SealedValueError, match=r"field 'location' of subject 'cus-1'.*does not authenticate"):
        keys.unseal(_tamper(token, 2, flip))
    with pytest.raises(SealedValueError, match=r"field 'location'.*corrupt"):
        keys.unseal(_tamper(token, 2, lambda p: p[:10]))  # cut short: no whole nonce and tag
    with pytest.raises(SealedValueError, match=r"field 'location'.*corrupt"):
        keys.unseal(_tamper(token, 2, lambda p: p + "!"))  # not base64url
    with pytest.raises(SealedValueError, match=r"field 'location'.*not a sealed value"):
        keys.unseal("US-NYC", field_name="location")
    with pytest.raises(SealedValueError, match=r"corrupt"):
        keys.unseal(TOKEN_PREFIX + "nonsense")
    assert issubclass(SealedValueError, BadInput)


# -- the key store -----------------------------------------------------------------------------------------------

def test_keys_survive_a_reopen(tmp_path):
    first = SubjectKeys(keys_dir(tmp_path))
    tokens = {s: first.seal(s, "location", f"US-{n:03d}") for n, s in enumerate(["cus-1", "cus-2", "a:b/c ü"])}
    again = SubjectKeys(keys_dir(tmp_path))
    assert {s: again.unseal(t) for s, t in tokens.items()} == {"cus-1": "US-000", "cus-2": "US-001",
                                                                 "a:b/c ü": "US-002"}
    assert {r.subject for r in again.records()} == set(tokens)
    assert [oct(p.stat().st_mode & 0o777) for p in keys_dir(tmp_path).iterdir() if p.name.startswith("keys")] \
        == ["0o600"]  # the journal (no snapshot yet): never readable by others


def test_another_process_s_new_key_is_found(tmp_path):
    reader = SubjectKeys(keys_dir(tmp_path))
    writer = SubjectKeys(keys_dir(tmp_path))
    token = writer.seal(SUBJECT, "location", "US-NYC")
    assert reader.unseal(token) == "US-NYC"  # not known when it opened: read again once


def test_a_forgotten_subject_reads_null_and_stays_forgotten(tmp_path, keys):
    token = keys.seal(SUBJECT, "location", "US-NYC")
    other = keys.seal("cus-2", "location", "GB-LON")
    assert keys.forget(SUBJECT) is True
    assert keys.unseal(token) is None  # no error: the value is gone
    assert keys.state(SUBJECT) == "forgotten" and keys.forget(SUBJECT) is False
    assert keys.unseal(other) == "GB-LON"  # the others are untouched
    again = SubjectKeys(keys_dir(tmp_path))
    assert again.unseal(token) is None and again.unseal(other) == "GB-LON"
    # Its new data is refused, never sealed under a fresh key that would make the subject readable again.
    with pytest.raises(SubjectForgotten, match=r"field 'location' of subject 'cus-1'.*forgotten"):
        again.seal(SUBJECT, "location", "US-BOS")
    assert again.state(SUBJECT) == "forgotten" and SubjectKeys(keys_dir(tmp_path)).unseal(token) is None
    assert issubclass(SubjectForgotten, Refused)


def test_values_of_more_subjects_than_the_store_keeps_ciphers_for_open_and_a_forgotten_one_reads_null(tmp_path):
    """The store's caches are bounded (issue 42): a value whose subject's cipher and token head were dropped since
    opens again, a tampered one is still refused, and a subject forgotten by another process reads as null."""
    writer = SubjectKeys(keys_dir(tmp_path), defer_sync=True)
    many = max(CIPHERS_KEPT, HEADS_KEPT) + 100
    tokens = [writer.seal(f"cus-{i}", "location", f"place {i}") for i in range(many)]
    writer.sync()
    reader = SubjectKeys(keys_dir(tmp_path))
    assert [reader.unseal(t, field_name="location") for t in tokens[:3]] == ["place 0", "place 1", "place 2"]
    assert [reader.unseal(t) for t in tokens[3:]] == [f"place {i}" for i in range(3, many)]  # the first ones dropped
    assert reader.unseal(tokens[0], subject="cus-0") == "place 0"  # opened again
    with pytest.raises(SealedValueError, match=r"field 'location' of subject 'cus-1': the token does not authenticate"):
        reader.unseal(_tamper(tokens[1], 2, lambda sealed: sealed[:-4] + ("AAAA" if sealed[-4:] != "AAAA" else "BBBB")))
    assert SubjectKeys(keys_dir(tmp_path)).forget("cus-2") is True
    reader.refresh()
    assert reader.unseal(tokens[2]) is None and reader.unseal(tokens[many - 1]) == f"place {many - 1}"
    assert writer.seal(f"cus-{many - 1}", "location", "again") != tokens[many - 1]
    writer.refresh()  # the forgetting reaches a writer with its next refresh, cipher cached or not
    with pytest.raises(SubjectForgotten):
        writer.seal("cus-2", "location", "US-BOS")


def test_forgetting_removes_the_key_bytes_from_the_file(tmp_path, keys):
    keys.seal(SUBJECT, "location", "US-NYC")
    key = next(r.key for r in keys.records() if r.subject == SUBJECT)
    def stored():
        return b"".join(p.read_bytes() for p in keys_dir(tmp_path).iterdir())

    assert _b64(key).encode() in stored()  # in the journal
    keys.forget(SUBJECT)
    assert _b64(key).encode() not in stored() and b"forgotten_at" in stored()  # compacted: a new snapshot
    assert not [p for p in keys_dir(tmp_path).iterdir() if p.name.endswith(".partial")]


def test_a_subject_the_store_never_knew_is_an_error_not_a_null(tmp_path, keys):
    token = SubjectKeys(tmp_path / "another-home").seal(SUBJECT, "location", "US-NYC")
    with pytest.raises(SubjectKeyMissing, match=r"field 'location' of subject 'cus-1'.*no key and no tombstone"):
        keys.unseal(token)
    assert issubclass(SubjectKeyMissing, NotFound)


def test_the_store_file_holds_no_value(tmp_path, keys):
    values = ["US-NYC", "GB-LON", "payment at US-NYC, device at GB-LON", 123456789, "Zoë"]
    for n, value in enumerate(values):
        keys.seal(f"cus-{n}", "evidence", value)
    keys.forget("cus-1")
    raw = b"".join(p.read_bytes() for p in keys_dir(tmp_path).iterdir())
    for value in values:
        for form in {str(value).encode(), json.dumps(value).encode(), str(value).encode("utf-16-le")}:
            assert form not in raw, f"{value!r} found in the key store"
    assert b"cus-0" in raw  # the scan reads the right bytes: subject ids are there


def test_a_damaged_store_is_an_error_and_is_not_overwritten(tmp_path):
    directory = keys_dir(tmp_path)
    SubjectKeys(directory).seal(SUBJECT, "location", "US-NYC")
    (directory / "keys.json").write_text("{not json")
    with pytest.raises(BadInput, match="unreadable"):
        SubjectKeys(directory)
    assert (directory / "keys.json").read_text() == "{not json"


def test_key_records_carry_keys_and_tombstones_for_a_keys_topic(tmp_path, keys):
    token = keys.seal(SUBJECT, "location", "US-NYC")
    keys.seal("cus-2", "location", "GB-LON")
    keys.forget("cus-2")
    records = {r.subject: r for r in keys.records()}
    assert not records[SUBJECT].forgotten and records["cus-2"].forgotten
    encoded = [r.encode() for r in records.values()]
    # A tombstone is a value of its own, never Kafka's null (compaction drops nulls, and the tombstone with them).
    assert all(value is not None and b'"key"' not in value for key, value in encoded if key == b"cus-2")
    elsewhere = SubjectKeys(tmp_path / "elsewhere")
    elsewhere.apply(KeyRecord.decode(k, v) for k, v in encoded)
    assert elsewhere.unseal(token) == "US-NYC" and elsewhere.state("cus-2") == "forgotten"
    elsewhere.apply([KeyRecord(SUBJECT, None, "2026-01-01T00:00:00+00:00")])  # a tombstone wins
    assert elsewhere.unseal(token) is None
    elsewhere.apply([records[SUBJECT]])  # and a key never comes back over it
    assert elsewhere.unseal(token) is None
    with pytest.raises(Refused, match="keys never change"):
        keys.apply([KeyRecord(SUBJECT, bytes(32))])


# -- payloads ------------------------------------------------------------------------------------------------------

def test_a_payload_round_trip(keys):
    personal = personal_fields(ACCOUNT_EVENTS["PaymentDeclined"])
    payload = {"payment_id": "p1", "amount_minor": 1250, "currency": "USD", "merchant_id": "m1",
               "location": "US-NYC", "reason": "over_limit"}
    sealed = seal_payload(keys, SUBJECT, payload, personal)
    assert payload["location"] == "US-NYC"  # a new dict; the given one is not changed
    assert is_sealed(sealed["location"]) and {k: v for k, v in sealed.items() if k != "location"} == \
        {k: v for k, v in payload.items() if k != "location"}
    assert unseal_payload(keys, SUBJECT, sealed, personal) == payload
    keys.forget(SUBJECT)
    assert unseal_payload(keys, SUBJECT, sealed, personal) == {**payload, "location": None}


def test_a_payload_keeps_absent_and_null_fields_and_refuses_misplaced_tokens(keys):
    personal = personal_fields(ACCOUNT_EVENTS["FraudSuspected"])
    assert seal_payload(keys, SUBJECT, {"payment_id": "p1", "rule": "r"}, personal) == {"payment_id": "p1",
                                                                                        "rule": "r"}
    assert seal_payload(keys, SUBJECT, {"evidence": None}, personal) == {"evidence": None}
    sealed = seal_payload(keys, SUBJECT, {"payment_id": "p1", "rule": "r", "evidence": "at US-NYC"}, personal)
    with pytest.raises(SealedValueError, match=r"field 'evidence' of subject 'cus-2'.*moved"):
        unseal_payload(keys, "cus-2", sealed, personal)
    with pytest.raises(SealedValueError, match=r"field 'location'.*sealed for field 'evidence'"):
        unseal_payload(keys, SUBJECT, {"location": sealed["evidence"]}, {"location"})
    with pytest.raises(SealedValueError, match=r"field 'evidence'.*plain value"):
        unseal_payload(keys, SUBJECT, {"evidence": "at US-NYC"}, personal)
    assert unseal_payload(keys, SUBJECT, {"evidence": "at US-NYC"}, personal, plaintext_ok=True) == \
        {"evidence": "at US-NYC"}


# -- marking -------------------------------------------------------------------------------------------------------

def test_the_account_schemas_personal_fields():
    assert personal_fields_by_type(ACCOUNT_COMMANDS) == {
        "OpenAccount": {"customer_name", "customer_email"},
        "AuthorizePayment": {"location"}, "ReportDeviceLocation": {"location"}, "FlagFraud": {"evidence"}}
    assert personal_fields_by_type(ACCOUNT_EVENTS) == {
        "AccountOpened": {"customer_name", "customer_email"},
        "PaymentAuthorized": {"location"}, "PaymentDeclined": {"location"}, "DeviceLocationReported": {"location"},
        "FraudSuspected": {"evidence"}}
    assert "customer_id" not in personal_fields(ACCOUNT_EVENTS["AccountOpened"])  # the subject's id, in clear


def test_the_other_domains_have_no_personal_field_yet():
    for schemas in (IOT_COMMANDS, IOT_EVENTS, SITE_COMMANDS, SITE_EVENTS):
        assert personal_fields_by_type(schemas) == {}


def test_the_mark_changes_no_validation():
    plain, marked = ID, Field(str, pattern=ID.pattern, max_length=ID.max_length, personal=True)
    assert plain.msgspec_type() == marked.msgspec_type()
    for value in ("x", "", " ", "y" * 300):
        problems = []
        for spec in (plain, marked):
            try:
                validate_payload({"f": spec}, {"f": value}, "test")
                problems.append(None)
            except EventlakeError as e:
                problems.append(str(e))
        assert (problems[0] is None) == (problems[1] is None), value
    decoder, _, hold = payload_decoder({"location": marked})
    assert hold(decoder.decode(b'{"location": "US-NYC"}'))


@pytest.mark.parametrize("field_name, value", [("customer_email", "Ada Lovelace at home"), ("customer_name", "Ada\n"),
                                               ("customer_name", 1815), ("location", "Reykjavik 101")])
def test_a_rejected_personal_value_is_not_quoted_in_the_reason(field_name, value):
    """The reason of a rejection goes to the command's result, the logs and the dead letters, where forgetting the
    subject cannot reach it: a personal field's value is named, not quoted (a field that is not personal is)."""
    schema = ACCOUNT_COMMANDS["AuthorizePayment" if field_name == "location" else "OpenAccount"]
    with pytest.raises(BadInput) as refused:
        validate_payload({field_name: schema[field_name]}, {field_name: value}, "OpenAccount")
    reason = str(refused.value)
    assert f"field '{field_name}'" in reason and "personal data: not quoted" in reason
    assert str(value).strip() not in reason and repr(value) not in reason
    with pytest.raises(BadInput, match="'XXX' is not a known ISO-4217 currency code"):
        validate_payload({"currency": schema["currency"]}, {"currency": "XXX"}, "OpenAccount")


def test_the_store_directory_is_private(tmp_path, keys):
    keys.seal(SUBJECT, "location", "US-NYC")
    assert oct(os.stat(keys_dir(tmp_path)).st_mode & 0o777) == "0o700"


def test_a_key_made_is_one_journal_line_and_the_journal_is_compacted_as_it_grows(tmp_path):
    """Making a key appends a line (the whole store is not rewritten per key: that cost grew with the customers);
    past ``compact_after`` lines (and the snapshot's size) the next key compacts it into a new snapshot. Another
    process's store reads only the new lines, and every key survives a reopen."""
    directory = keys_dir(tmp_path)
    writer = SubjectKeys(directory, compact_after=10)
    reader = SubjectKeys(directory)
    tokens = {}
    for n in range(8):
        tokens[f"cus-{n}"] = writer.seal(f"cus-{n}", "location", f"US-{n:03d}")
    assert not (directory / "keys.json").exists()
    assert len((directory / "keys.journal").read_bytes().splitlines()) == 8
    assert reader.refresh() and len(reader) == 8 and not reader.refresh()  # the new lines, then nothing
    for n in range(8, 25):
        tokens[f"cus-{n}"] = writer.seal(f"cus-{n}", "location", f"US-{n:03d}")
    snapshot = json.loads((directory / "keys.json").read_text())
    assert 10 < len(snapshot["records"]) < 25  # compacted once, then appended again
    assert len(snapshot["records"]) + len((directory / "keys.journal").read_bytes().splitlines()) == 25
    again = SubjectKeys(directory)
    assert {s: again.unseal(t) for s, t in tokens.items()} == {f"cus-{n}": f"US-{n:03d}" for n in range(25)}
    assert {s: reader.unseal(t) for s, t in tokens.items()} == {f"cus-{n}": f"US-{n:03d}" for n in range(25)}


def test_a_writer_killed_in_the_middle_of_a_journal_line_loses_no_key(tmp_path):
    """A partial last line (a writer killed -9 while appending) is not read, and the next writer cuts it off before
    it appends: every key written before and after is read back."""
    directory = keys_dir(tmp_path)
    keys = SubjectKeys(directory)
    first = keys.seal("cus-1", "location", "US-NYC")
    with open(directory / "keys.journal", "ab") as journal:
        journal.write(b'{"key": "AAAA", "subj')  # killed here
    survivor = SubjectKeys(directory)
    assert survivor.unseal(first) == "US-NYC" and len(survivor) == 1
    second = survivor.seal("cus-2", "location", "GB-LON")
    lines = (directory / "keys.journal").read_bytes().split(b"\n")
    assert lines[-1] == b"" and [json.loads(line)["subject"] for line in lines[:-1]] == ["cus-1", "cus-2"]
    reopened = SubjectKeys(directory)
    assert (reopened.unseal(first), reopened.unseal(second)) == ("US-NYC", "GB-LON")
    assert keys.unseal(second) == "GB-LON"  # the first store reads the new line past the cut


def test_the_handlers_keys_are_made_durable_once_per_transaction(tmp_path):
    """``defer_sync`` (the handler's sealer): keys are appended and readable at once, and ``sync`` (before the
    transaction commits) leaves nothing pending."""
    directory = keys_dir(tmp_path)
    handler = SubjectKeys(directory, defer_sync=True)
    tokens = [handler.seal(f"cus-{n}", "location", "US-NYC") for n in range(3)]
    assert handler.unsynced
    assert [SubjectKeys(directory).unseal(t) for t in tokens] == ["US-NYC"] * 3
    handler.sync()
    assert not handler.unsynced


def test_the_store_knows_whether_it_holds_a_tombstone_however_it_learnt_of_it(tmp_path):
    """What lets the handler skip a command's subject lookup while nobody is forgotten: it must turn true however a
    tombstone reaches the store (a forgetting here, one elsewhere then a refresh, a journal line)."""
    keys = SubjectKeys(tmp_path / "a")
    keys.seal("cust-1", "location", "IS-RKV")
    assert not keys.forgotten_any
    SubjectKeys(keys.directory).forget("cust-1")  # another process
    assert not keys.forgotten_any  # not read yet
    keys.refresh()
    assert keys.forgotten_any and keys.state("cust-1") == "forgotten"
    here = SubjectKeys(tmp_path / "b")
    here.forget("cust-2")
    assert here.forgotten_any
    # A tombstone as a journal line (what a merged keys topic may append), read at open and by a refresh.
    reader = SubjectKeys(tmp_path / "c")
    reader.seal("cust-3", "location", "IS-RKV")
    with open(reader.journal, "a") as f:
        f.write(json.dumps(KeyRecord("cust-3", None, "2026-12-02T00:00:00+00:00").to_json()) + "\n")
    assert SubjectKeys(reader.directory).forgotten_any
    assert not reader.forgotten_any
    reader.refresh()
    assert reader.forgotten_any and reader.state("cust-3") == "forgotten"
