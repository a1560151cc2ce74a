"""The command handler's state store on the real broker (issue 42): a restart on the same home reads only the log
after the store's positions, and with no cache at all every state and window is served from disk with the same
answers."""
import pytest

from event_store import kafka_log
from event_store.envelope import CommandResult, EventEnvelope
from event_store.handler import CommandHandler
from eventlake.generator import GeneratorConfig, generate_commands

pytestmark = pytest.mark.slow
QUIET = lambda *_: None  # noqa: E731


def _send(settings, records) -> None:
    producer = kafka_log.make_producer(settings)
    try:
        kafka_log.produce_all(producer, settings.commands_topic, records)
    finally:
        producer.close()


def _handle_all(settings) -> CommandHandler:
    with CommandHandler(settings, log=QUIET) as handler:
        handler.run(until_caught_up=True, max_seconds=120)
    return handler


def _answers(settings) -> list[CommandResult]:
    return [CommandResult.from_json(r.value) for r in kafka_log.read_all(settings, settings.results_topic)]


def _answer(result: CommandResult) -> tuple:
    return result.status, result.version, result.event_ids, result.error_type, result.reason


def test_a_restart_on_the_same_home_replays_only_the_tail_and_serves_states_from_disk(settings):
    here = settings.replace(snapshot_every_events=0)  # no snapshots: only the store can spare the replay
    elsewhere = here.replace(home=settings.home.parent / "home-elsewhere")
    kafka_log.ensure_topics(here, log=QUIET)
    first = list(generate_commands(GeneratorConfig(accounts=40, commands=600, seed=3, run_id="store-a")))
    later = list(generate_commands(GeneratorConfig(accounts=40, commands=200, seed=4, run_id="store-b")))

    _send(here, first)
    handler = _handle_all(here)
    assert handler.rebuilds and not any(r.from_store for r in handler.rebuilds)
    events_at_store = len(list(kafka_log.read_all(here, here.events_topic)))
    results_at_store = len(_answers(here))
    # The log goes on without this home (another machine's handler): the tail a restart here must read.
    _send(elsewhere, later)
    _handle_all(elsewhere)
    tail_events = len(list(kafka_log.read_all(here, here.events_topic))) - events_at_store
    tail_results = len(_answers(here)) - results_at_store
    assert tail_events > 0 and tail_results == len(later)

    # Every command again, to a handler on the first home with no cache at all: every state and window it
    # decides on is read from the store on disk.
    _send(here, first + later)
    with CommandHandler(here.replace(handler_state_cache_mb=0), log=QUIET) as again:
        stats = again.run(until_caught_up=True, max_seconds=120)
    assert sorted(r.partition for r in again.rebuilds) == [0, 1, 2]
    assert all(r.from_store and not r.from_snapshot for r in again.rebuilds)
    assert sum(r.events_read for r in again.rebuilds) == tail_events
    assert sum(r.results_read for r in again.rebuilds) == tail_results
    assert stats.duplicates == len(first) + len(later) and stats.events == 0
    answers = _answers(here)
    originals = {r.command_id: r for r in answers if not r.duplicate}
    repeats = [r for r in answers if r.duplicate]
    assert len(repeats) == len(first) + len(later)
    assert all(_answer(r) == _answer(originals[r.command_id]) for r in repeats)
    events = [EventEnvelope.from_json(r.value) for r in kafka_log.read_all(here, here.events_topic)]
    assert len(events) == events_at_store + tail_events


def test_a_rebuild_that_would_need_offsets_retention_deleted_is_refused_naming_the_partition_and_offsets(settings):
    from confluent_kafka import TopicPartition as Partition

    from event_store.kafka_clients import admin_client
    from event_store.partition_rebuild import RetainedLogMissing

    here = settings.replace(snapshot_every_events=0)
    kafka_log.ensure_topics(here, log=QUIET)
    _send(here, list(generate_commands(GeneratorConfig(accounts=12, commands=90, seed=5, run_id="retained"))))
    _handle_all(here)
    # Retention deletes the oldest events of every partition (what delete-records does by hand).
    ends = {p: n for p, n in _event_counts(here).items() if n > 1}
    admin = admin_client(here)
    futures = admin.delete_records([Partition(here.events_topic, p, n - 1) for p, n in ends.items()])
    for future in futures.values():
        future.result(30)
    # The same home starts from its store, which covers the log to its end: nothing deleted is needed.
    _handle_all(here)
    # A fresh home with no snapshot would have to fold the events from offset 0: refused, not a partial state.
    fresh = here.replace(home=settings.home.parent / "home-retained-fresh")
    with pytest.raises(RetainedLogMissing) as refused:
        _handle_all(fresh)
    message = str(refused.value)
    assert f"must read {here.events_topic} from offset 0" in message and "partition" in message
    assert any(f"earliest retained offset is {n - 1}" in message for n in ends.values())


def _event_counts(settings) -> dict[int, int]:
    counts: dict[int, int] = {}
    for record in kafka_log.read_all(settings, settings.events_topic):
        counts[record.partition] = max(counts.get(record.partition, 0), record.offset + 1)
    return counts
