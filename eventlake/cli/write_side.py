"""The write side's verbs: topics, generate, submit, handler."""
from __future__ import annotations

import sys

from lakehouse.settings import Settings
from eventlake.cli.common import read_commands, require_broker

__all__ = ["ROLES", "add_verbs"]

# The Kafka principal each verb runs as when SASL is on (the others: admin); see eventlake.cli.roles.
ROLES = {"handler": "handler", "submit": "client", "generate": "client"}


def _cmd_topics(settings: Settings, args) -> int:
    from event_store import kafka_log

    require_broker(settings)
    kafka_log.ensure_topics(settings)
    if settings.kafka_security != "none":
        from event_store.kafka_access import grant_acls

        grant_acls(settings)
    for name, cfg in kafka_log.topic_configs(settings).items():
        print(f"{name}: {settings.topic_partitions} partitions, "
              + ", ".join(f"{k}={v}" for k, v in sorted(cfg.items())))
    return 0


def _cmd_generate(settings: Settings, args) -> int:
    import importlib
    import json
    from collections import Counter

    from event_store.client import EventStore
    from event_store.domains import GENERATORS

    require_broker(settings)
    [generate] = [g for g in GENERATORS.values() if g.name == args.domain]  # the domain's own generator
    module, _, function = generate.run.partition(":")
    records, what = getattr(importlib.import_module(module), function)(settings, args)
    with EventStore(settings) as store:
        sent = store.send_raw(records)
        print(f"generate: sent {sent} commands for {what} to {settings.commands_topic}")
        if args.wait:
            ids = []
            for _, value in records:
                try:
                    obj = json.loads(value)
                    ids.append(obj["command_id"]) if isinstance(obj, dict) and obj.get("command_id") else None
                except ValueError:
                    pass  # a malformed record: dead-lettered, no result to wait for
            try:
                results = store.wait_for(ids, timeout_s=args.timeout)
            except TimeoutError as e:
                print(f"generate: {e}", file=sys.stderr)
                return 1
            counts = Counter(r.status for r in results.values())
            print(f"generate: {len(results)} results on {settings.results_topic}: "
                  + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    return 0


def _cmd_submit(settings: Settings, args) -> int:
    from event_store.client import EventStore, as_command
    from event_store.errors import InvalidRecord

    require_broker(settings)
    source = "stdin" if args.file == "-" else args.file
    try:
        text = sys.stdin.read() if args.file == "-" else open(args.file, encoding="utf-8").read()
    except OSError as e:
        raise SystemExit(f"eventlake submit: cannot read {source}: {e.strerror}")
    commands, failed = [], 0
    for i, obj in enumerate(read_commands(text, source), 1):
        try:
            commands.append(as_command(obj))
        except InvalidRecord as e:
            failed += 1
            print(f"not sent: command #{i} in {source}: {e}", file=sys.stderr)
    with EventStore(settings) as store:
        sent = store.submit_many(commands)
        print(f"submit: sent {len(sent)} command(s) to {settings.commands_topic}", file=sys.stderr)
        if args.no_wait:
            return 1 if failed else 0
        try:
            results = store.wait_for(sent, timeout_s=args.timeout, what={c.command_id: c for c in commands})
        except TimeoutError as e:
            print(f"eventlake submit: {e}", file=sys.stderr)
            return 1
    for command in commands:
        r = results[command.command_id]
        if args.json:
            print(r.to_json().decode())
        elif r.accepted:
            print(f"accepted {r.command_id} {command.command_type} {r.aggregate_id}: version {r.version}, "
                  f"{len(r.event_ids)} event(s){' (duplicate: first result repeated)' if r.duplicate else ''}")
        else:
            print(f"rejected {r.command_id} {command.command_type} {r.aggregate_id}: {r.error_type}: {r.reason}"
                  f"{' (duplicate: first result repeated)' if r.duplicate else ''}")
    return 1 if failed else 0


def _cmd_handler(settings: Settings, args) -> int:
    from event_store.handler import CommandHandler

    require_broker(settings)
    log = lambda message: print(message, flush=True)  # noqa: E731 -- a service's log, seen even if it is killed
    with CommandHandler(settings, instance_id=args.instance_id, use_snapshots=not args.no_snapshots,
                        log=log) as handler:
        from event_store.handler_stats import figures
        from lakehouse import metrics
        from lakehouse.signals import stop_requested_on_sigterm

        # SIGTERM (e.g. from Kubernetes) stops after the current batch; closing then writes the snapshots.
        stop_requested_on_sigterm(handler.stop)
        server = metrics.serve(settings, f"handler-{args.instance_id}",
                               lambda: figures(handler.stats, handler.partitions), log)
        try:
            stats = handler.run(until_caught_up=args.until_caught_up)
        except KeyboardInterrupt:
            stats = handler.stats
        finally:
            if server is not None:
                server.close()
    print(f"handler: {stats.line()}")
    return 0


def add_verbs(sub) -> None:
    """Add this group's verbs to the ``eventlake`` parser's subparsers."""
    p = sub.add_parser("topics", help="create the topics if missing and print their configuration")
    p.set_defaults(run=_cmd_topics)

    p = sub.add_parser("generate", help="send generated commands to the commands topic")
    from event_store.domains import GENERATORS

    p.add_argument("--domain", choices=tuple(g.name for g in GENERATORS.values()), default="accounts",
                   help="accounts (card payments), iot (device telemetry) or site (page views)")
    p.add_argument("--accounts", type=int, default=300, help="accounts: how many")
    p.add_argument("--commands", type=int, default=3000, help="accounts: commands in all")
    p.add_argument("--devices", type=int, default=24, help="iot: how many devices")
    p.add_argument("--minutes", type=int, default=30, help="iot, site: minutes of event time the readings or views span")
    p.add_argument("--sites", type=int, default=3, help="site: how many sites")
    p.add_argument("--views", type=int, default=600, help="site: page views in all")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--run-id", default="gen", help="prefix of the account, device or site ids (acc-RUNID-00001)")
    p.add_argument("--invalid-rate", type=float, default=0.0, help="share of commands with a bad field")
    p.add_argument("--malformed-rate", type=float, default=0.0, help="share of records that are not commands")
    p.add_argument("--wait", action="store_true", help="wait for every command's result and count them")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for results (with --wait)")
    p.set_defaults(run=_cmd_generate)

    p = sub.add_parser("submit", help="send JSON commands (an object, an array or JSON lines) and print results")
    p.add_argument("file", help="a file, or - for stdin")
    p.add_argument("--no-wait", action="store_true", help="send only; do not wait for the results")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the results")
    p.add_argument("--json", action="store_true", help="print each result as a JSON line")
    p.set_defaults(run=_cmd_submit)

    p = sub.add_parser("handler", help="run the command handler (commands -> events)")
    p.add_argument("--until-caught-up", action="store_true", help="stop once every command sent so far is handled")
    p.add_argument("--instance-id", default="0",
                   help="distinguishes handler instances; keep it stable per instance (transactional id)")
    p.add_argument("--no-snapshots", action="store_true", help="rebuild state from the whole log on start")
    p.set_defaults(run=_cmd_handler)
