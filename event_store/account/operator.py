"""The functions of the account domain's ``eventlake`` verbs (``event_store.account.verbs``): each takes the
settings, the parsed options and the CLI's host (``event_store.verbs.VerbHost``), and returns the exit code. The
CLI has checked the broker before calling them."""
from __future__ import annotations

import sys

from lakehouse.lineage import detector_run, parent_id
from lakehouse.settings import Settings

__all__ = ["resolve_quarantine", "run_policy", "detect_fraud"]


def resolve_quarantine(settings: Settings, args, host) -> int:
    """Send ResolveQuarantine for one account and print its result: the operator's decision on the record
    that quarantined it, recorded as a QuarantineResolved event (the audit trail)."""
    import getpass

    from event_store.client import EventStore
    from event_store.envelope import CommandEnvelope
    from event_store.errors import InvalidRecord

    try:
        resolved_by = args.by or getpass.getuser()
    except (KeyError, OSError):
        resolved_by = "operator"
    try:
        command = CommandEnvelope.create("ResolveQuarantine", args.account,
                                         {"record": args.record, "reason": args.reason, "resolved_by": resolved_by})
    except InvalidRecord as e:
        raise SystemExit(f"eventlake resolve-quarantine: {e}")
    with EventStore(settings) as store:
        sent = store.submit_many([command])
        try:
            results = store.wait_for(sent, timeout_s=args.timeout, what={command.command_id: command})
        except TimeoutError as e:
            print(f"eventlake resolve-quarantine: {e}", file=sys.stderr)
            return 1
    r = results[command.command_id]
    if r.accepted:
        print(f"resolved: account {args.account} takes commands again (QuarantineResolved at version {r.version}, "
              f"record {args.record}, by {resolved_by})")
        return 0
    print(f"not resolved: account {args.account}: {r.error_type}: {r.reason}", file=sys.stderr)
    return 1


def run_policy(settings: Settings, args, host) -> int:
    """The fraud policy (FraudSuspected -> FreezeAccount) until caught up or SIGTERM."""
    from event_store.account.policy import FraudPolicy
    from lakehouse.signals import stop_requested_on_sigterm

    from event_store.account.policy import figures
    from lakehouse import metrics

    policy = FraudPolicy(settings)
    stop_requested_on_sigterm(policy.stop)  # ends run() within seconds, whatever it waits for
    server = metrics.serve(settings, "policy", lambda: figures(policy.stats), lambda m: print(m, flush=True))
    try:
        with detector_run(settings, "policy", args.until_caught_up):
            try:
                stats = policy.run(until_caught_up=args.until_caught_up)
            except KeyboardInterrupt:
                stats = policy.stats
    finally:
        if server is not None:
            server.close()
    print(f"policy: {stats.line()} to {settings.commands_topic}")
    return 0


def detect_fraud(settings: Settings, args, host) -> int:
    """The fraud detector: the Kafka consumer (python) or the Structured Streaming app (spark)."""
    if args.engine == "spark":
        with detector_run(settings, "detect-fraud", args.until_caught_up) as run:
            # With spark_lineage=all, the Spark application's run is this run's child.
            return host.run_spark_detector("fraud_detector", settings.replace(
                lineage_parent=parent_id(settings, run)), args.until_caught_up)
    from event_store.account.fraud_consumer import FraudConsumer
    from event_store.kafka_access import check_access
    from lakehouse.signals import stop_requested_on_sigterm

    check_access(settings, timeout_s=5.0, require_answer=False)
    from event_store.account.fraud_consumer import figures
    from lakehouse import metrics

    log = lambda message: print(message, flush=True)  # noqa: E731 -- a service's log, seen even if it is killed
    detector = FraudConsumer(settings, log=log)
    stop_requested_on_sigterm(detector.stop)  # ends run() within seconds, whatever it waits for
    server = metrics.serve(settings, "fraud-detector", lambda: figures(detector.stats), log)
    try:
        with detector_run(settings, "detect-fraud", args.until_caught_up, log):
            try:
                stats = detector.run(until_caught_up=args.until_caught_up)
            except KeyboardInterrupt:
                stats = detector.stats
    finally:
        if server is not None:
            server.close()
    print(f"fraud detector: {stats.line()}; findings are FlagFraud commands on {settings.commands_topic}")
    return 0

