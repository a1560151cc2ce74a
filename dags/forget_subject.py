"""Forget a data subject (a person): their key deleted, their values nulled in every read model and purged from the
tables' history (issue 45; docs/forgetting.md).

Trigger it with the form: **subject** (the account domain's `customer_id`), **reason** (recorded in each table's
history: the request's reference, never personal data), **dry_run** (say what would be done; change nothing),
**grace_minutes** (old files written this recently may belong to a writer's open transaction: left for a later
try), **wait_seconds** (how long to wait for the projections' batches planned before the key went) and
**log_event** (send each of the subject's accounts a ForgetSubject command, answered by a SubjectForgotten event on
the log, and delete the handled commands, which carried the values in clear, from the commands topic; off only for
a home whose broker is gone).

`forget` does what `eventlake forget SUBJECT --reason REASON` does (projection_core/forget_subject.py): the key goes
(a tombstone stays; every reader reads the subject's sealed values as null, the handler refuses their commands), the
projections' batches in flight are waited for, the forget commands are sent, then each read model is erased under its rebuild lock, then the dead
letters. Its log lists every table touched (rows holding values, nulled, the Delta version, old files and log files
deleted). When something is left (files of the grace period, a batch still in flight, a rebuild holding a model) the
task fails with the reason and is **retried** after the grace period (4 times); each try is safe to repeat.

**Assets.** Each read model whose tables changed announces an update of its Asset (`eventlake://warehouse/<read
model>`) through the alias `read_models_forgotten`, its extra the current generation, its table's Delta version and
the rows nulled; `check_read_models` runs on it. A dry run announces nothing.
"""
from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from infra import airflow_assets as assets  # names only: the tables and the key store are touched by the task

_GRACE_MINUTES = 15  # lakehouse.erasure.DEFAULT_GRACE_S (not imported at parse time)


@dag(dag_id="forget_subject", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
     max_active_runs=1, doc_md=__doc__, tags=["eventlake", "personal-data"],
     params={"subject": Param(type="string", minLength=1, maxLength=256, title="Data subject",
                              description="the customer_id of the person to forget"),
             "reason": Param(type="string", minLength=1, maxLength=500, title="Reason",
                             description="why (e.g. the request's reference); kept in each table's history, so "
                                         "no personal data"),
             "dry_run": Param(False, type="boolean", title="Dry run",
                              description="say what would be done; change nothing"),
             "grace_minutes": Param(_GRACE_MINUTES, type="number", minimum=0, title="Grace period (minutes)",
                                    description="old files written this recently are left for a later try"),
             "wait_seconds": Param(120, type="number", minimum=0, title="Wait for batches in flight (seconds)",
                                   description="how long to wait for the projections' batches planned before "
                                               "the key went"),
             "log_event": Param(True, type="boolean", title="Record it on the log",
                                description="append SubjectForgotten to each of the subject's accounts (through "
                                            "the command handler) and delete the handled commands from the "
                                            "commands topic")})
def forget_subject():
    @task(retries=4, retry_delay=pendulum.duration(minutes=_GRACE_MINUTES + 1),
          outlets=[assets.alias(assets.FORGOTTEN)])
    def forget() -> dict:
        from airflow.sdk.exceptions import AirflowException

        from lakehouse.settings import Settings
        from projection_core.forget_subject import forget_subject as forget_it

        context = get_current_context()
        p = context["params"]
        settings = Settings.load()
        report = forget_it(settings, p["subject"], p["reason"], dry_run=p["dry_run"],
                           grace_s=float(p["grace_minutes"]) * 60.0, wait_s=float(p["wait_seconds"]),
                           record=bool(p["log_event"]),
                           log=lambda line: print(line, flush=True))
        for line in report.lines():
            print(line, flush=True)
        for name, rows in report.changed_models.items():
            assets.record_written(context, "forget_subject", name, {**assets.table_version(settings, name),
                                                          "rows_nulled": rows})
        summary = report.summary()
        if not report.complete and not report.dry_run:
            raise AirflowException(report.lines()[-1])  # retried after the grace period
        return summary

    forget()


forget_subject()
