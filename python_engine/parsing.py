"""The Python engine's parsing: a batch's records into event rows, a large batch's on two cores (a second parser
process, ``python_engine.parse_worker``)."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from spark_apps.event_rows import Records, parse_records

__all__ = ["ParseWorker", "PARALLEL_PARSE_MIN", "IDLE_BATCHES"]

# Records in a batch from which it is parsed by two processes (``ParseWorker``): catch-up batches, not live ones.
PARALLEL_PARSE_MIN = 20_000
IDLE_BATCHES = 100  # small batches in a row after which the second parser is stopped (started again when needed)


class ParseWorker:
    """A second process parsing (``python_engine.parse_worker``): ``parse`` gives it the first half of a large batch's
    records (``PARALLEL_PARSE_MIN`` or more) while this process parses the rest, with the same parser
    (``spark_apps.event_rows``), so both cores parse and the rows and verdicts are those of ``parse_records`` on the
    whole batch. It is started when the engine starts that far behind (``prepare``), else on the first large batch,
    and used once it is up; live batches (a few thousand records) never start it, and ``IDLE_BATCHES`` of them in a
    row stop it (its memory back). If it fails or ends, this process parses its part itself, and every batch after
    that (said once in the log)."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.process = None
        self.small = 0  # small batches in a row since the last large one
        self.ready = False
        self.failed = False
        self.batches = 0

    def _start(self) -> None:
        import os
        import subprocess
        import sys

        root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        self.process = subprocess.Popen([sys.executable, "-m", "python_engine.parse_worker"], cwd=root, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)

    def prepare(self) -> None:
        """Start the worker now (it is ready a second or so later), when large batches are coming."""
        if self.process is None and not self.failed:
            self._start()

    def _up(self) -> bool:
        """Whether the worker is ready for a request (started now when it never was)."""
        import select

        if self.failed:
            return False
        if self.process is None:
            self._start()
            return False
        if not self.ready and select.select([self.process.stdout], [], [], 0)[0]:
            from python_engine.parse_worker import READY

            if self.process.stdout.read(1) != READY:
                self._fail(f"it did not start (exit code {self.process.wait()})")
                return False
            self.ready = True
        return self.ready

    def _fail(self, why: str) -> None:
        self.failed = True
        self.log(f"projection: the second parser process stopped being used: {why}; this process parses every "
                 f"batch alone from now on")
        self.close()

    def parse(self, records: Records, topic: str):
        """``parse_records(records, topic)``, the first part parsed by the worker when the batch is large and it is
        up."""
        import pickle

        import pyarrow as pa

        from python_engine import parse_worker

        rows = records.rows
        if len(rows) < PARALLEL_PARSE_MIN:
            self.small += 1
            if self.small == IDLE_BATCHES and self.process is not None:  # caught up, live: its memory back
                self.close()
            return parse_records(records, topic)
        self.small = 0
        if not self._up():
            return parse_records(records, topic)
        cut = len(rows) // 2
        request = pickle.dumps((topic, rows[:cut]), protocol=pickle.HIGHEST_PROTOCOL)
        sent: list[BaseException] = []

        def send() -> None:  # writing to the pipe lets go of the GIL: this process parses its part meanwhile
            try:
                parse_worker.write_message(self.process.stdin, request)
            except OSError as e:
                sent.append(e)

        sending = threading.Thread(target=send, name="projection-parse-request", daemon=True)
        sending.start()
        mine, my_bad = parse_records(Records(rows=rows[cut:]), topic)
        sending.join()
        try:
            if sent:
                raise sent[0]
            head = parse_worker.read_message(self.process.stdout)
            answer = pickle.loads(head) if head is not None else ("error", "it ended")
            if answer[0] == "ok":
                body = parse_worker.read_message(self.process.stdout)
                if body is None:
                    answer = ("error", "it ended")
        except OSError as e:
            answer = ("error", f"{type(e).__name__}: {e}")
        if answer[0] != "ok":
            exit_code = self.process.poll()
            self._fail(f"{answer[1]}{'' if exit_code is None else f' (exit code {exit_code})'}")
            theirs, their_bad = parse_records(Records(rows=rows[:cut]), topic)
        else:
            theirs, their_bad = pa.ipc.open_stream(body).read_all(), answer[1]
            self.batches += 1
        return pa.concat_tables([theirs, mine]), their_bad + my_bad

    def close(self) -> None:
        """Stop the worker (its input ends; killed if it does not end within 5 s)."""
        import subprocess

        process, self.process, self.ready = self.process, None, False
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
