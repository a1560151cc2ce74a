"""Triage of the dead letters: what the command handler could not read as commands, reported by reason and by
aggregate beside the Data Docs, and a form to resolve a quarantined account (issue 46 part 3).

**When.** Started by Kafka: the Asset `dead_letters` has an `AssetWatcher` with the Kafka provider's
`AwaitMessageTrigger` on the dead-letters topic (run in Airflow's triggerer, through the connection
`eventlake_kafka`, whose extra is librdkafka's configuration: `infra.airflow_assets.kafka_connection_env` gives
it as `AIRFLOW_CONN_EVENTLAKE_KAFKA`). Each dead letter it reads is an asset event; events that come while a run
waits start one run. Also by hand, with the form.

**What.** `report_dead_letters` reads the dead letters that came since its last report (so one run reports every
record the trigger folded into it, and the same record is never reported twice), and writes
`<EVENTLAKE_HOME>/data_docs/dead_letters/index.html` (named in its log) and a JSON copy; its asset event on
`dead_letter_report` carries the offsets read and the counts. `resolve_quarantine` runs when the form names an
**account**, with the **record** that quarantined it (topic/partition/offset, as `eventlake status` lists it)
and a **reason**: the same as `eventlake resolve-quarantine ACCOUNT --record RECORD --reason REASON [--by BY]`;
it fails with the handler's reason when the account is not resolved. Logic: expectations/dead_letters.py.
"""
from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from infra import airflow_assets as assets
from lakehouse.settings import Settings

REPORT = assets.asset(assets.DEAD_LETTER_REPORT)


@dag(dag_id="triage_dead_letters", schedule=assets.dead_letters(Settings.load()),
     start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False, max_active_runs=1, doc_md=__doc__,
     tags=["eventlake", "dead-letters"],
     params={"account": Param("", type="string", title="Quarantined account to resolve",
                              description="empty: only the report (eventlake status lists quarantined accounts)"),
             "record": Param("", type="string", title="Record that quarantined it", pattern=r"^$|^[^/\s]+/[0-9]+/[0-9]+$",
                             description="topic/partition/offset, as eventlake status names it"),
             "reason": Param("", type="string", title="Reason", description="what was decided and why (kept in "
                                                                             "the QuarantineResolved event)"),
             "by": Param("", type="string", title="Decided by", description="default: the worker's user")})
def triage_dead_letters():
    @task(outlets=[REPORT])
    def report_dead_letters() -> dict:
        from expectations.dead_letters import triage

        report = triage(Settings.load(role="reader"), log=lambda line: print(line, flush=True))
        get_current_context()["outlet_events"][REPORT].extra = report.summary()
        return report.summary()

    @task
    def resolve_quarantine() -> int:
        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

        from expectations.dead_letters import QuarantineNotResolved, resolve_quarantine

        p = get_current_context()["params"]
        if not p["account"]:
            raise AirflowSkipException("no account in the form: nothing to resolve")
        try:
            code = resolve_quarantine(Settings.load(), p["account"], p["record"], p["reason"], p["by"])
        except QuarantineNotResolved as e:
            raise AirflowFailException(str(e)) from None
        if code != 0:
            raise AirflowFailException(f"account {p['account']} not resolved (see the lines above)")
        return code

    report_dead_letters()
    resolve_quarantine()


triage_dead_letters()
