"""What several verb groups of the CLI share: the broker check, who asks, commands read from JSON."""
from __future__ import annotations

from lakehouse.settings import Settings

__all__ = ["require_broker", "who", "read_commands"]


def require_broker(settings: Settings) -> None:
    """The cluster runs and lets this process's principal in (else one line saying why not)."""
    from event_store.kafka_access import check_access
    from infra import kafka

    if settings.uses_local_kafka and not kafka.status(settings).running:
        raise SystemExit(f"eventlake: the local Kafka broker is not running at {settings.bootstrap_servers}; "
                         "start it with `eventlake kafka up` (or set KAFKA_BOOTSTRAP_SERVERS)")
    # Refused (no or wrong credentials): stop here with the reason. No answer: the services wait for the cluster.
    check_access(settings, timeout_s=5.0, require_answer=False)


def who(args) -> str:
    """The person asking: ``--by``, else the current user, else "operator"."""
    import getpass

    try:
        return args.by or getpass.getuser()
    except (KeyError, OSError):
        return "operator"


def read_commands(text: str, source: str) -> list:
    """Commands from one JSON object, a JSON array, or JSON lines."""
    import json

    text = text.strip()
    if not text:
        return []
    try:
        obj = json.loads(text)
        return obj if isinstance(obj, list) else [obj]
    except json.JSONDecodeError:
        pass
    commands = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                commands.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"eventlake submit: {source} line {number} is not JSON ({e}); expected one JSON "
                                 f"object, a JSON array or JSON lines")
    return commands