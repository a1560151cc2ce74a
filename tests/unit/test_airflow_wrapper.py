"""`eventlake airflow ...` as a user stops it (issue 46, part 6): SIGTERM or Ctrl-C to the wrapper stops every
process the Airflow command started (`airflow standalone`'s components die with it, not after it), killing what
does not stop in time; and Airflow is sized to the machine unless the environment says otherwise. The command here
is a stand-in with the same shape (a parent that dies on SIGTERM, leaving the children it started, one of which
ignores SIGTERM): real processes, no Airflow needed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from infra import airflow

REPO = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie, ended and not reaped yet, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def wait_for(condition, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


@pytest.mark.slow  # processes started and stopped: seconds, not for `make test-fast`
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
def test_stopping_the_wrapper_stops_every_process_the_command_started(tmp_path, how):
    pids = tmp_path / "pids.json"
    command = tmp_path / "standalone.py"
    command.write_text(textwrap.dedent(f"""
        import json, subprocess, sys, time
        children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]),
                    subprocess.Popen([sys.executable, "-c",
                                      "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                      "signal.signal(signal.SIGINT, signal.SIG_IGN); print('ready', flush=True); "
                                      "time.sleep(600)"], stdout=subprocess.PIPE, text=True)]
        assert children[1].stdout.readline().strip() == "ready"  # it ignores SIGTERM and SIGINT from now on
        open({str(pids)!r}, "w").write(json.dumps([c.pid for c in children]))
        time.sleep(600)  # SIGTERM or SIGINT ends this process and leaves its children running
    """))
    wrapper = subprocess.Popen(
        [sys.executable, "-c", "import sys; from infra.airflow import supervise; "
                               f"sys.exit(supervise([sys.executable, {str(command)!r}], {{}}, stop_within_s=1))"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: pids.exists() and pids.read_text(), 30), wrapper.stdout
        children = json.loads(pids.read_text())
        assert all(alive(pid) for pid in children)
        wrapper.send_signal(how)
        out, _ = wrapper.communicate(timeout=20)
        assert wait_for(lambda: not any(alive(pid) for pid in children), 10), (children, out)
        assert f"airflow: stopped ({how.name}); waiting for its processes to end" in out
        assert "still running 1 s after they were asked to stop: killed" in out  # the one ignoring SIGTERM
    finally:
        wrapper.kill()
        for pid in json.loads(pids.read_text()) if pids.exists() and pids.read_text() else []:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_command_that_ends_by_itself_gives_its_exit_code_and_leaves_nothing(tmp_path):
    assert airflow.supervise([sys.executable, "-c", "import sys; sys.exit(3)"], dict(os.environ)) == 3


def test_airflow_is_sized_to_the_machine_unless_the_environment_says_otherwise(settings):
    assert airflow.machine_sized(cpus=2) == {"AIRFLOW__CORE__PARALLELISM": "2",
                                             "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "2"}
    assert airflow.machine_sized(cpus=1)["AIRFLOW__CORE__PARALLELISM"] == "2"
    assert airflow.machine_sized(cpus=16)["AIRFLOW__CORE__PARALLELISM"] == "16"
    env = airflow.environment(settings, base={})
    assert env["AIRFLOW__CORE__PARALLELISM"] == str(max(2, os.cpu_count() or 2))  # not Airflow's 32
    given = airflow.environment(settings, base={"AIRFLOW__CORE__PARALLELISM": "8"})
    assert given["AIRFLOW__CORE__PARALLELISM"] == "8"
