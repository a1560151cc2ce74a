"""`eventlake submit` as a user runs it, on a file holding a command whose id has a lone surrogate (valid JSON,
no UTF-8): that command is refused with the field and the reason, the others are sent; no traceback."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EVENTLAKE = str(Path(sys.executable).parent / "eventlake")


def test_submit_refuses_an_unencodable_id_and_sends_the_rest(settings, tmp_path):
    good = {"command_type": "OpenAccount", "aggregate_id": "acc-good",
            "payload": {"customer_id": "c", "credit_limit_minor": 1000, "currency": "USD"}}
    bad = {**good, "aggregate_id": "acc-SURROGATE"}
    text = "\n".join(json.dumps(c) for c in (bad, good)).replace("SURROGATE", "\\ud800") + "\n"
    commands = tmp_path / "commands.jsonl"
    commands.write_text(text, encoding="utf-8")
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "EVENTLAKE_HOME": str(settings.home),
           "EVENTLAKE_TOPIC_PREFIX": settings.topic_prefix}
    run = subprocess.run([EVENTLAKE, "submit", str(commands), "--no-wait"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr and "UnicodeEncodeError" not in run.stderr, run.stderr
    assert f"not sent: command #1 in {commands}: command: field 'aggregate_id'" in run.stderr, run.stderr
    assert "lone surrogate U+D800" in run.stderr, run.stderr
    assert f"submit: sent 1 command(s) to {settings.commands_topic}" in run.stderr, run.stderr
