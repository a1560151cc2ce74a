"""Who may do what on the log, enforced by the broker: the ACLs of each role, the access check a process runs
before it starts, and a refusal turned into one line.

With ``kafka_security = "sasl_scram"`` every client logs in as its role's user (``lakehouse.kafka_security``)
and the cluster's authorizer allows only what ``grant_acls`` granted:

| role | may |
|---|---|
| handler | read commands (its group, ``handler_group_id``); write (and read back) events, command-results, dead-letters, handler-snapshots, subject-keys (the keys it makes); its transactional ids (prefix ``handler_group_id``) |
| client | write commands; read command-results, events and subject-keys (the fraud policy's group, Spark's ``spark-kafka-source-*`` groups): the CLI, the policy, the detectors |
| reader | read events, dead-letters and subject-keys (Spark's groups); describe the services' groups (their committed offsets): the projection, status, rebuild, reprocess and the lag exporter |
| admin | everything (the super user): creates topics and grants these ACLs |

Every role may describe every topic of the prefix (``ensure_topics`` lists them). So the events topic has one
writer, the command handler, and the broker refuses anyone else's record (``TOPIC_AUTHORIZATION_FAILED``).
"""
from __future__ import annotations

import logging
import time

import confluent_kafka
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, ResourcePatternType,
                                   ResourceType)

from event_store.kafka_clients import access_probe, admin_client
from lakehouse.kafka_security import ROLE_USERS, KafkaAccessError, describe_refusal
from lakehouse.settings import Settings

__all__ = ["acl_bindings", "grant_acls", "check_access", "explain_refusal", "SPARK_GROUP_PREFIX"]

# Spark's Kafka source names its consumer groups spark-kafka-source-<uuid>-...: a prefixed ACL covers them all.
SPARK_GROUP_PREFIX = "spark-kafka-source-"

_READ, _WRITE, _DESCRIBE = AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE


def _rules(settings: Settings) -> dict[str, list[tuple[ResourceType, str, ResourcePatternType, AclOperation]]]:
    """role -> (resource type, name, pattern, operation) it is allowed."""
    s = settings
    topic, group, txn = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
    literal, prefixed = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    describe_all = [(topic, s.topic_prefix, prefixed, _DESCRIBE)]
    handler_writes = [s.events_topic, s.results_topic, s.dead_letters_topic, s.snapshots_topic, s.keys_topic]
    return {
        "handler": [*describe_all,
                    (topic, s.commands_topic, literal, _READ),
                    *[(topic, name, literal, op) for name in handler_writes
                      for op in (_WRITE, _READ, AclOperation.DESCRIBE_CONFIGS)],
                    (topic, s.commands_topic, literal, AclOperation.DESCRIBE_CONFIGS),
                    (group, s.handler_group_id, literal, _READ),
                    (txn, s.handler_group_id, prefixed, _WRITE), (txn, s.handler_group_id, prefixed, _DESCRIBE)],
        "client": [*describe_all,
                   (topic, s.commands_topic, literal, _WRITE),
                   (topic, s.results_topic, literal, _READ), (topic, s.events_topic, literal, _READ),
                   (topic, s.keys_topic, literal, _READ),
                   (group, s.policy_group_id, literal, _READ), (group, s.fraud_detector_group, literal, _READ),
                   (group, SPARK_GROUP_PREFIX, prefixed, _READ)],
        "reader": [*describe_all,
                   (topic, s.events_topic, literal, _READ), (topic, s.dead_letters_topic, literal, _READ),
                   (topic, s.keys_topic, literal, _READ),
                   (group, SPARK_GROUP_PREFIX, prefixed, _READ), (group, s.dead_letters_watch_group, literal, _READ),
                   *[(group, name, literal, _DESCRIBE)
                     for name in (s.handler_group_id, s.policy_group_id, s.fraud_detector_group)]],
    }


def acl_bindings(settings: Settings) -> list[AclBinding]:
    """Every ACL the roles need on ``settings``' topics and groups (allow rules; the rest is denied)."""
    return [AclBinding(restype, name, pattern, f"User:{ROLE_USERS[role]}", "*", operation, AclPermissionType.ALLOW)
            for role, rules in _rules(settings).items() for restype, name, pattern, operation in rules]


def grant_acls(settings: Settings, log=print, timeout_s: float = 30.0) -> int:
    """Create the roles' ACLs (as the admin: ``settings`` must be the admin's); idempotent. Returns how many."""
    bindings = acl_bindings(settings)
    admin = admin_client(settings)  # kept until the futures are done: a destroyed client fails them
    futures = admin.create_acls(bindings, request_timeout=timeout_s)
    try:
        for future in futures.values():
            future.result(timeout=timeout_s)
    except confluent_kafka.KafkaException as e:
        raise KafkaAccessError(explain_refusal(settings, e) or describe_refusal(settings, str(e))) from None
    _wait_until_applied(admin, bindings, timeout_s)
    log(f"kafka: {len(bindings)} ACLs for topics {settings.topic_prefix}*: only User:{ROLE_USERS['handler']} writes "
        f"{settings.events_topic}")
    return len(bindings)


def _wait_until_applied(admin, bindings: list[AclBinding], timeout_s: float) -> None:
    """Until a broker's authorizer holds every binding: the controller commits them first, and a client served
    by a broker that has not applied them yet would be refused what was just granted."""
    from confluent_kafka.admin import AclBindingFilter

    wanted = set(bindings)
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                                  AclPermissionType.ANY)
    deadline = time.monotonic() + timeout_s
    while not wanted <= set(admin.describe_acls(everything, request_timeout=timeout_s).result(timeout_s)):
        if time.monotonic() >= deadline:
            raise KafkaAccessError(f"the {len(wanted)} ACLs granted were not all in force within {timeout_s:.0f}s")
        time.sleep(0.1)


def check_access(settings: Settings, timeout_s: float = 10.0, require_answer: bool = True) -> None:
    """Ask the cluster for its metadata as ``settings``' principal; raise ``KafkaAccessError`` naming the
    servers, the principal and the reason when it refuses (wrong or missing credentials), or when it does not
    answer within ``timeout_s`` and ``require_answer`` (a service that waits for an absent broker by itself
    passes False)."""
    errors: list[confluent_kafka.KafkaError] = []
    logged = _Lines()
    client = access_probe(settings, errors.append, logged.logger)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.list_topics(timeout=0.5)
            return
        except confluent_kafka.KafkaException:
            pass
        client.poll(0.1)  # serves error_cb and the log
        for error in errors:
            if error.code() in (confluent_kafka.KafkaError._AUTHENTICATION,
                                confluent_kafka.KafkaError.SASL_AUTHENTICATION_FAILED):
                raise KafkaAccessError(describe_refusal(settings, f"SASL authentication failed ({_reason(error)})"))
        reason = _diagnose(settings, logged.lines)
        if reason is not None:
            raise KafkaAccessError(describe_refusal(settings, reason))
        if time.monotonic() >= deadline:
            break
    if not require_answer:
        return
    last = (logged.lines or [e.str() for e in errors] or ["no answer"])[-1]
    raise KafkaAccessError(describe_refusal(settings, f"no answer within {timeout_s:.0f}s ({_reason_text(last)})"))


def _diagnose(settings: Settings, lines: list[str]) -> str | None:
    """Why the brokers keep closing this client's connections, from librdkafka's log, when it is clear."""
    for line in lines:
        if "SSL handshake failed" in line:
            return f"TLS handshake failed ({_reason_text(line)}); EVENTLAKE_KAFKA_SSL_CAFILE={settings.ssl_cafile}"

    def closed(state: str) -> int:
        return sum("Disconnected" in line and f"state {state}" in line for line in lines)

    # A SASL listener answers a client without SASL its ApiVersions, then closes the connection at its first
    # real request: the connection was up, and closed by the broker, every time.
    if closed("UP") >= 2 and settings.kafka_security == "none":
        return ("the brokers closed the connection of a client without credentials: the cluster requires SASL "
                "authentication; set EVENTLAKE_KAFKA_SECURITY=sasl_scram (or sasl_scram_tls) with "
                "EVENTLAKE_KAFKA_USERNAME and EVENTLAKE_KAFKA_PASSWORD (or kafka_username / kafka_password in "
                "EVENTLAKE_CONFIG)")
    # A TLS listener closes a client that speaks no TLS at its first bytes.
    if closed("APIVERSION_QUERY") >= 2 and settings.kafka_security != "sasl_scram_tls":
        return ("the brokers closed the connection at its first request, as a TLS listener does with a client "
                "that speaks no TLS: set EVENTLAKE_KAFKA_SECURITY=sasl_scram_tls with EVENTLAKE_KAFKA_SSL_CAFILE, "
                "EVENTLAKE_KAFKA_USERNAME and EVENTLAKE_KAFKA_PASSWORD")
    return None


class _Lines(logging.Handler):
    """librdkafka's log lines, kept for the access check's diagnosis instead of printed."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []
        self.logger = logging.Logger(f"eventlake.kafka_access.{id(self)}")  # not in the logging tree: no output
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _reason(error: confluent_kafka.KafkaError) -> str:
    return _reason_text(error.str())


def _reason_text(text: str) -> str:
    """librdkafka's text without the thread and broker address it starts with (the message names the servers)."""
    marker = "/bootstrap: "
    return text.split(marker, 1)[1] if marker in text else text


_AUTHORIZATION = {
    "TOPIC_AUTHORIZATION_FAILED": "not allowed on the topic (TopicAuthorizationFailed)",
    "GROUP_AUTHORIZATION_FAILED": "not allowed in the consumer group (GroupAuthorizationFailed)",
    "CLUSTER_AUTHORIZATION_FAILED": "not allowed on the cluster (ClusterAuthorizationFailed)",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": "not allowed to use the transactional id "
                                             "(TransactionalIdAuthorizationFailed)",
    "_AUTHENTICATION": "SASL authentication failed",
    "SASL_AUTHENTICATION_FAILED": "SASL authentication failed",
}
_KAFKA_PYTHON = {
    "TopicAuthorizationFailedError": "TOPIC_AUTHORIZATION_FAILED",
    "GroupAuthorizationFailedError": "GROUP_AUTHORIZATION_FAILED",
    "ClusterAuthorizationFailedError": "CLUSTER_AUTHORIZATION_FAILED",
    "TransactionalIdAuthorizationFailedError": "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "SaslAuthenticationFailedError": "SASL_AUTHENTICATION_FAILED",
}


def explain_refusal(settings: Settings, error: BaseException | confluent_kafka.KafkaError,
                    what: str = "") -> str | None:
    """One line for an authentication or authorization failure of either client library (a
    ``KafkaException``, a librdkafka ``KafkaError``, a kafka-python ``AuthorizationError``), naming the servers,
    the principal, ``what`` was attempted and the reason; None for any other error."""
    import kafka.errors

    name = detail = None
    if isinstance(error, confluent_kafka.KafkaException) and error.args and \
            isinstance(error.args[0], confluent_kafka.KafkaError):
        error = error.args[0]
    if isinstance(error, confluent_kafka.KafkaError):
        name, detail = error.name(), error.str()
    elif isinstance(error, (kafka.errors.AuthorizationError, kafka.errors.SaslAuthenticationFailedError)):
        name, detail = _KAFKA_PYTHON.get(type(error).__name__), str(error)
    if name not in _AUTHORIZATION:
        return None
    reason = _AUTHORIZATION[name] + (f" to {what}" if what else "")
    return describe_refusal(settings, f"{reason}: {detail}" if detail and detail != name else reason)
