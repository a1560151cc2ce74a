"""What the command handler has done so far (``HandlerStats``): its one-line progress report and its Prometheus
figures (``figures``, served by ``lakehouse.metrics``). Pure: counters."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from lakehouse.metrics import Sample

__all__ = ["HandlerStats", "figures", "state_figures"]


@dataclass
class HandlerStats:
    commands: int = 0
    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    events: int = 0
    transactions: int = 0
    aborted: int = 0
    snapshots: int = 0
    snapshot_steps: int = 0  # transactions written by snapshots (event_store.snapshots.SnapshotWriter)
    too_large: int = 0  # rejected EventTooLarge (counted in rejected too)
    unwritable: int = 0  # rejected NotWritable after transactions of their own failed (counted in rejected too)
    batch_retries: int = 0  # batches redone one command per transaction
    command_retries: int = 0  # failed transactions of a single command
    unreadable_events: int = 0  # events records a rebuild could not read (their aggregates are quarantined)
    repeated_events: int = 0  # an event id seen before, or an event at a version already taken (forged)
    unreadable_results: int = 0  # command-results records a rebuild skipped
    producers_renewed: int = 0  # producers replaced after a fatal error that was no fence
    consumers_renewed: int = 0  # consumers replaced after not rejoining their group (kafka_clients.RejoinWatch)
    commit_seconds: float = 0.0  # waiting for send_offsets_to_transaction + commit_transaction
    snapshot_seconds: float = 0.0  # writing snapshots' steps (the loop handles no command meanwhile)
    longest_snapshot_s: float = 0.0  # the longest step
    batches: int = 0  # polled batches of command records handled (each in one transaction unless redone)
    batch_seconds: float = 0.0  # handling them, transactions included
    quarantined_aggregates: int = 0  # aggregates a rebuild quarantined after an unreadable events record
    # Rebalances of the handlers' group as this instance saw them: partitions assigned, revoked, lost.
    rebalances: dict[str, int] = field(default_factory=lambda: {"assigned": 0, "revoked": 0, "lost": 0})
    collections: int = 0  # the loop's paced garbage collections (event_store.collector)
    collector_seconds: float = 0.0
    longest_collection_s: float = 0.0
    # (command type, outcome) -> commands of a registered type decided (the rest, records that are no valid
    # command, count under the type "unknown")
    by_type: dict[tuple[str, str], int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        secs = max(time.monotonic() - self.started, 1e-9)
        faults = {"too large": self.too_large, "not writable": self.unwritable,
                  "batches redone one by one": self.batch_retries, "single-command retries": self.command_retries,
                  "unreadable events (aggregates quarantined)": self.unreadable_events,
                  "repeated or conflicting events skipped": self.repeated_events,
                  "unreadable results skipped": self.unreadable_results,
                  "producers renewed after a fatal error": self.producers_renewed,
                  "consumers renewed after not rejoining their group": self.consumers_renewed}
        return (f"{self.commands} commands ({self.accepted} accepted, {self.rejected} rejected, "
                f"{self.duplicates} duplicate, {self.dead_lettered} dead-lettered) -> {self.events} events "
                f"in {self.transactions} transactions, {self.commands / secs:,.0f} commands/s"
                + (f", {self.commit_seconds / secs:.0%} of the time committing" if self.transactions else "")
                + (f", {self.snapshots} partition snapshots written in {self.snapshot_steps} steps, "
                   f"{self.snapshot_seconds:.1f}s (the longest step {self.longest_snapshot_s:.2f}s)"
                   if self.snapshots else "")
                + (f", {self.collections} garbage collections {self.collector_seconds:.1f}s (the longest "
                   f"{self.longest_collection_s:.2f}s)" if self.collections else "")
                + "".join(f"; {n} {what}" for what, n in faults.items() if n))



def figures(stats: HandlerStats, states: Mapping[int, Any]) -> list[Sample]:
    """The handler's Prometheus figures (``lakehouse.metrics``): its counters as they stand, the commands
    partitions it owns and the size of their states (``states``: partition -> its PartitionState, read from the
    scrape's thread while the loop runs: a state closed meanwhile is skipped)."""
    c = "counter"
    owned = list(states.items())  # one copy: the loop adds and drops partitions meanwhile
    return [
        *commands_by_type(stats),
        Sample("handler_events", c, "Events appended to the events topic", stats.events),
        Sample("handler_transactions", c, "Kafka transactions, by result", stats.transactions,
               {"result": "committed"}),
        Sample("handler_transactions", c, "Kafka transactions, by result", stats.aborted, {"result": "aborted"}),
        Sample("handler_commit_seconds", c, "Time spent committing transactions (offsets and commit)",
               stats.commit_seconds),
        Sample("handler_rejected_too_large", c, "Commands rejected because an event or result exceeds the "
               "topic's record size", stats.too_large),
        Sample("handler_rejected_unwritable", c, "Commands rejected after transactions of their own failed",
               stats.unwritable),
        Sample("handler_batch_retries", c, "Batches redone one command per transaction", stats.batch_retries),
        Sample("handler_command_retries", c, "Failed transactions of a single command", stats.command_retries),
        Sample("handler_unreadable_events", c, "Events records a rebuild could not read (their aggregates are "
               "quarantined until resolved)", stats.unreadable_events),
        Sample("handler_repeated_events", c, "Repeated or conflicting events records skipped by a rebuild",
               stats.repeated_events),
        Sample("handler_clients_renewed", c, "Kafka clients replaced, by kind", stats.producers_renewed,
               {"client": "producer"}),
        Sample("handler_clients_renewed", c, "Kafka clients replaced, by kind", stats.consumers_renewed,
               {"client": "consumer"}),
        Sample("handler_snapshots", c, "Partition snapshots written", stats.snapshots),
        Sample("handler_snapshot_seconds", c, "Time spent writing snapshot steps", stats.snapshot_seconds),
        Sample("handler_collection_seconds", c, "Time spent in the loop's paced garbage collections",
               stats.collector_seconds),
        Sample("handler_partitions", "gauge", "Commands partitions this instance owns", len(owned)),
        Sample("handler_batches", c, "Polled batches of command records handled", stats.batches),
        Sample("handler_batch_seconds", c, "Time handling batches, their transactions included",
               stats.batch_seconds),
        Sample("handler_quarantined_aggregates", c, "Aggregates quarantined by a rebuild after an unreadable "
               "events record (they refuse commands until resolved)", stats.quarantined_aggregates),
        *[Sample("handler_rebalances", c, "Partitions of the handlers' group assigned, revoked or lost to this "
                 "instance", n, {"kind": kind}) for kind, n in sorted(dict(stats.rebalances).items())],
    ] + state_figures(owned)


def state_figures(owned: list[tuple[int, Any]]) -> list[Sample]:
    """Per owned partition, what its state holds: aggregates in memory, or its state store's entries, cached bytes
    and bytes on disk (event_store.state_store)."""
    g = "gauge"
    out = []
    for partition, part in sorted(owned, key=lambda item: item[0]):
        at = {"partition": str(partition)}
        store = part.store
        if store is None:
            out.append(Sample("handler_state_aggregates", g, "Aggregates whose state a partition holds in memory",
                              len(part.states), at))
            continue
        try:
            figures = [("handler_state_store_entries", "Keys in a partition's state store", store.entries()),
                       ("handler_state_store_cached_bytes", "What a partition's state store caches in memory",
                        store.cached_bytes()),
                       ("handler_state_store_bytes", "A partition's state store's files on disk",
                        store.size_on_disk())]
        except Exception:  # closed by the loop meanwhile (the partition was revoked): not served this time
            continue
        out += [Sample(name, g, text, value, at) for name, text, value in figures]
    return out


def commands_by_type(stats: HandlerStats) -> list[Sample]:
    """Commands decided by type and outcome: a registered type's as counted, the rest of each outcome (records that
    are no valid command: rejected as invalid, dead-lettered) under the type "unknown". Every outcome is served, 0
    included."""
    totals = {"accepted": stats.accepted, "rejected": stats.rejected, "duplicate": stats.duplicates,
              "dead_lettered": stats.dead_lettered}
    by_type = dict(stats.by_type)  # copied: the loop may add a key while a scrape reads
    out = []
    for outcome, total in totals.items():
        typed = {kind: n for (kind, which), n in by_type.items() if which == outcome}
        rest = total - sum(typed.values())
        if rest > 0 or not typed:
            typed["unknown"] = max(0, rest)
        out += [Sample("handler_commands", "counter", "Commands decided, by command type and outcome", n,
                       {"type": kind, "outcome": outcome}) for kind, n in sorted(typed.items())]
    return out
