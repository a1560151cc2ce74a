"""Files written whole or not at all (``write_whole``): a reader never sees half a file, a process killed while
writing leaves the previous content (or none) and at most a stray partial file beside it."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_whole"]


def write_whole(path: Path, data: str | bytes, mode: int = 0o644, durable: bool = False) -> None:
    """Replace the local file ``path`` (not a storage URI's path object: those write through their own API, e.g.
    the fraud detector's state files under ``settings.checkpoints``) with ``data`` (text is written as UTF-8)
    atomically: a partial file of this process beside
    it, renamed over it (readers see the old or the new inode, never half). ``mode`` is the new file's permission
    bits (0o600 for secrets: never readable by others, not even for a moment); ``durable`` syncs the data before
    the rename and the directory after it, for files whose loss after a power cut would lose more than a redo
    (e.g. the subject keys: a forgotten key must stay forgotten)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    partial.unlink(missing_ok=True)  # left by a killed process of the same pid: its mode may differ
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(raw)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if durable:  # the rename itself survives a power cut
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
