"""The projection's second parser: a process of its own that parses part of a large batch's records while the
Python engine parses the rest (``python_engine.parsing.ParseWorker``), so a catch-up parses on two cores.

It reads requests from its stdin and answers on its stdout (stray prints go to stderr), each a length (8 bytes,
little-endian) and its bytes: a request is a pickle of (topic, [(partition, offset, key, value)]); an answer is a
pickle of ("ok", [(partition, offset, reason)] of the records that are not valid events) followed by a message of
the event rows as an Arrow IPC stream, or a pickle of ("error", text). It parses with ``event_rows.parse_records``,
the engine's own parser, so either process gives the same verdicts and rows.
It ends when its stdin ends (the engine stopped, or was killed).

    python -m python_engine.parse_worker
"""
from __future__ import annotations

import os
import pickle
import struct
import sys

READY = b"R"
_LENGTH = struct.Struct("<Q")


def _read_exactly(stream, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_message(stream) -> bytes | None:
    """The next message on ``stream`` (a binary file), None at its end."""
    head = _read_exactly(stream, _LENGTH.size)
    if head is None:
        return None
    return _read_exactly(stream, _LENGTH.unpack(head)[0])


def write_message(stream, body) -> None:
    """``body`` (bytes or a buffer) as the next message on ``stream``."""
    view = memoryview(body).cast("B")
    for part in (memoryview(_LENGTH.pack(view.nbytes)), view):
        while part.nbytes:  # a raw stream may take part of it at a time
            part = part[stream.write(part):]
    stream.flush()


def main() -> int:
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, not into the answers
    requests = os.fdopen(os.dup(0), "rb")
    import importlib

    import pyarrow as pa

    from spark_apps.event_rows import Records, parse_records
    from python_engine.memory import large_blocks_off_the_heap

    large_blocks_off_the_heap()

    for module in ("pyarrow.compute", "event_store.envelope"):  # imported before the first batch, not during it
        importlib.import_module(module)

    answers.write(READY)
    answers.flush()
    try:
        while True:
            body = read_message(requests)
            if body is None:
                return 0
            try:
                topic, rows = pickle.loads(body)
                del body
                table, bad = parse_records(Records(rows=rows), topic)
                del rows
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, table.schema) as writer:
                    writer.write_table(table)
                rows_ipc = sink.getvalue()
                del table, sink
            except Exception as e:  # noqa: BLE001 -- the engine parses these records itself and says why
                write_message(answers, pickle.dumps(("error", f"{type(e).__name__}: {e}")))
                continue
            write_message(answers, pickle.dumps(("ok", bad)))
            write_message(answers, memoryview(rows_ipc))
            del rows_ipc
            pa.default_memory_pool().release_unused()
    except (BrokenPipeError, KeyboardInterrupt):  # the engine is gone
        return 0


if __name__ == "__main__":
    sys.exit(main())
