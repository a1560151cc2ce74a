"""SASL/SCRAM and ACLs on a real broker (issue 12, security): a broker of this module's own, started as
`eventlake kafka up --security sasl_scram` starts one (infra/kafka.py), on free ports in a temp home.

Proven here against the broker's real behaviour: a client without credentials and one with a wrong password are
refused with one line naming the servers, the principal and the reason (also through the CLI); the roles'
users are served; only the command handler's principal may write the events topic (a client's and a reader's
records are refused by the broker, nothing lands); every role against every topic (commands, events, command
results, dead letters, snapshots), writing and reading: what its ACLs allow works, the rest is refused by the
broker and nothing refused lands (one set of topics for the matrix, on this module's one broker); a command goes through the handler and its event is read by
the reader's principal, with kafka-python and with Spark's Kafka source.
"""
from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from event_store import kafka_clients, kafka_log
from event_store.client import EventStore
from event_store.envelope import CommandEnvelope, EventEnvelope
from event_store.handler import CommandHandler
from event_store.kafka_access import check_access, explain_refusal, grant_acls
from lakehouse.kafka_security import KafkaAccessError, role_credentials
from lakehouse.settings import Settings
from tests.conftest import _free_port
from tests.integration.services import WORKTREE

pytestmark = pytest.mark.slow


def _broker(tmp_path_factory, mode: str):
    from infra import kafka

    broker = Settings.load({}).replace(home=tmp_path_factory.mktemp(f"{mode}-kafka"), kafka_port=_free_port(),
                                       kafka_controller_port=_free_port(), kafka_security=mode)
    kafka.up(broker, log=lambda *_: None)
    return broker


@pytest.fixture(scope="module")
def secured_broker(tmp_path_factory):
    """A broker with SASL/SCRAM and the authorizer, for this module alone."""
    from infra import kafka

    broker = _broker(tmp_path_factory, "sasl_scram")
    try:
        yield broker
    finally:
        kafka.down(broker, log=lambda *_: None)


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    """The same over TLS (`eventlake kafka up --security sasl_scram_tls`)."""
    from infra import kafka

    broker = _broker(tmp_path_factory, "sasl_scram_tls")
    try:
        yield broker
    finally:
        kafka.down(broker, log=lambda *_: None)


def _settings_on(broker: Settings, home) -> Settings:
    """Settings for one test on a secured broker (its own topics and groups), with no user yet: each test
    takes a role's with ``for_role``. The topics and ACLs are made by the admin, as `eventlake topics` does."""
    base = Settings.load({}).replace(
        home=home, kafka_bootstrap_servers=broker.bootstrap_servers,
        kafka_security=broker.kafka_security, kafka_credentials_file=broker.credentials_file,
        topic_prefix=f"sec-{uuid.uuid4().hex[:8]}.", topic_partitions=3,
        handler_group_id=f"handler-{uuid.uuid4().hex[:8]}")
    admin = base.for_role("admin")
    kafka_log.ensure_topics(admin, log=lambda *_: None)
    grant_acls(admin, log=lambda *_: None)
    return base


@pytest.fixture
def secured(secured_broker, tmp_path):
    return _settings_on(secured_broker, tmp_path / "home")


@pytest.fixture
def secured_tls(tls_broker, tmp_path):
    return _settings_on(tls_broker, tmp_path / "home")


def _cli(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(WORKTREE), "EVENTLAKE_HOME": str(settings.home),
                   "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
                   "EVENTLAKE_TOPIC_PREFIX": settings.topic_prefix, **env}
    return subprocess.run([sys.executable, "-m", "eventlake.cli", *args], env=environment, cwd=WORKTREE,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def _open_account(account: str) -> CommandEnvelope:
    return CommandEnvelope.create("OpenAccount", account,
                                  {"customer_id": "cust-1", "credit_limit_minor": 50_000, "currency": "EUR"})


def test_a_client_without_credentials_is_refused_naming_the_servers_and_the_reason(secured):
    anonymous = secured.replace(kafka_security="none")
    with pytest.raises(KafkaAccessError) as refused:
        check_access(anonymous, timeout_s=10)
    message = str(refused.value)
    assert message.startswith(f"Kafka at {secured.bootstrap_servers} refused a client without credentials")
    assert "requires SASL authentication" in message and "EVENTLAKE_KAFKA_USERNAME" in message

    run = _cli(secured, "submit", "-", "--no-wait")  # what a user sees: one line, exit 1, no traceback
    assert run.returncode == 1, run.stderr
    assert run.stderr.strip().splitlines() == [f"eventlake: {message}"]


def test_a_wrong_password_is_refused_naming_the_principal(secured):
    username, _ = role_credentials(secured, "client")
    wrong = secured.replace(kafka_username=username, kafka_password="not-the-password")
    with pytest.raises(KafkaAccessError, match=rf"^Kafka at {secured.bootstrap_servers} refused "
                                               rf"User:eventlake-client: SASL authentication failed \(.*invalid "
                                               rf"credentials with SASL mechanism SCRAM-SHA-512"):
        check_access(wrong, timeout_s=10)

    run = _cli(secured, "submit", "-", "--no-wait", EVENTLAKE_KAFKA_SECURITY="sasl_scram",
               EVENTLAKE_KAFKA_USERNAME=username, EVENTLAKE_KAFKA_PASSWORD="not-the-password")
    assert run.returncode == 1, run.stderr
    assert "refused User:eventlake-client: SASL authentication failed" in run.stderr
    assert "Traceback" not in run.stderr and "not-the-password" not in run.stderr


def _events(settings: Settings) -> list[EventEnvelope]:
    return [EventEnvelope.from_json(r.value) for r in kafka_log.read_all(settings, settings.events_topic)]


def test_only_the_handlers_principal_may_write_the_events_topic(secured):
    client, reader, handler = (secured.for_role(r) for r in ("client", "reader", "handler"))
    assert {client.kafka_username, reader.kafka_username, handler.kafka_username} == \
        {"eventlake-client", "eventlake-reader", "eventlake-handler"}
    forged = _open_account("acc-forged").to_json()

    # The client (a command sender) writes commands, and the broker refuses its record to the events topic.
    failures = []
    producer = kafka_clients.bulk_producer(client, on_failed_delivery=lambda error, _: failures.append(error))
    kafka_clients.produce(producer, client.commands_topic, forged, b"acc-forged")
    kafka_clients.produce(producer, client.events_topic, forged, b"acc-forged")
    assert producer.flush(30) == 0
    assert [f.name() for f in failures] == ["TOPIC_AUTHORIZATION_FAILED"]
    assert explain_refusal(client, failures[0], f"write to {client.events_topic}") == (
        f"Kafka at {client.bootstrap_servers} refused User:eventlake-client: not allowed on the topic "
        f"(TopicAuthorizationFailed) to write to {client.events_topic}: Broker: Topic authorization failed")

    # A reader (kafka-python, plain producer) is refused too, with the same kind of line.
    import kafka.errors

    plain = kafka_log.make_producer(reader, enable_idempotence=False)
    try:
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError) as refused:
            plain.send(reader.events_topic, key=b"acc-forged", value=forged).get(timeout=30)
    finally:
        plain.close()
    assert "refused User:eventlake-reader: not allowed on the topic (TopicAuthorizationFailed)" in \
        explain_refusal(reader, refused.value)

    # Nothing landed; the handler's principal may write there.
    assert _events(reader) == []
    own = kafka_clients.bulk_producer(handler, on_failed_delivery=lambda error, _: failures.append(error))
    kafka_clients.produce(own, handler.events_topic, b"{}", b"probe")
    assert own.flush(30) == 0 and len(failures) == 1
    assert len(list(kafka_log.read_all(reader, reader.events_topic))) == 1


# Every role against every topic eventlake uses (``kafka_log.topic_configs``), by the topic's name after the
# prefix: what each role may write and read (event_store/kafka_access.py's table). Everything else is refused.
TOPICS = ("commands", "events", "command-results", "dead-letters", "handler-snapshots", "subject-keys")
ALLOWED = {
    "handler": {"write": {"events", "command-results", "dead-letters", "handler-snapshots", "subject-keys"},
                "read": {"commands", "events", "command-results", "dead-letters", "handler-snapshots",
                         "subject-keys"}},
    "client": {"write": {"commands"}, "read": {"command-results", "events", "subject-keys"}},
    "reader": {"write": set(), "read": {"events", "dead-letters", "subject-keys"}},
}


@pytest.fixture(scope="module")
def matrix(secured_broker, tmp_path_factory):
    """One set of topics and ACLs for the whole matrix, each topic holding one record the admin wrote (so that
    a read has something to fetch: the broker checks READ when a client fetches)."""
    settings = _settings_on(secured_broker, tmp_path_factory.mktemp("acl-matrix"))
    admin = settings.for_role("admin")
    assert set(kafka_log.topic_configs(settings)) == {settings.topic(t) for t in TOPICS}, \
        "a topic without a row in ALLOWED: add it to the matrix"
    failures = []
    producer = kafka_clients.bulk_producer(admin, on_failed_delivery=lambda error, _: failures.append(error))
    for topic in TOPICS:
        kafka_clients.produce(producer, settings.topic(topic), b"{}", b"admin-probe")
    assert producer.flush(30) == 0 and failures == []
    return settings


def _write(settings: Settings, topic: str, key: bytes) -> str | None:
    """Produce one record as ``settings``' principal (a plain producer: the topic's WRITE is all it needs, where an
    idempotent one also needs a producer id, which the broker gives only a principal allowed some write): None
    when the broker took it, else the refusal's name."""
    import kafka.errors

    producer = kafka_log.make_producer(settings, enable_idempotence=False)
    try:
        producer.send(topic, key=key, value=b"{}").get(timeout=30)
        return None
    except kafka.errors.AuthorizationError as e:
        return type(e).__name__
    finally:
        producer.close()


def _read(settings: Settings, topic: str) -> int | str:
    """Read ``topic`` from the beginning as ``settings``' principal: how many records, or the refusal's name."""
    import kafka.errors

    try:
        return len(list(kafka_log.read_all(settings, topic)))
    except kafka.errors.AuthorizationError as e:
        return type(e).__name__


@pytest.mark.parametrize("topic", TOPICS)
@pytest.mark.parametrize("role", sorted(ALLOWED))
def test_every_role_may_write_and_read_only_its_topics(matrix, role, topic):
    settings = matrix.for_role(role)
    assert settings.kafka_username == f"eventlake-{role}"
    name = matrix.topic(topic)
    may_write, may_read = topic in ALLOWED[role]["write"], topic in ALLOWED[role]["read"]
    key = f"probe-{role}".encode()
    written = _write(settings, name, key)
    assert written == (None if may_write else "TopicAuthorizationFailedError"), (role, topic, written)
    read = _read(settings, name)
    if may_read:
        assert isinstance(read, int) and read >= 1, (role, topic, read)  # the admin's record at least
    else:
        assert read == "TopicAuthorizationFailedError", (role, topic, read)
    # Nothing refused landed; what was allowed did.
    keys = [r.key for r in kafka_log.read_all(matrix.for_role("admin"), name)]
    assert keys.count(key) == may_write, (role, topic, keys)


def test_a_command_goes_through_the_handler_and_its_event_is_read_by_the_reader(secured, spark):
    _through_the_handler_to_the_reader(secured, spark)


def test_over_tls_a_client_without_tls_is_refused_and_the_platform_is_served(secured_tls, spark):
    """`sasl_scram_tls`: the brokers' self-signed certificate, trusted through the generated ca.pem by
    librdkafka, kafka-python and Spark's Java client alike (which check the broker's name against it)."""
    assert secured_tls.ssl_cafile.exists()
    without_tls = secured_tls.replace(kafka_security="sasl_scram").for_role("client")
    with pytest.raises(KafkaAccessError, match=rf"^Kafka at {secured_tls.bootstrap_servers} refused "
                                               rf"User:eventlake-client: the brokers closed the connection at its "
                                               rf"first request, as a TLS listener does"):
        check_access(without_tls, timeout_s=10)
    untrusted = secured_tls.for_role("client").replace(kafka_ssl_cafile=secured_tls.credentials_file.parent / "x.pem")
    untrusted.kafka_ssl_cafile.write_text(_OTHER_CERTIFICATE)
    with pytest.raises(KafkaAccessError, match="refused User:eventlake-client: TLS handshake failed .*certificate "
                                               "verify failed"):
        check_access(untrusted, timeout_s=10)
    _through_the_handler_to_the_reader(secured_tls, spark)


def _through_the_handler_to_the_reader(secured: Settings, spark) -> None:
    client, reader, handler = (secured.for_role(r) for r in ("client", "reader", "handler"))
    for settings in (client, reader, handler):
        check_access(settings)  # every role is served
    with EventStore(client) as store:  # the client creates no topic: they exist (made by the admin)
        sent = store.submit_many([_open_account("acc-sec-1"), _open_account("acc-sec-2")])
        with CommandHandler(handler, log=lambda *_: None) as running:
            stats = running.run(until_caught_up=True, max_seconds=120)
        results = store.wait_for(sent, timeout_s=30)
    assert stats.accepted == 2 and all(r.accepted for r in results.values())

    events = _events(reader)
    assert sorted((e.aggregate_id, e.event_type, e.aggregate_version) for e in events) == \
        [("acc-sec-1", "AccountOpened", 1), ("acc-sec-2", "AccountOpened", 1)]

    # The lag exporter runs as the reader: it may ask the handler's group's committed offsets and the log's ends.
    from eventlake.lag_exporter import LagExporter
    from projection_core.positions import lag

    snapshot = LagExporter(reader, log=lambda *_: None).run(once=True)
    groups = {p.consumer: p for p in snapshot.positions if p.kind == "group"}
    assert snapshot.failures == 0 and handler.handler_group_id in groups, snapshot
    assert lag(groups[handler.handler_group_id].committed, snapshot.ends[reader.commands_topic]) == 0, snapshot

    # Spark's Kafka source, as the projection reads the log (spark_apps.events), with the reader's credentials.
    from spark_apps.events import read_event_records

    name = f"secured_events_{uuid.uuid4().hex[:8]}"
    query = (read_event_records(spark, reader).selectExpr("CAST(value AS STRING) AS value")
             .writeStream.format("memory").queryName(name).trigger(availableNow=True)
             .option("checkpointLocation", str(secured.home / "checkpoint")).start())
    query.awaitTermination(120)
    ids = sorted(EventEnvelope.from_json(row.value.encode()).event_id for row in spark.table(name).collect())
    assert ids == sorted(e.event_id for e in events)


# A self-signed certificate (public part only) of no broker here, made once with keytool: trusting it alone,
# a client refuses the brokers' certificate.
_OTHER_CERTIFICATE = """-----BEGIN CERTIFICATE-----
MIIBUjCB+aADAgECAgkAj1PHUFfP6y4wCgYIKoZIzj0EAwIwFDESMBAGA1UEAxMJ
bG9jYWxob3N0MCAXDTI2MTEyNTEyMDI1NFoYDzIxMjYxMTAxMTIwMjU0WjAUMRIw
EAYDVQQDEwlsb2NhbGhvc3QwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAATq9ZUW
ytBxqGIAjxDhdp3j7xFgYjgJqRBnrwRRlCzHMoSrqLKJeH3Lo05MPn0zLzKY0XRk
e/ifGjdyWc3CwpMXozIwMDAdBgNVHQ4EFgQUMoB8xl7fa88+I/Ax+QKCV2bHqnkw
DwYDVR0RBAgwBocEfwAAATAKBggqhkjOPQQDAgNIADBFAiAa4mcIC8yRslIsnMp7
sBuYOAE93WwyECwG4RKxgTgoCAIhAMRRSLplmJSdcxs6of3kN9G3rswh8DPiKTZ+
q33IMcZ8
-----END CERTIFICATE-----
"""
