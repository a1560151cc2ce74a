"""The command handler's transactional producer: begin, produce, commit with the consumer's offsets, abort.

Beside the Kafka client it drives: which errors mean a rebalance, a fence or an absent broker; retriable errors
waited out between keepalives; a transactional call that hangs past its timeout bounded (and then taken as a fatal
error); a producer that cannot go on after a fatal error renewed with the same transactional id (its
``init_transactions`` aborts the open transaction), while a fence by another instance stops the handler. The handler
(``event_store.handler``) decides what goes into a transaction and what a failure means for its partitions; it
gives this class its keepalive, its wait and what to do around a renewal. See docs/DESIGN.md ("Guarantees").
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import confluent_kafka

from event_store import kafka_clients
from lakehouse.errors import Unavailable

__all__ = ["TransactionalProducer", "HandlerError", "PartitionsMoved", "REBALANCE_ERRORS", "FENCED_ERRORS",
           "BROKER_AWAY_ERRORS", "TRANSACTION_TIMEOUT_MS", "CALL_TIMEOUT_S", "STUCK_CALL_S"]

# An open transaction of a dead instance blocks a partition's readers until the broker aborts it.
TRANSACTION_TIMEOUT_MS = 20_000
# Every blocking client call waits at most this long before the handler checks stop() and polls again.
CALL_TIMEOUT_S = 5.0
# A transactional producer call that has not returned this long after its timeout is taken as stuck (see
# TransactionalProducer.bounded); longer than the transaction timeout, by which the broker has aborted it anyway.
STUCK_CALL_S = TRANSACTION_TIMEOUT_MS / 1000 + 10
# Abort causes that mean "this instance lost the partition", not "this batch cannot be written".
REBALANCE_ERRORS = frozenset({confluent_kafka.KafkaError.UNKNOWN_MEMBER_ID,
                              confluent_kafka.KafkaError.ILLEGAL_GENERATION,
                              confluent_kafka.KafkaError.REBALANCE_IN_PROGRESS,
                              confluent_kafka.KafkaError.FENCED_INSTANCE_ID})
# Fatal producer errors that mean another instance took over this transactional id (or group member): the
# handler stops. Any other fatal error (e.g. INVALID_TXN_STATE after a broker restart) renews the producer.
FENCED_ERRORS = frozenset({confluent_kafka.KafkaError.PRODUCER_FENCED, confluent_kafka.KafkaError._FENCED,
                           confluent_kafka.KafkaError.FENCED_INSTANCE_ID})
# Abort causes that mean "the broker was away" (a restart, a network cut), not "this batch cannot be written":
# the batch is redone as it was once the broker answers again, and no command is blamed for them.
BROKER_AWAY_ERRORS = frozenset({confluent_kafka.KafkaError._MSG_TIMED_OUT, confluent_kafka.KafkaError._TIMED_OUT,
                                confluent_kafka.KafkaError._TRANSPORT, confluent_kafka.KafkaError._ALL_BROKERS_DOWN,
                                confluent_kafka.KafkaError.REQUEST_TIMED_OUT,
                                confluent_kafka.KafkaError.NETWORK_EXCEPTION,
                                confluent_kafka.KafkaError.NOT_COORDINATOR,
                                confluent_kafka.KafkaError.COORDINATOR_NOT_AVAILABLE,
                                confluent_kafka.KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                                confluent_kafka.KafkaError.NOT_ENOUGH_REPLICAS,
                                confluent_kafka.KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                                confluent_kafka.KafkaError.LEADER_NOT_AVAILABLE,
                                confluent_kafka.KafkaError.NOT_LEADER_FOR_PARTITION,
                                confluent_kafka.KafkaError.CONCURRENT_TRANSACTIONS})


class HandlerError(Unavailable, RuntimeError):
    """The handler cannot go on safely (e.g. a partition's log stays blocked by an open transaction)."""


class _PartitionsMoved(Exception):
    """A rebalance took a partition of the open transaction while the handler waited to commit it.
    ``in_flight``: a transaction call had timed out and is still under way in librdkafka, so the transaction
    cannot be aborted (that ends in a fatal INVALID_TXN_STATE, and the same call again may never return with the
    group changed): the producer is renewed instead."""

    def __init__(self, message: str, in_flight: bool = False):
        super().__init__(message)
        self.in_flight = in_flight


# The public name. The class keeps its old name, which tests/unit/test_errors.py lists among the signals that never
# reach a person; rename it there and here together.
PartitionsMoved = _PartitionsMoved


class TransactionalProducer:
    """The handler's one transactional producer (``config``: kafka_clients.transactional_producer_config).

    ``keepalive()`` is called while a call waits (it may raise to stop the handler), ``wait(seconds)`` pauses
    between tries; on a renewal ``drop_state()`` runs before the new producer exists (no state the aborted
    transaction may have changed is kept) and ``read_again()`` once it is initialised. ``stats`` gets
    ``aborted``, ``producers_renewed`` and ``commit_seconds``."""

    def __init__(self, config: dict, instance_id: str, transactional_id: str, log: Callable[[str], None],
                 stats, keepalive: Callable[[], None], wait: Callable[[float], None],
                 drop_state: Callable[[], None], read_again: Callable[[], None]):
        self.config = config
        self.instance_id = instance_id
        self.transactional_id = transactional_id
        self.log = log
        self.stats = stats
        self.keepalive = keepalive
        self.wait = wait
        self.drop_state = drop_state
        self.read_again = read_again
        self.producer = kafka_clients.new_producer(config)

    def init(self, timeout_s: float = 60) -> None:
        """Fence any older instance with this transactional id and abort its open transaction."""
        self.producer.init_transactions(timeout_s)

    def begin(self) -> None:
        self.producer.begin_transaction()

    def produce(self, topic: str, key: bytes | None, value: bytes, partition: int | None = None,
                on_delivery=None) -> None:
        kafka_clients.produce(self.producer, topic, value, key, partition, on_delivery)

    def produce_partition(self, topic: str, records: list[tuple[bytes, bytes]], partition: int,
                          on_last_delivered) -> None:
        """Produce ``records`` in order to ``topic``/``partition``. Only the last asks for a delivery report:
        its offset is all the handler needs (what a snapshot covers), and a report per record costs."""
        kafka_clients.produce_records(self.producer, topic, records, partition, on_last_delivered)

    def commit(self, offsets: list, group_metadata: Callable[[], object], moved: Callable[[], bool]) -> None:
        """Send the consumer offsets and commit the open transaction, waiting out retriable errors (e.g. the
        broker restarting) between keepalives; raises KafkaException when the transaction must be aborted,
        PartitionsMoved when a rebalance (seen by a keepalive) took one of its partitions meanwhile."""
        started = time.monotonic()
        producer = self.producer
        # The group metadata of the moment the offsets are sent: a keepalive may have rejoined the group.
        self.retrying(lambda: self.bounded(lambda: producer.send_offsets_to_transaction(
            offsets, group_metadata(), CALL_TIMEOUT_S), "send_offsets_to_transaction"),
            "sending the offsets of a transaction", moved)
        self.retrying(lambda: self.bounded(lambda: producer.commit_transaction(CALL_TIMEOUT_S),
                                           "commit_transaction"), "committing a transaction", moved)
        self.stats.commit_seconds += time.monotonic() - started

    def commit_once(self) -> None:
        """Commit the open transaction with one call's patience (on close, a broker that is away gets no more)."""
        self.producer.commit_transaction(CALL_TIMEOUT_S)

    def commit_retrying(self, what: str) -> None:
        """Commit the open transaction, waiting out retriable errors between keepalives."""
        self.retrying(lambda: self.producer.commit_transaction(CALL_TIMEOUT_S), what)

    def bounded(self, call: Callable[[], None], name: str) -> None:
        """``call`` (a transactional producer call given a timeout) in a thread of its own, with keepalives while
        it runs. librdkafka may block in such a call long past its timeout after a broker restart (seen in
        tests/integration/test_services_broker_restart.py: commit_transaction(5) still blocked minutes later, so
        the consumer left its group and no command was handled again). Past STUCK_CALL_S the producer counts as
        failed (a fatal error): it is renewed, which fences it and aborts its transaction."""
        outcome: list = []

        def run() -> None:
            try:
                call()
                outcome.append(None)
            except BaseException as e:  # noqa: BLE001 -- handed to the caller's thread
                outcome.append(e)

        thread = threading.Thread(target=run, name=f"handler-{name}", daemon=True)
        thread.start()
        thread.join(CALL_TIMEOUT_S)
        deadline = time.monotonic() + STUCK_CALL_S
        while thread.is_alive():
            if time.monotonic() > deadline:
                raise confluent_kafka.KafkaException(confluent_kafka.KafkaError(
                    confluent_kafka.KafkaError._TIMED_OUT, f"{name} did not return within {STUCK_CALL_S:.0f}s "
                    f"(its timeout: {CALL_TIMEOUT_S:.0f}s)", fatal=True))
            self.keepalive()  # may raise to stop the handler: the call is abandoned (its transaction aborts)
            thread.join(0.2)
        if outcome and outcome[0] is not None:
            raise outcome[0]

    def retrying(self, call: Callable[[], None], what: str, moved: Callable[[], bool] | None = None) -> None:
        """``call`` until it goes through, waiting out retriable errors between keepalives; a fatal, abortable or
        non-retriable error is raised, and PartitionsMoved when ``moved()`` says a rebalance took a partition."""
        waiting_since = last_said = None
        while True:
            if moved is not None and moved():
                raise PartitionsMoved(f"a rebalance took a partition while {what}",
                                      in_flight=waiting_since is not None)
            try:
                call()
                break
            except confluent_kafka.KafkaException as e:
                error = e.args[0]
                if error.fatal() or error.txn_requires_abort() or not error.retriable():
                    raise
                now = time.monotonic()
                if waiting_since is None:
                    waiting_since = last_said = now
                    self.log(f"handler {self.instance_id}: {what} waits for the broker ({error}); retrying")
                elif now - last_said >= 30:
                    last_said = now
                    self.log(f"handler {self.instance_id}: {what} still waits after {now - waiting_since:.0f}s "
                             f"({error})")
                self.keepalive()
        if waiting_since is not None:
            self.log(f"handler {self.instance_id}: {what} went through after {time.monotonic() - waiting_since:.1f}s")

    def abort(self, error) -> None:
        """Abort the open transaction, waiting out a broker that does not answer."""
        self.stats.aborted += 1
        if isinstance(error, PartitionsMoved) and error.in_flight:
            self.renew(error)  # its init_transactions aborts the transaction
            return
        while True:
            try:
                self.producer.abort_transaction(CALL_TIMEOUT_S)
                return
            except confluent_kafka.KafkaException as e:
                abort_error = e.args[0]
                if abort_error.fatal():
                    self.renew(abort_error)  # aborts the open transaction; every partition is rebuilt
                    return
                if not abort_error.retriable():
                    raise HandlerError(f"handler {self.instance_id}: cannot abort a transaction after {error}: "
                                       f"{abort_error}") from None
                self.keepalive()

    def abort_quietly(self) -> None:
        """Best effort when stopping: an open transaction the broker does not hear about is aborted by it after
        transaction.timeout.ms, or by the next start's init_transactions."""
        try:
            self.producer.abort_transaction(1)
        except confluent_kafka.KafkaException:
            pass

    def renew(self, error) -> None:
        """After a fatal producer error that is no fence (e.g. INVALID_TXN_STATE after a broker restart), or a
        rebalance while a transaction call was in flight: a new producer with the same transactional id (its
        init_transactions aborts the open transaction); ``drop_state()`` before it, ``read_again()`` after. A
        fence by another instance stops the handler."""
        if isinstance(error, confluent_kafka.KafkaError) and error.code() in FENCED_ERRORS:
            raise HandlerError(f"handler {self.instance_id}: fenced ({error}) by a newer instance with transactional "
                               f"id {self.transactional_id}; stopping")
        self.stats.producers_renewed += 1
        self.log(f"handler {self.instance_id}: the producer cannot go on ({error}); renewing it and rebuilding "
                 f"every partition")
        old, self.producer = self.producer, None
        try:
            old.purge()
        except Exception as e:  # noqa: BLE001 -- a failed producer is dropped anyway
            self.log(f"handler {self.instance_id}: purging the failed producer: {e!r}")
        del old
        # Before the new producer may write: no state that the aborted transaction may have changed is kept.
        self.drop_state()
        self.producer = kafka_clients.new_producer(self.config)
        try:
            self.retrying(lambda: self.producer.init_transactions(CALL_TIMEOUT_S), "initialising a new producer")
        except confluent_kafka.KafkaException as e:
            raise HandlerError(f"handler {self.instance_id}: cannot initialise a new producer after {error}: "
                               f"{e.args[0]}; stopping") from None
        self.read_again()

    def wait_for_broker(self, failure, what: str, topic: str) -> None:
        """After a transaction failed because the broker was away: wait (between keepalives) until it answers
        (for ``topic``'s metadata)."""
        self.log(f"handler {self.instance_id}: a transaction failed while the broker was away ({failure}); "
                 f"{what} once it answers")
        since = time.monotonic()
        while True:
            self.keepalive()
            try:
                self.producer.list_topics(topic, timeout=CALL_TIMEOUT_S)
                break
            except confluent_kafka.KafkaException:
                self.wait(1.0)
        self.log(f"handler {self.instance_id}: the broker answers again after {time.monotonic() - since:.1f}s")

    def flush(self) -> None:
        """On close: deliver what is queued, within a call's timeout (a stopped transaction's records stay
        invisible anyway)."""
        try:
            self.producer.flush(CALL_TIMEOUT_S)
        except confluent_kafka.KafkaException as e:  # e.g. stopped mid-transaction: nothing of it is visible
            self.log(f"handler {self.instance_id}: closing the producer: {e}")
