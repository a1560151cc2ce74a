"""The account domain's verbs of ``eventlake`` (registered with the domain in ``event_store.domains``): the
operator's decision on a quarantined account, the fraud policy and the fraud detector. Their functions are in
``event_store.account.operator``, loaded only when a verb runs."""
from __future__ import annotations

from event_store.verbs import Verb, option

__all__ = ["VERBS"]

_OPERATOR = "event_store.account.operator"

VERBS = (
    Verb("resolve-quarantine",
         help="an operator's decision on a quarantined account (a record of it in the events topic cannot be read): "
              "it takes commands again",
         run=f"{_OPERATOR}:resolve_quarantine",
         options=(option("account", help="the quarantined account id (eventlake status lists them)"),
                  option("--record", required=True, help="the record that quarantined it, as topic/partition/offset "
                                                         "(in the rejection of its commands and in eventlake status)"),
                  option("--reason", required=True,
                         help="what was decided and why (kept in the QuarantineResolved event)"),
                  option("--by", help="who decides (default: the current user)"),
                  option("--timeout", type=float, default=30.0, help="seconds to wait for the result"))),
    Verb("policy", help="run the fraud policy (FraudSuspected -> FreezeAccount)", run=f"{_OPERATOR}:run_policy",
         options=(option("--until-caught-up", action="store_true", help="stop once every event so far is read"),)),
    Verb("detect-fraud", help="run the fraud detector (events -> FlagFraud commands)",
         run=f"{_OPERATOR}:detect_fraud",
         options=(option("--until-caught-up", action="store_true", help="process what the log holds now, then stop"),
                  option("--engine", choices=("python", "spark"), default="python",
                         help="python (default): a Kafka consumer, findings within a second, state snapshots in the "
                              "checkpoints folder; spark: the Structured Streaming app (what spark-submit runs on a "
                              "cluster), seconds per micro-batch"))),
)
