"""Kafka security settings and the one translation of them per client library (no broker: see
tests/integration/test_kafka_security.py for what a secured broker does with them)."""
import re
import stat
from pathlib import Path

import pytest

from event_store import kafka_clients
from lakehouse.kafka_security import (ROLES, KafkaAccessError, confluent_config, kafka_python_config,
                                      role_credentials, security_env, spark_kafka_options, write_credentials)
from lakehouse.settings import PROJECT_ROOT, Settings, SettingsError


def test_credentials_come_from_the_environment_and_the_password_is_never_shown(tmp_path):
    s = Settings.load({"EVENTLAKE_HOME": str(tmp_path), "EVENTLAKE_KAFKA_SECURITY": "sasl_scram",
                       "EVENTLAKE_KAFKA_USERNAME": "alice", "EVENTLAKE_KAFKA_PASSWORD": "s3cret-pw",
                       "EVENTLAKE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256"})
    assert (s.kafka_security, s.kafka_username, s.kafka_password, s.kafka_sasl_mechanism) == \
        ("sasl_scram", "alice", "s3cret-pw", "SCRAM-SHA-256")
    assert "s3cret-pw" not in repr(s) and "s3cret-pw" not in str(s)


def test_credentials_come_from_the_config_file(tmp_path):
    config = tmp_path / "eventlake.toml"
    config.write_text('kafka_security = "sasl_scram"\nkafka_username = "bob"\nkafka_password = "pw"\n')
    s = Settings.load({"EVENTLAKE_CONFIG": str(config), "EVENTLAKE_KAFKA_USERNAME": "carol",
                       "EVENTLAKE_KAFKA_PASSWORD": "pw2"})
    assert (s.kafka_username, s.kafka_password) == ("carol", "pw2")  # the environment wins


@pytest.mark.parametrize("env, message", [
    ({"EVENTLAKE_KAFKA_SECURITY": "ssl"}, "kafka_security='ssl': expected one of none, sasl_scram, sasl_scram_tls"),
    ({"EVENTLAKE_KAFKA_SASL_MECHANISM": "PLAIN"}, "kafka_sasl_mechanism='PLAIN'"),
    ({"EVENTLAKE_KAFKA_USERNAME": "alice"}, "kafka_username is set but kafka_password is not"),
])
def test_bad_security_settings_name_the_setting(env, message):
    with pytest.raises(SettingsError, match=re.escape(message)):
        Settings.load(env)


def test_generated_credentials_are_random_private_and_kept(tmp_path):
    path = tmp_path / "kafka" / "credentials.toml"
    first = write_credentials(path)
    assert set(first) == set(ROLES)
    assert len({password for _, password in first.values()}) == len(ROLES)
    assert all(len(password) >= 24 for _, password in first.values())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert write_credentials(path) == first  # a second `kafka up` keeps the cluster's users


def test_a_role_takes_its_user_from_the_recorded_cluster_unless_the_environment_names_one(tmp_path):
    kafka_dir = tmp_path / "kafka"
    users = write_credentials(kafka_dir / "credentials.toml")
    (kafka_dir / "security").write_text("sasl_scram")  # what `eventlake kafka up --security sasl_scram` records
    s = Settings.load({"EVENTLAKE_HOME": str(tmp_path)}, role="handler")
    assert s.kafka_security == "sasl_scram"
    assert (s.kafka_username, s.kafka_password) == users["handler"]
    # The credentials belong to the cluster: another home (a benchmark's, a test's) keeps them.
    assert s.replace(home=tmp_path / "elsewhere").credentials_file == kafka_dir / "credentials.toml"
    assert role_credentials(s, "reader") == users["reader"]
    explicit = Settings.load({"EVENTLAKE_HOME": str(tmp_path), "EVENTLAKE_KAFKA_USERNAME": "ops",
                              "EVENTLAKE_KAFKA_PASSWORD": "x"}, role="handler")
    assert explicit.kafka_username == "ops"
    assert Settings.load({"EVENTLAKE_HOME": str(tmp_path), "EVENTLAKE_KAFKA_SECURITY": "none"},
                         role="handler").kafka_username is None
    # The recorded mode is the local cluster's: a remote one's clients say their own.
    assert Settings.load({"EVENTLAKE_HOME": str(tmp_path), "KAFKA_BOOTSTRAP_SERVERS": "k1:9092"}).kafka_security == \
        "none"


def test_each_client_library_gets_the_credentials():
    s = Settings(kafka_bootstrap_servers="k1:9092", kafka_security="sasl_scram", kafka_username="eventlake-handler",
                 kafka_password='p"w\\d')
    assert confluent_config(s) == {"bootstrap.servers": "k1:9092", "security.protocol": "SASL_PLAINTEXT",
                                   "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "eventlake-handler",
                                   "sasl.password": 'p"w\\d'}
    assert kafka_python_config(s) == {"bootstrap_servers": "k1:9092", "security_protocol": "SASL_PLAINTEXT",
                                      "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "eventlake-handler",
                                      "sasl_plain_password": 'p"w\\d'}
    spark = spark_kafka_options(s)
    assert spark["kafka.security.protocol"] == "SASL_PLAINTEXT" and spark["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert spark["kafka.sasl.jaas.config"] == ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                                               'username="eventlake-handler" password="p\\"w\\\\d";')
    handler = kafka_clients.transactional_producer_config(s, "h-0", batch_bytes=1, message_max_bytes=1,
                                                          transaction_timeout_ms=1)
    assert handler["sasl.username"] == "eventlake-handler" and handler["security.protocol"] == "SASL_PLAINTEXT"
    plain = Settings(kafka_bootstrap_servers="k1:9092")
    assert confluent_config(plain) == {"bootstrap.servers": "k1:9092"}
    assert spark_kafka_options(plain) == {"kafka.bootstrap.servers": "k1:9092"}
    assert security_env(plain) == {"EVENTLAKE_KAFKA_SECURITY": "none"}


def test_over_tls_each_client_library_trusts_the_clusters_certificate(tmp_path):
    cafile = tmp_path / "ca.pem"
    cafile.write_text("-----BEGIN CERTIFICATE-----\n")
    s = Settings(kafka_bootstrap_servers="k1:9093", kafka_security="sasl_scram_tls", kafka_username="u",
                 kafka_password="p", kafka_ssl_cafile=cafile)
    assert confluent_config(s)["security.protocol"] == "SASL_SSL"
    assert confluent_config(s)["ssl.ca.location"] == str(cafile)
    assert confluent_config(s)["ssl.endpoint.identification.algorithm"] == "https"
    assert kafka_python_config(s)["security_protocol"] == "SASL_SSL"
    assert (kafka_python_config(s)["ssl_cafile"], kafka_python_config(s)["ssl_check_hostname"]) == (str(cafile), True)
    spark = spark_kafka_options(s)
    assert (spark["kafka.security.protocol"], spark["kafka.ssl.truststore.type"],
            spark["kafka.ssl.truststore.location"]) == ("SASL_SSL", "PEM", str(cafile))
    assert security_env(s)["EVENTLAKE_KAFKA_SSL_CAFILE"] == str(cafile)
    with pytest.raises(KafkaAccessError, match="no certificate to trust at .*missing.pem"):
        confluent_config(s.replace(kafka_ssl_cafile=tmp_path / "missing.pem"))


def test_sasl_without_credentials_is_refused_before_any_client_is_made(tmp_path):
    s = Settings(home=tmp_path, kafka_bootstrap_servers="k1:9092", kafka_security="sasl_scram")
    for make in (confluent_config, kafka_python_config, spark_kafka_options):
        with pytest.raises(KafkaAccessError, match="Kafka at k1:9092: no credentials for kafka_security=sasl_scram"):
            make(s)


def test_no_client_is_configured_around_the_security_functions():
    """Every Kafka client of the platform takes where and as whom it connects from lakehouse.kafka_security:
    no other module names the bootstrap servers to a client itself."""
    direct = re.compile(r'"bootstrap\.servers"|bootstrap_servers=settings|"kafka\.bootstrap\.servers"|'
                        r'bootstrap_servers=s\.|\.option\("kafka\.bootstrap')
    offenders = []
    for folder in ("event_store", "spark_apps", "eventlake", "dags", "bench", "infra", "read_models", "expectations",
                   "lakehouse"):
        for path in (PROJECT_ROOT / folder).rglob("*.py"):
            if path.name == "kafka_security.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if direct.search(line):
                    offenders.append(f"{Path(path).relative_to(PROJECT_ROOT)}:{number}: {line.strip()}")
    assert offenders == []
