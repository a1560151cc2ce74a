"""`eventlake submit`, `generate` and `policy` as a user runs them, against a running `eventlake handler`."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EVENTLAKE = str(Path(sys.executable).parent / "eventlake")


@pytest.fixture
def env(settings):
    return {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "EVENTLAKE_HOME": str(settings.home),
            "EVENTLAKE_TOPIC_PREFIX": settings.topic_prefix, "EVENTLAKE_HANDLER_GROUP_ID": settings.handler_group_id}


def submit(env, text, *args):
    return subprocess.run([EVENTLAKE, "submit", "-", *args], input=text, env=env, capture_output=True, text=True,
                          timeout=120)


def test_submit_prints_each_result_and_a_resent_command_its_first_result(env, tmp_path):
    open_account = {"command_id": "cmd-open-1", "command_type": "OpenAccount", "aggregate_id": "acc-cli",
                    "payload": {"customer_id": "c", "credit_limit_minor": 1000, "currency": "USD"}}
    pay = {"command_type": "AuthorizePayment", "aggregate_id": "acc-cli", "expected_version": 1,
           "payload": {"payment_id": "p1", "amount_minor": 10, "currency": "USD", "merchant_id": "m",
                       "location": "US-NYC", "occurred_at": "2026-01-01T00:00:00Z"}}
    bad = {"command_type": "AuthorizePayment", "aggregate_id": "acc-cli", "payload": {**pay["payload"],
                                                                                     "amount_minor": -5}}
    with open(tmp_path / "handler.log", "w") as log:
        handler = subprocess.Popen([EVENTLAKE, "handler"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            first = submit(env, "\n".join(json.dumps(c) for c in (open_account, pay, bad)) + "\n")
            again = submit(env, json.dumps([open_account]), "--json")
            policy = subprocess.run([EVENTLAKE, "policy", "--until-caught-up"], env=env, capture_output=True,
                                    text=True, timeout=120)
        finally:
            handler.terminate()
            handler.wait(60)
    assert first.returncode == 1, first.stderr  # one command was not sent
    assert "not sent: command #3 in stdin" in first.stderr and "'amount_minor' must be > 0" in first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].startswith("accepted cmd-open-1 OpenAccount acc-cli: version 1, 1 event(s)")
    assert lines[1].startswith("accepted ") and "AuthorizePayment acc-cli: version 2" in lines[1]
    assert again.returncode == 0, again.stderr
    result = json.loads(again.stdout)
    assert (result["command_id"], result["status"], result["version"], result["duplicate"]) == \
        ("cmd-open-1", "accepted", 1, True)
    assert policy.returncode == 0, policy.stderr
    assert "0 FreezeAccount commands sent" in policy.stdout


def test_generate_and_submit_reach_every_domain_through_one_handler(env, tmp_path):
    """`eventlake generate --domain iot|site --wait` and `eventlake submit` of a device command (routed by its
    command type) against one running handler; an id another aggregate type holds is refused naming both."""
    register = {"command_id": "cmd-reg-1", "command_type": "RegisterDevice", "aggregate_id": "dev-cli",
                "payload": {"site_id": "site-1", "sensor_kind": "temperature", "unit": "C", "range_min_milli": 0,
                            "range_max_milli": 50_000, "heartbeat_interval_s": 60}}
    taken = {"command_id": "cmd-open-2", "command_type": "OpenAccount", "aggregate_id": "dev-cli",
             "payload": {"customer_id": "c", "credit_limit_minor": 1000, "currency": "USD"}}
    with open(tmp_path / "handler.log", "w") as log:
        handler = subprocess.Popen([EVENTLAKE, "handler"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            iot = subprocess.run([EVENTLAKE, "generate", "--domain", "iot", "--devices", "8", "--minutes", "10",
                                  "--run-id", "cli", "--wait"], env=env, capture_output=True, text=True, timeout=300)
            site = subprocess.run([EVENTLAKE, "generate", "--domain", "site", "--sites", "2", "--views", "50",
                                   "--minutes", "5", "--run-id", "cli", "--wait"], env=env, capture_output=True,
                                  text=True, timeout=300)
            submitted = submit(env, "\n".join(json.dumps(c) for c in (register, taken)) + "\n")
        finally:
            handler.terminate()
            handler.wait(60)
    assert iot.returncode == 0, iot.stdout + iot.stderr
    assert "for 8 devices to" in iot.stdout
    # IotGeneratorConfig's deliberate rejections: 3 unknown devices, 3 wrong units, 2 readings after a
    # decommission, 1 second registration.
    assert ", 9 rejected" in iot.stdout, iot.stdout
    assert site.returncode == 0, site.stdout + site.stderr
    assert "for 2 sites to" in site.stdout and ", 3 rejected" in site.stdout, site.stdout  # 2 unknown, 1 retired
    lines = submitted.stdout.splitlines()
    assert lines[0].startswith("accepted cmd-reg-1 RegisterDevice dev-cli: version 1"), submitted.stdout
    assert lines[1].startswith("rejected cmd-open-2 OpenAccount dev-cli"), submitted.stdout
    assert "AggregateIdTaken" in lines[1] and "taken by an aggregate of type 'device'" in lines[1], lines[1]
