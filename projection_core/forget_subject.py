"""``eventlake forget`` and the ``forget_subject`` DAG: a data subject forgotten beside the live writers (issue 45,
docs/forgetting.md).

Its steps, each safe to repeat (a run killed anywhere is run again and completes):

1. **The key goes** (``SubjectKeys.forget``: a tombstone stays, so the key is never made again). From then on every
   reader reads the subject's sealed values as null and the handler refuses their commands.
2. **The batches in flight are waited for.** A projection's batch that unsealed the subject's values before the key
   went, and commits after step 3's UPDATE, would write them back. Both engines plan a batch (its checkpoint's
   ``offsets/N``) before they unseal it (the keys are read again after the plan), so only the batches planned and not
   yet committed (``commits/N``) when the key went can hold values: forget waits until every one of them has
   committed. One that does not within ``wait_s`` (a long batch, or a projection killed in it: its next start runs it
   again, with the key gone) is named in the report, which is then not complete: run forget again later.
3. **The log records it**: the domain's forget command (the account's ForgetSubject) goes to each of the subject's
   aggregates, and the handler answers with a SubjectForgotten event (no personal data) at its next version: the
   read models fold it (account_summary nulls the account's personal columns, so a replay of the log does too) and
   the aggregate takes no command after it. The commands are on the commands topic before forget waits (up to
   ``ANSWER_WAIT_S``) for the answers: a handler that is not running appends the events when it starts.
4. **The reports that quote the values go** (Data Docs pages and the validation results they are built from: the
   next check writes them again), then **the tables forget** (``read_models.forgetting``): each read model under
   its rebuild lock (``RebuildLock``, purpose "forget"), so a rebuild or maintenance of it is not raced: a model
   whose lock is held is left, named, and the run is not complete; then the plain values of events written with
   sealing off in the archive, then the dead letters.
5. **The handled commands go** (``event_store.command_purge``): commands arrive in clear, so every record of the
   commands topic the handler has handled is deleted (its segments rolled, then DeleteRecords), and the brokers
   remove their files at their next retention check. Skipped with ``record`` off (a home whose broker is gone).
"""
from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Callable

import read_models
from event_store.client import EventStore
from event_store.command_purge import CommandsPurge, purge_handled_commands
from event_store.domains import DOMAINS
from event_store.envelope import CommandEnvelope
from event_store.kafka_access import check_access
from event_store.sealing import sealing_on, subject_keys
from lakehouse.erasure import DEFAULT_GRACE_S, Erasure, QuotingFiles, purge_quoting
from lakehouse.faults import fault_point
from lakehouse.settings import Settings
from projection_core.checkpoint import COMMITS, METADATA, OFFSETS, SOURCES, last_committed_batch, \
    planned_not_committed
from projection_core.rebuild_errors import RebuildRefused
from projection_core.rebuild_lock import RebuildLock
from read_models.forgetting import forget_in_archive, forget_in_dead_letters, forget_in_model, holds_personal_values, \
    subject_aggregates, values_in_model

__all__ = ["ANSWER_WAIT_S", "DEFAULT_WAIT_S", "ForgetReport", "InFlight", "LogRecord", "batches_in_flight",
           "wait_for_batches", "record_on_log", "forget_subject"]

DEFAULT_WAIT_S = 120.0  # how long forget waits for the batches planned before the key went
ANSWER_WAIT_S = 15.0  # how long forget waits for the handler's answers to its forget commands
_POLL_S = 0.2
_DEPTH = 4  # checkpoints lie at most this deep under the checkpoints folder (generations/<model>/<gNNNN>/<query>)


@dataclass(frozen=True)
class InFlight:
    """A query's batch planned and not committed."""
    checkpoint: str  # relative to the checkpoints folder
    batch: int

    def line(self) -> str:
        return f"{self.checkpoint} batch {self.batch}"


def _query_checkpoints(root, depth: int = _DEPTH) -> list:
    """Every query checkpoint (a folder with an offset log) under ``root``."""
    out = []
    try:
        if not root.is_dir():
            return out
        children = list(root.iterdir())
    except OSError:
        return out
    names = {child.name for child in children}
    if OFFSETS in names and (COMMITS in names or METADATA in names or SOURCES in names):
        return [root]
    if depth > 0:
        for child in sorted(children, key=lambda c: c.name):
            if not child.name.startswith((".", "_")):
                out += _query_checkpoints(child, depth - 1)
    return out


def batches_in_flight(settings: Settings) -> list[InFlight]:
    """The batches planned and not committed in every query checkpoint under the checkpoints folder (the live
    projections', the rebuilds' catch-ups, the archive's)."""
    root = settings.checkpoints
    out = []
    for checkpoint in _query_checkpoints(root):
        name = str(checkpoint).removeprefix(str(root)).lstrip("/") or checkpoint.name
        out += [InFlight(name, batch) for batch in planned_not_committed(checkpoint)]
    return out


def wait_for_batches(settings: Settings, batches: list[InFlight], wait_s: float,
                     log: Callable[[str], None] = print) -> list[InFlight]:
    """Wait up to ``wait_s`` seconds until each of ``batches`` is committed (its query's last committed batch is it or
    later) -> those that are not."""
    if not batches:
        return []
    log(f"forget: waiting (up to {wait_s:.0f} s) for {len(batches)} projection batch(es) planned before the key "
        f"went: " + ", ".join(b.line() for b in batches))
    root = settings.checkpoints
    deadline = time.monotonic() + wait_s
    pending = list(batches)
    while True:
        pending = [b for b in pending if (last_committed_batch(root / b.checkpoint) or -1) < b.batch]
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(_POLL_S)


@dataclass(frozen=True)
class LogRecord:
    """What became of the forget command of one of the subject's aggregates."""
    aggregate: str  # "<type> <id>"
    outcome: str  # "recorded", "recorded before", "pending" (sent, not answered yet), "refused", "not sent"
    detail: str = ""  # the answer's version, the refusal, the error; "pending": the seconds waited

    def line(self) -> str:
        return f"log: {self.aggregate}: " + {
            "recorded": f"SubjectForgotten appended ({self.detail})",
            "recorded before": "SubjectForgotten was appended by an earlier run",
            "pending": f"forget command sent; the command handler has not answered in {self.detail} s (it "
                       f"appends SubjectForgotten when it runs: the command waits in the commands topic)",
            "refused": f"forget command refused: {self.detail}",
            "not sent": f"forget command not sent: {self.detail}"}[self.outcome]

    @property
    def done(self) -> bool:
        """The command is on the log (answered or not); what the handler refuses or was never sent is not."""
        return self.outcome in ("recorded", "recorded before", "pending")


def forget_command_id(aggregate_type: str, aggregate_id: str, subject: str) -> str:
    """The forget command's id for one aggregate: the same on every run, so the handler's idempotency answers a
    repeat as it answered the first."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"eventlake:forget/{aggregate_type}/{aggregate_id}/{subject}"))


def record_on_log(settings: Settings, subject: str, aggregates: list[tuple[str, str]],
                  answer_s: float = ANSWER_WAIT_S, log: Callable[[str], None] = print) -> list[LogRecord]:
    """Send the domain's forget command to each of ``aggregates`` (type, id) of ``subject`` and wait up to
    ``answer_s`` for the answers (module docstring, step 3)."""
    commands = {}
    for aggregate_type, aggregate_id in aggregates:
        domain = DOMAINS.get(aggregate_type)
        if domain is None or not domain.forget_command:
            continue
        command = CommandEnvelope.create(domain.forget_command, aggregate_id, {domain.subject_field: subject},
                                         command_id=forget_command_id(aggregate_type, aggregate_id, subject),
                                         aggregate_type=aggregate_type)
        commands[command.command_id] = (f"{aggregate_type} {aggregate_id}", command)
    if not commands:
        return []
    try:
        check_access(settings, timeout_s=5.0)
        with EventStore(settings) as store:
            store.submit_many([c for _, c in commands.values()])
            log(f"forget: {len(commands)} forget command(s) sent to {settings.commands_topic}; waiting up to "
                f"{answer_s:.0f} s for the command handler's answers")
            answers = store.wait_for(list(commands), timeout_s=answer_s, partial=True)
    except Exception as e:  # noqa: BLE001 -- named in the report; the run is not complete and is run again
        return [LogRecord(name, "not sent", f"{type(e).__name__}: {e}") for name, _ in commands.values()]
    out = []
    for command_id, (name, _) in commands.items():
        answer = answers.get(command_id)
        if answer is None:
            out.append(LogRecord(name, "pending", f"{answer_s:g}"))
        elif not answer.accepted:
            out.append(LogRecord(name, "refused", f"{answer.error_type}: {answer.reason}"))
        elif answer.duplicate or not answer.event_ids:
            out.append(LogRecord(name, "recorded before"))
        else:
            out.append(LogRecord(name, "recorded", f"version {answer.version}"))
    return out


@dataclass(frozen=True)
class ForgetReport:
    """What ``forget_subject`` found and did: the key's state before, each table's erasure, and what kept it from
    completing (batches still in flight, models whose rebuild lock was held)."""
    subject: str
    key_before: str  # "key", "forgotten" or "unknown"
    tables: tuple[Erasure, ...]
    dry_run: bool
    in_flight: tuple[InFlight, ...] = ()
    locked: tuple[str, ...] = ()  # "<model>: <why>"
    wait_s: float = DEFAULT_WAIT_S
    changed_models: dict[str, int] = field(default_factory=dict)  # read model -> rows nulled (its tables changed)
    sealing: bool = True  # personal_data_seal was on (off: the events topic holds plain values until its retention)
    reports: tuple[QuotingFiles, ...] = ()  # the Data Docs and check results that quoted the values
    log_records: tuple[LogRecord, ...] = ()  # the forget commands: SubjectForgotten on the log
    recorded: bool = True  # False: asked not to record it on the log (--no-log-event)
    commands: CommandsPurge | None = None  # the handled commands deleted (None: not asked, with --no-log-event)

    @property
    def complete(self) -> bool:
        return (not self.dry_run and not self.in_flight and not self.locked
                and all(e.complete for e in self.tables) and all(r.done for r in self.log_records)
                and (self.commands is None or self.commands.complete))

    def summary(self) -> dict:
        """The report as plain data (a DAG run's XCom)."""
        return {"subject": self.subject, "key_before": self.key_before, "dry_run": self.dry_run,
                "complete": self.complete, "tables": [asdict(e) for e in self.tables],
                "in_flight": [b.line() for b in self.in_flight], "locked": list(self.locked),
                "changed_models": dict(self.changed_models), "sealing": self.sealing,
                "reports": [asdict(f) for f in self.reports],
                "log": [asdict(r) for r in self.log_records], "recorded": self.recorded,
                "commands": None if self.commands is None else {
                    "topic": self.commands.topic, "offsets_deleted": self.commands.offsets_deleted,
                    "deleted_before": {str(p): o for p, o in self.commands.deleted_before.items()},
                    "unhandled": {str(p): o for p, o in self.commands.unhandled.items()}}}

    def lines(self) -> list[str]:
        key = {"key": "deleted (a tombstone kept: the subject's key is never made again)",
               "forgotten": "deleted before", "unknown": "never made (a tombstone now refuses any later data)"}
        out = [f"subject {self.subject!r}: key " + ("would be deleted" if self.dry_run and self.key_before == "key"
                                                   else key[self.key_before])]
        out += [e.line() for e in self.tables]
        out += [f.line() for f in self.reports]
        out += [r.line() for r in self.log_records]
        if self.commands is not None:
            out.append(self.commands.line())
        if not self.recorded:
            out.append("log: not recorded (--no-log-event): no SubjectForgotten event was appended, and the commands "
                       "topic keeps the subject's commands in clear until its retention (7 days)")
        for batch in self.in_flight:
            out.append(f"{batch.line()}: planned before the key went and not committed after {self.wait_s:.0f} s; it "
                       f"may write the subject's values again (a projection killed in it runs it again with the key "
                       f"gone when it starts)")
        out += [f"{why}: not erased" for why in self.locked]
        if not self.sealing:
            out.append("personal_data_seal is off: the events topic keeps the subject's plain values until its "
                       "retention deletes them (the handler refuses their new commands; docs/forgetting.md)")
        if self.dry_run:
            out.append("dry run: nothing changed")
        elif self.complete:
            out.append("complete: no read model table or its history holds the subject's values")
        else:
            reasons = []
            if any(not e.complete for e in self.tables):
                reasons.append(f"files written in the grace period ({DEFAULT_GRACE_S / 60:.0f} minutes by default) "
                               f"may belong to a writer's open transaction")
            if self.in_flight:
                reasons.append("a projection's batch planned before the key went had not committed")
            if self.locked:
                reasons.append("a rebuild or maintenance held a read model")
            if any(not r.done for r in self.log_records):
                reasons.append("a forget command was not sent or was refused")
            if self.commands is not None and self.commands.error:
                reasons.append("the handled commands were not deleted from the commands topic")
            elif self.commands is not None and self.commands.unhandled:
                reasons.append("the handler had not handled every command on the commands topic")
            out.append("not complete: run again later: " + "; ".join(reasons))
        return out


def forget_subject(settings: Settings, subject: str, reason: str, dry_run: bool = False,
                   grace_s: float = DEFAULT_GRACE_S, wait_s: float = DEFAULT_WAIT_S,
                   log: Callable[[str], None] = print, record: bool = True,
                   answer_s: float = ANSWER_WAIT_S) -> ForgetReport:
    """Forget ``subject`` (module docstring): delete their key, wait for the projections' batches planned before,
    record it on the log (``record``), then null and purge their values in every read model and the dead
    letters."""
    keys = subject_keys(settings)  # the keys topic's tombstone first, then this home's files (event_store.keys_topic)
    keys.refresh()
    before = keys.state(subject)
    in_flight: list[InFlight] = []
    if not dry_run:
        keys.forget(subject)
        fault_point("after-key")
        # Listed after the key went: a batch planned later reads the key store after its plan, so reads nulls.
        in_flight = wait_for_batches(settings, batches_in_flight(settings), wait_s, log)
    aggregates = subject_aggregates(settings, subject)
    ids = sorted({aggregate_id for _, aggregate_id in aggregates})
    log(f"forget: subject {subject!r}: {len(ids)} aggregate(s) of theirs in the archive (by their tokens or their "
        f"subject field)")
    records = record_on_log(settings, subject, aggregates, answer_s, log) if record and not dry_run else []
    # After the forget commands were answered: their partitions' commands, the subject's among them, are handled.
    commands = purge_handled_commands(settings, wait_s=answer_s, dry_run=dry_run, log=log) if record else None
    tables: list[Erasure] = []
    locked: list[str] = []
    changed: dict[str, int] = {}
    # The reports (Data Docs pages, validation results) that quote the values go first: a run killed after the
    # tables finds the values there no more.
    values = set().union(*(values_in_model(settings, m, ids) for m in read_models.select(None)))
    reports = [purge_quoting(folder, values, dry_run=dry_run) for folder in (settings.data_docs,
                                                                              settings.check_results)]
    for found in reports:
        if found.holding:
            log(f"forget: reports: {found.line()}")
    for model in read_models.select(None):
        if not holds_personal_values(model) or not ids:
            continue
        if dry_run:
            tables += forget_in_model(settings, model, ids, reason, dry_run=True, grace_s=grace_s, log=log)
            continue
        try:
            lock = RebuildLock(settings, model.name, log=log, purpose="forget").acquire()
        except RebuildRefused as refused:
            log(f"forget: left for now: {refused}")
            locked.append(str(refused))
            continue
        try:
            erased = forget_in_model(settings, model, ids, reason, grace_s=grace_s, log=log)
        finally:
            lock.release()
        tables += erased
        if any(e.rows_nulled or e.files_purged or e.log_purged for e in erased):
            changed[model.name] = sum(e.rows_nulled for e in erased)
    tables += forget_in_archive(settings, ids, reason, dry_run=dry_run, grace_s=grace_s, log=log)
    tables += forget_in_dead_letters(settings, subject, ids, reason, dry_run=dry_run, grace_s=grace_s, log=log)
    return ForgetReport(subject, before, tuple(tables), dry_run, tuple(in_flight), tuple(locked), wait_s, changed,
                        sealing_on(settings), tuple(reports), tuple(records), record, commands)
