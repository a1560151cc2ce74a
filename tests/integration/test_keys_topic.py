"""The keys topic (event_store/keys_topic.py): key stores of homes on different machines (here: folders) that share
only the broker agree on every subject's key and tombstone."""
from __future__ import annotations

import json

import pytest

from event_store import kafka_log
from event_store.keys_topic import POSITION_FILE, KeysTopicError
from event_store.personal_data import KeyRaceLost, KeyRecord, SubjectForgotten, SubjectKeyMissing, keys_dir
from event_store.sealing import subject_keys

ADA = "cust-ada"
ODD = 'cüst "ø" ' + "x" * 300  # Unicode, quotes, long


def _homes(settings, tmp_path, *names):
    return [settings.replace(home=tmp_path / name, keys_topic_follow_s=0.0) for name in names]


def _topic(settings) -> list[KeyRecord]:
    return [KeyRecord.decode(r.key, r.value) for r in kafka_log.read_all(settings, settings.keys_topic)]


def test_homes_that_share_only_the_broker_open_each_others_values_and_forget_together(settings, tmp_path):
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    writer_home, reader_home, other_home = _homes(settings, tmp_path, "writer", "reader", "other")
    writer = subject_keys(writer_home, defer_sync=True)
    sealed = {s: writer.seal(s, "location", f"place of {s}") for s in (ADA, ODD)}

    # Made, not yet on the topic (provisional): another home does not know them, and says where it looked.
    reader = subject_keys(reader_home)
    with pytest.raises(SubjectKeyMissing, match=f"the keys topic {settings.keys_topic}"):
        reader.unseal(sealed[ADA], field_name="location")
    assert writer.unsynced and _topic(settings) == []

    # What the handler does before it commits: the keys published, and first on the topic.
    writer.sync()
    assert not writer.unsynced
    assert {r.subject for r in _topic(settings)} == {ADA, ODD}
    # A home that never held them restores them from the topic, into its own files, with the position read.
    assert {s: reader.unseal(t, field_name="location") for s, t in sealed.items()} == \
        {s: f"place of {s}" for s in sealed}
    restored = subject_keys(reader_home.replace(subject_keys_topic="off"))
    assert restored.state(ADA) == restored.state(ODD) == "key"
    position = json.loads((keys_dir(reader_home.home) / POSITION_FILE).read_text())
    assert position == {"topic": settings.keys_topic, "offset": 2}

    # Two homes make a key for one subject at the same moment: the first on the topic is its key; the other's
    # sync refuses what it sealed (the handler then decides it again), and its next seal uses the winner.
    other = subject_keys(other_home, defer_sync=True)
    other.refresh()
    late = "cust-grace"
    mine, theirs = writer.seal(late, "location", "NZ-WLG"), other.seal(late, "location", "NZ-AKL")
    writer.sync()
    with pytest.raises(KeyRaceLost, match=f"first: '{late}'"):
        other.sync()
    again = other.seal(late, "location", "NZ-AKL")
    other.sync()
    assert [reader.unseal(t, field_name="location") for t in (mine, again)] == ["NZ-WLG", "NZ-AKL"]
    with pytest.raises(ValueError, match="does not authenticate"):
        reader.unseal(theirs, field_name="location")  # sealed under the key that lost: never committed
    # Both were written, order decides; the loser wrote the winner again after its own key: compaction keeps a
    # subject's latest record, so a home that reads the compacted topic later takes the winner too.
    winner, loser, last = [r.key for r in _topic(settings) if r.subject == late]
    assert winner == last == writer.key_of(late) != loser

    # Forgotten in one home: the tombstone on the topic; every other home reads null and refuses new data.
    assert other.forget(ADA)
    assert not writer.forget(ADA)  # already forgotten (the topic says so): its tombstone written again, harmless
    assert [r.forgotten for r in _topic(settings) if r.subject == ADA] == [False, True, True]
    reader.refresh()
    assert reader.unseal(sealed[ADA], field_name="location") is None
    assert reader.unseal(sealed[ODD], field_name="location") == f"place of {ODD}"
    writer.refresh()
    with pytest.raises(SubjectForgotten):
        writer.seal(ADA, "location", "IS-AKU")
    # ... and the reader's files: no key of hers left in them (the tombstone compacted them).
    files = b"".join(p.read_bytes() for p in keys_dir(reader_home.home).iterdir() if p.is_file())
    key = next(r.key for r in _topic(settings) if r.subject == ADA and not r.forgotten)
    assert key is not None and key not in files and len(files) > 0
    # A tombstone made with the topic off (these files alone) reaches the topic when forgotten again with it on.
    assert subject_keys(writer_home.replace(subject_keys_topic="off")).forget("cust-files-only")
    assert not writer.forget("cust-files-only")
    assert [r.forgotten for r in _topic(settings) if r.subject == "cust-files-only"] == [True]


def test_a_home_whose_keys_were_made_with_the_topic_off_brings_them_to_it_on_its_first_follow(settings, tmp_path):
    """Keys and a tombstone only a home's files hold (made before the topic was on) are published on the first
    follow: another home then opens those values and refuses the forgotten subject; a subject the topic already
    holds another key for is said, and the topic's key is kept."""
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    old_home, elsewhere_home, other_home = _homes(settings, tmp_path, "old", "elsewhere", "other")
    racing = subject_keys(other_home, defer_sync=True)
    racing.seal("cust-both", "location", "there")
    racing.sync()  # on the topic first
    files_only = subject_keys(old_home.replace(subject_keys_topic="off"))
    tokens = {s: files_only.seal(s, "location", f"place of {s}") for s in (ADA, ODD, "cust-both")}
    assert files_only.forget("cust-gone")
    assert len(_topic(settings)) == 1

    lines: list[str] = []
    home = subject_keys(old_home)
    home.topic.log = lines.append
    home.refresh()  # its first follow
    assert {r.subject: r.forgotten for r in _topic(settings)} == \
        {"cust-both": False, ADA: False, ODD: False, "cust-gone": True}
    assert any("3 record(s) that only the key store's files held published" in line for line in lines), lines
    assert any("1 subject(s) (first: 'cust-both') have another key" in line for line in lines), lines
    assert home.unseal(tokens["cust-both"], field_name="location") == "place of cust-both"  # its own, here

    elsewhere = subject_keys(elsewhere_home)
    assert [elsewhere.unseal(tokens[s], field_name="location") for s in (ADA, ODD)] == \
        [f"place of {s}" for s in (ADA, ODD)]
    assert elsewhere.state("cust-gone") == "forgotten"
    published = len(_topic(settings))
    subject_keys(old_home).refresh()  # its position is kept: nothing published again
    assert len(_topic(settings)) == published


def test_without_the_broker_a_store_goes_on_with_its_files_and_an_unknown_subject_names_the_topic(settings, tmp_path):
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    [home] = _homes(settings, tmp_path, "home")
    writer = subject_keys(home, defer_sync=True)
    token = writer.seal(ADA, "location", "IS-RKV")
    writer.sync()
    away = home.replace(kafka_bootstrap_servers="127.0.0.1:1")
    lines = []
    known = subject_keys(away)
    known.topic.log, known.topic.timeout_s = lines.append, 1.0
    assert known.unseal(token, field_name="location") == "IS-RKV"  # its files have the key: no error
    assert known.refresh() is False and known.refresh() is False
    assert len(lines) == 1 and f"the keys topic {settings.keys_topic} cannot be read" in lines[0]
    stranger = subject_keys(away.replace(home=tmp_path / "stranger"))
    stranger.topic.timeout_s = 1.0
    with pytest.raises(KeysTopicError, match=f"the keys topic {settings.keys_topic} cannot be read"):
        stranger.unseal(token, field_name="location")
    # A key made while the broker is away is never used in a commit: its sync fails, naming the topic.
    with pytest.raises(KeysTopicError, match=f"the keys topic {settings.keys_topic}: 1 key record"):
        stranger.seal("cust-new", "location", "FO-TOR")
        stranger.topic.timeout_s = 1.0
        stranger.sync()


def test_a_handler_whose_new_key_lost_the_race_decides_its_transaction_again_with_the_winner(settings, tmp_path):
    from event_store.envelope import EventEnvelope
    from event_store.handler import CommandHandler
    from event_store.sealing import Sealer
    from tests.integration.test_personal_data_sealing import ADA, commands_of, results, send

    settings = settings.replace(personal_data_seal="on")
    kafka_log.ensure_topics(settings, log=lambda *_: None)
    # The handler's store has read the topic and will not again by itself: the other home's key comes within
    # keys_topic_follow_s of the handler's transaction, so the handler makes a key of its own for her.
    keys = subject_keys(settings.replace(keys_topic_follow_s=3600.0), defer_sync=True)
    keys.refresh()
    elsewhere, reader_home = _homes(settings, tmp_path, "elsewhere", "reader")
    other = subject_keys(elsewhere, defer_sync=True)
    other.seal("cust-ada", "customer_name", "made elsewhere first")
    other.sync()
    commands = commands_of("acc-ada", "cust-ada", ADA, ["IS-RKV", "FO-TOR"], 2)
    send(settings, commands)
    lines: list[str] = []
    handler = CommandHandler(settings, log=lines.append)
    handler.sealer = Sealer(keys)
    with handler:
        handler.run(until_caught_up=True, max_seconds=120)
    aborted = [line for line in lines if "transaction aborted" in line]
    assert len(aborted) == 1 and "made here (first: 'cust-ada') were not the first on the keys topic" in aborted[0]
    answered = results(settings)
    assert [answered[c.command_id].status for c in commands] == ["accepted"] * len(commands)
    # What committed was sealed under the winner: a third home, which knows only the topic, opens every value.
    events = [EventEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.events_topic)]
    reader = subject_keys(reader_home)
    opened = [reader.unseal(e.payload[f], field_name=f) for e in events for f in ("customer_name", "location")
              if e.payload.get(f) is not None]
    assert opened == [ADA["customer_name"], "IS-RKV", "IS-RKV", "FO-TOR"]
    # The winner, then the handler's key that lost, then the winner again (what compaction keeps: the latest).
    winner, lost, last = [r for r in _topic(settings) if r.subject == "cust-ada"]
    assert winner == last and winner.key != lost.key
