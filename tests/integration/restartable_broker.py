"""A broker that a test module may stop and restart (issue 14: every service survives a broker restart).

The suite's shared broker is never disturbed: a module that restarts a broker imports ``own_broker`` (a
fixture: pytest finds it by its name in the importing module) and gets one of its own, started the same way
(infra/kafka.py) on other free ports.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from lakehouse.settings import Settings
from tests.conftest import _free_port

__all__ = ["BROKER_AWAY_S", "STOP_WITHIN_S", "own_broker", "broker_down", "broker_up", "settings_on",
           "needs_local_broker"]

# Longer than the handler's consumer session (10 s) and its transactions' timeout (20 s): consumer groups forget
# their members and the records produced meanwhile expire, as in the 40 s outage.
BROKER_AWAY_S = 25
# How long a service may take to stop while it waits for an absent broker ("within seconds"): a liveness bound,
# not a speed claim.
STOP_WITHIN_S = 15

needs_local_broker = pytest.mark.skipif(
    bool(os.environ.get("KAFKA_BOOTSTRAP_SERVERS")),
    reason="stops and restarts a broker: needs the local one, not an external cluster")


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory):
    """A broker for the importing module alone, which its tests stop and start (infra/kafka.py, like the
    conftest's)."""
    from infra import kafka

    broker = Settings.load({}).replace(home=tmp_path_factory.mktemp("restartable-kafka"), kafka_port=_free_port(),
                                       kafka_controller_port=_free_port())
    kafka.up(broker, log=lambda *_: None)
    try:
        yield broker
    finally:
        kafka.down(broker, log=lambda *_: None)


def settings_on(broker: Settings, home: Path) -> Settings:
    """Settings for one test on ``broker``: its own topics, groups, warehouse and checkpoints."""
    return Settings.load({}).replace(
        home=home, kafka_bootstrap_servers=broker.bootstrap_servers,
        topic_prefix=f"test-{uuid.uuid4().hex[:10]}.", topic_partitions=3,
        handler_group_id=f"handler-{uuid.uuid4().hex[:8]}", policy_group_id=f"policy-{uuid.uuid4().hex[:8]}")


def broker_down(broker: Settings) -> None:
    from infra import kafka
    kafka.down(broker, log=lambda *_: None)


def broker_up(broker: Settings) -> None:
    from infra import kafka
    kafka.up(broker, log=lambda *_: None)
