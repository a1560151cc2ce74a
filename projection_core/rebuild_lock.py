"""One rebuild (or maintenance) of a read model at a time: a lock file under the home folder, owned by a process
(the CLI) or by an Airflow DAG run (whose tasks are separate processes, so the lock lives on a lease between them).

No Spark here: the rebuild (``spark_apps.rebuild``), the DAG's tasks (``dags.rebuild_read_model``) and maintenance
(``spark_apps.maintenance``) all take it.
"""
from __future__ import annotations

import datetime as dt
import json
from typing import Callable

from lakehouse.files import write_whole
from lakehouse.settings import Settings
from projection_core.rebuild_errors import RebuildRefused

__all__ = ["AIRFLOW_LOCK_LEASE", "RebuildLock", "airflow_owner", "lock_path"]


def lock_path(settings: Settings, name: str):
    """The lock file of read model ``name``."""
    return settings.home / "locks" / f"rebuild-{name}.lock"


# How long a lock owned by an Airflow run stays taken between two of its tasks (and after its last heartbeat):
# the scheduler starts the next task well within it; a run killed outright frees the model after it.
AIRFLOW_LOCK_LEASE = dt.timedelta(minutes=10)
_HEARTBEAT_S = 60.0


def airflow_owner(dag_id: str, run_id: str) -> str:
    """The lock owner of one Airflow DAG run: every task of that run may take the lock again."""
    return f"airflow:{dag_id}/{run_id}"


class RebuildLock:
    """One rebuild (or maintenance) of a read model at a time: a file created exclusively under the home folder.

    It names its *owner*: a process (the CLI; ``owner`` None) or an Airflow DAG run (``airflow_owner``), whose
    tasks are separate processes. A holder is alive while its process runs on this host or, for a run, while
    its lease lasts (renewed by a heartbeat while a task runs, and set anew by ``hand_over`` when a task ends
    and the next one of the run follows). A live holder refuses everyone else with a clear message; a dead
    one's lock (kill -9, a run killed outright) is taken over. ``resume=True``: the lock must still be this
    owner's (a later task of the same run); if it was lost, RebuildRefused."""

    def __init__(self, settings: Settings, name: str, log: Callable[[str], None] = print, owner: str | None = None,
                 purpose: str = "rebuild", resume: bool = False):
        self.path = lock_path(settings, name)
        self.name = name
        self.log = log
        self.owner = owner
        self.purpose = purpose
        self.resume = resume
        self._heartbeat = None

    # -- the file ---------------------------------------------------------------------------------------------
    def _me(self, lease: bool) -> dict:
        import os
        import socket

        now = dt.datetime.now(dt.timezone.utc)
        me = {"owner": self.owner or f"pid {os.getpid()}", "purpose": self.purpose, "pid": os.getpid(),
              "host": socket.gethostname(), "started": now.strftime("%Y-%m-%dT%H:%M:%SZ")}
        if self.owner and lease:
            me["lease_until"] = (now + AIRFLOW_LOCK_LEASE).isoformat()
        return me

    def _holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def _rewrite(self, me: dict) -> None:
        """Replace the lock's content atomically (a reader sees the old or the new owner record, never half)."""
        write_whole(self.path, json.dumps(me))

    # -- taking and giving back -------------------------------------------------------------------------------
    def acquire(self) -> "RebuildLock":
        import os

        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            holder = self._holder()
            if self.owner and holder and holder.get("owner") == self.owner:
                self._rewrite({**self._me(lease=True), "started": holder.get("started", "?")})  # the same run
                return self._started()
            if self.resume:
                raise RebuildRefused(
                    f"{self.name}: this run ({self.owner}) no longer holds the rebuild lock {self.path} "
                    + (f"(now held by {_holder_text(holder)})" if holder else "(it was released or taken over)")
                    + "; its generation may have been abandoned; run the rebuild again")
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if holder is None:
                    holder = self._holder()
                if holder and _holder_alive(holder):
                    raise RebuildRefused(
                        f"{self.name}: a {holder.get('purpose', 'rebuild')} of it is already running "
                        f"({_holder_text(holder)}); wait for it to end (or stop it) and run this again") from None
                self.log(f"rebuild: {self.name}: an earlier {holder.get('purpose', 'rebuild') if holder else 'rebuild'}"
                         f" ({_holder_text(holder) if holder else 'unknown holder'}) stopped without finishing; "
                         f"taking over")
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(self._me(lease=True), f)
            return self._started()
        raise RebuildRefused(f"{self.name}: could not take the rebuild lock {self.path}; try again")

    def _started(self) -> "RebuildLock":
        if self.owner:  # a run's lease is renewed while this task works (e.g. a long fold on another host)
            import threading

            stop = threading.Event()

            def beat():
                while not stop.wait(_HEARTBEAT_S):
                    holder = self._holder()
                    if not holder or holder.get("owner") != self.owner:
                        return
                    self._rewrite({**holder, "lease_until": (dt.datetime.now(dt.timezone.utc)
                                                             + AIRFLOW_LOCK_LEASE).isoformat()})

            thread = threading.Thread(target=beat, name=f"rebuild-lock-{self.name}", daemon=True)
            thread.start()
            self._heartbeat = stop
        return self

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.set()
            self._heartbeat = None

    def hand_over(self) -> None:
        """End of a task whose run goes on: keep the lock for the run's next task (lease from now)."""
        self._stop_heartbeat()
        holder = self._holder()
        if holder and holder.get("owner") == self.owner:
            self._rewrite({**holder, "pid": None, "lease_until": (dt.datetime.now(dt.timezone.utc)
                                                                  + AIRFLOW_LOCK_LEASE).isoformat()})

    def release(self) -> None:
        """Give the lock back (only if it is still this owner's)."""
        import os

        self._stop_heartbeat()
        holder = self._holder()
        if holder is None or holder.get("owner") == (self.owner or f"pid {os.getpid()}"):
            self.path.unlink(missing_ok=True)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()




def _holder_text(holder: dict) -> str:
    owner = holder.get("owner") or ""
    if owner.startswith("airflow:"):
        lease = holder.get("lease_until")
        return (f"Airflow run {owner[len('airflow:'):]}, started {holder.get('started', '?')}"
                + (f", task pid {holder['pid']}" if holder.get("pid") else "")
                + (f", held until {lease[:19]}Z unless a task of it goes on" if lease else ""))
    return f"pid {holder.get('pid', '?')}, started {holder.get('started', '?')}"


def _holder_alive(holder: dict) -> bool:
    import socket

    if holder.get("pid") and holder.get("host") == socket.gethostname() and _alive(holder.get("pid")):
        return True
    lease = holder.get("lease_until")
    if lease:
        try:
            return dt.datetime.fromisoformat(lease) > dt.datetime.now(dt.timezone.utc)
        except ValueError:
            return False
    return False


def _alive(pid) -> bool:
    import os

    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True
