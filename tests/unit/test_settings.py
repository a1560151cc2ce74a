from pathlib import Path

import pytest

from lakehouse.settings import Settings, SettingsError


def test_environment_overrides_file_and_defaults(tmp_path):
    config = tmp_path / "eventlake.toml"
    config.write_text('topic_prefix = "prod."\ntopic_partitions = 12\n')
    s = Settings.load({"EVENTLAKE_CONFIG": str(config), "EVENTLAKE_TOPIC_PARTITIONS": "6",
                       "KAFKA_BOOTSTRAP_SERVERS": "kafka-1:9092", "EVENTLAKE_HOME": str(tmp_path)})
    assert (s.topic_prefix, s.topic_partitions, s.bootstrap_servers) == ("prod.", 6, "kafka-1:9092")
    assert s.events_topic == "prod.events"
    assert not s.uses_local_kafka
    assert s.warehouse == Path(tmp_path).resolve() / "warehouse"


def test_defaults_use_the_local_broker():
    s = Settings.load({})
    assert s.uses_local_kafka and s.bootstrap_servers == "127.0.0.1:19092"


@pytest.mark.parametrize("env, message", [
    ({"EVENTLAKE_TOPIC_PARTITIONS": "many"}, "topic_partitions='many': expected int"),
    ({"EVENTLAKE_CONFIG": "/nonexistent.toml"}, "no such file"),
])
def test_bad_settings_name_the_setting(env, message):
    with pytest.raises(SettingsError, match=message):
        Settings.load(env)


def test_unknown_keys_in_the_config_file_are_refused(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("topic_prefixx = 'x'\n")
    with pytest.raises(SettingsError, match="unknown setting.*topic_prefixx"):
        Settings.load({"EVENTLAKE_CONFIG": str(config)})


def test_the_local_airflow_finds_its_own_commands_and_our_dags(tmp_path):
    # `airflow standalone` starts its components as `airflow ...` from the PATH: without the venv's bin first,
    # a shell without the venv activated got "No such file or directory: 'airflow'".
    import sys

    from infra.airflow import DAGS_FOLDER, environment

    env = environment(Settings(home=tmp_path), base={"PATH": "/usr/bin"})
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert (Path(env["PATH"].split(":")[0]) / "airflow").exists()
    assert env["AIRFLOW_HOME"] == str(tmp_path / "airflow") and env["EVENTLAKE_HOME"] == str(tmp_path)
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(DAGS_FOLDER) and (DAGS_FOLDER / "check_read_models.py").exists()
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"


def test_a_local_cluster_of_three_brokers_is_named_whole_and_replicates_each_topic_three_times(tmp_path):
    s = Settings.load({"EVENTLAKE_HOME": str(tmp_path), "EVENTLAKE_KAFKA_BROKERS": "3",
                       "EVENTLAKE_KAFKA_PORT": "30000", "EVENTLAKE_KAFKA_CONTROLLER_PORT": "30001"})
    assert s.bootstrap_servers == "127.0.0.1:30000,127.0.0.1:30002,127.0.0.1:30004"
    assert s.local_controller_ports == [30001, 30003, 30005]
    assert (s.replication_factor, s.min_insync_replicas) == (3, 2)
    assert (Settings.load({"EVENTLAKE_HOME": str(tmp_path)}).replication_factor,
            Settings.load({"EVENTLAKE_HOME": str(tmp_path)}).min_insync_replicas) == (1, 1)


def test_a_remote_cluster_keeps_its_own_replication_unless_told(tmp_path):
    remote = {"EVENTLAKE_HOME": str(tmp_path), "KAFKA_BOOTSTRAP_SERVERS": "kafka-1:9092"}
    assert (Settings.load(remote).replication_factor, Settings.load(remote).min_insync_replicas) == (None, None)
    told = Settings.load({**remote, "EVENTLAKE_TOPIC_REPLICATION_FACTOR": "3"})
    assert (told.replication_factor, told.min_insync_replicas) == (3, 2)


def test_every_command_finds_the_cluster_size_kafka_up_recorded(tmp_path):
    (tmp_path / "kafka").mkdir()
    (tmp_path / "kafka" / "brokers").write_text("3\n")
    assert Settings.load({"EVENTLAKE_HOME": str(tmp_path)}).kafka_brokers == 3
    assert Settings.load({"EVENTLAKE_HOME": str(tmp_path), "EVENTLAKE_KAFKA_BROKERS": "1"}).kafka_brokers == 1
