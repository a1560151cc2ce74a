"""Triage of the dead letters (issue 46 part 3): what the command handler could not read as commands, reported by
reason and by aggregate, beside the Data Docs; and an operator's resolution of a quarantined account.

The dead-letters topic holds one JSON record per command record that was no command (``event_store.kafka_log.
dead_letter_value``: ``reason``, ``source_topic/partition/offset``, the original bytes, ``recorded_at``), keyed as
the original was (the aggregate's id, when it had one). ``triage`` reads the records that came since its last
report (its position per partition is kept beside the report, written after it), groups them, and writes
``<home>/data_docs/dead_letters/index.html`` (the latest report) and ``report-<UTC time>.json``; the same read
twice reports nothing new, and a run with nothing new leaves the page as it was (the newest 100 JSON copies are
kept, linked from the page). A reason is grouped by its kind: the text with the values it quotes taken out
(``reason_kind``), each kind with one full example.

``dead_letter_signal`` is what the Airflow watcher of the topic (``infra.airflow_assets.dead_letters``) makes of
each record it reads: a short summary, the asset event's extra. ``resolve_quarantine`` runs the domain's
``eventlake resolve-quarantine`` verb (found through the registry, ``event_store.domains``).
"""
from __future__ import annotations

import html
import json
import re
import time
from argparse import Namespace
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from lakehouse.errors import BadInput
from lakehouse.files import write_whole
from lakehouse.settings import Settings

__all__ = ["DeadLetter", "TriageReport", "QuarantineNotResolved", "REPORT_FOLDER", "NO_KEY", "RECORD", "KEEP_REPORTS", "parse_dead_letter",
           "reason_kind", "summarize", "render_html", "report_folder", "read_new", "triage", "dead_letter_signal",
           "resolve_quarantine"]

REPORT_FOLDER = "dead_letters"  # under the Data Docs folder (settings.data_docs)
NO_KEY = "(no key)"  # the aggregate of a dead letter whose record had no key
RECORD = re.compile(r"[^/\s]+/[0-9]+/[0-9]+")  # a record as the form and the verb take it: topic/partition/offset
_POSITION_FILE = "position.json"
KEEP_REPORTS = 100  # the JSON copies of the newest reports kept (older ones are deleted)
_EXAMPLES = 20  # the newest dead letters quoted in full in a report
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.IGNORECASE)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")  # a quoted field or type name: kept, it tells the fault
_NUMBER = re.compile(r"\b\d[\d,._:-]*\b")


class QuarantineNotResolved(BadInput, RuntimeError):
    """The resolution of a quarantined account was refused or could not be sent; the message says why."""


@dataclass(frozen=True)
class DeadLetter:
    """One record of the dead-letters topic, as read."""
    partition: int
    offset: int
    aggregate: str  # the record's key (NO_KEY without one)
    reason: str
    source: str  # where the original lies: topic/partition/offset ("" when the record does not say)
    recorded_at: str = ""


@dataclass
class TriageReport:
    """The dead letters of one triage: counts by reason kind, by aggregate and both, the newest in full, and the
    positions read (partition -> [first offset, end offset])."""
    topic: str
    count: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    by_aggregate: dict[str, int] = field(default_factory=dict)
    by_reason_and_aggregate: list[tuple[str, str, int]] = field(default_factory=list)
    reason_examples: dict[str, str] = field(default_factory=dict)
    newest: list[dict] = field(default_factory=list)
    read: dict[int, list[int]] = field(default_factory=dict)
    waiting: int = 0  # records past what this report read (a next run reports them)
    made_at: str = ""
    html: str = ""  # where the report was written ("" until written)
    json: str = ""

    def lines(self) -> list[str]:
        where = f"; report: file://{self.html}" if self.html else ""
        if not self.count:
            return [f"dead letters: none new in {self.topic}{where}"]
        lines = [f"dead letters: {self.count:,} new in {self.topic} ({len(self.by_reason)} reason(s), "
                 f"{len(self.by_aggregate)} aggregate(s)){where}"]
        lines += [f"  {n:>8,}  {kind}" for kind, n in self.by_reason.items()]
        if self.waiting:
            lines.append(f"  {self.waiting:,} more wait past this report's read (the next run reports them)")
        return lines

    def summary(self) -> dict:
        """What the asset event's extra and the task's return value carry."""
        return {"topic": self.topic, "dead_letters": self.count, "reasons": len(self.by_reason),
                "aggregates": len(self.by_aggregate), "waiting": self.waiting,
                "read": {str(p): r for p, r in self.read.items()}, "report": self.html}


def parse_dead_letter(partition: int, offset: int, key: bytes | None, value: bytes | None) -> DeadLetter:
    """A dead-letters record as a DeadLetter; a value that is not the JSON the handler writes is reported as it
    is, never dropped."""
    aggregate = key.decode("utf-8", errors="backslashreplace") if key else NO_KEY
    try:
        record = json.loads(value) if value is not None else None
    except ValueError:
        record = None
    if not isinstance(record, dict):
        shown = "null" if value is None else value[:80].decode("utf-8", errors="backslashreplace")
        return DeadLetter(partition, offset, aggregate, f"not a dead-letter record (its value: {shown})", "")
    source = ""
    if record.get("source_topic") is not None:
        source = f"{record['source_topic']}/{record.get('source_partition')}/{record.get('source_offset')}"
    return DeadLetter(partition, offset, aggregate, str(record.get("reason") or "(no reason given)"), source,
                      str(record.get("recorded_at") or ""))


def reason_kind(reason: str) -> str:
    """A reason without the values it quotes (quoted values, numbers, ids, parenthesised detail; a quoted field
    or type name stays): the reasons of one kind of fault group together, e.g. "command: not valid JSON (...)",
    "command: missing required field 'command_id'"."""
    kind = re.sub(r"\([^()]*(\([^()]*\)[^()]*)*\)", "(...)", reason)
    kind = _QUOTED.sub(lambda m: m.group(0) if _NAME.fullmatch(m.group(0)[1:-1]) else "'...'", kind)
    kind = _UUID.sub("ID", kind)
    kind = _NUMBER.sub("N", kind)
    kind = " ".join(kind.split())
    return kind if len(kind) <= 160 else kind[:157] + "..."


def summarize(topic: str, letters: Iterable[DeadLetter], read: Mapping[int, list[int]] | None = None,
              waiting: int = 0) -> TriageReport:
    """The report of ``letters``: counts by reason kind and by aggregate (most first, then by name), and by both."""
    letters = list(letters)
    reasons = Counter(reason_kind(d.reason) for d in letters)
    aggregates = Counter(d.aggregate for d in letters)
    both = Counter((reason_kind(d.reason), d.aggregate) for d in letters)
    examples: dict[str, str] = {}
    for d in letters:
        examples.setdefault(reason_kind(d.reason), d.reason)
    newest = sorted(letters, key=lambda d: (d.recorded_at, d.partition, d.offset), reverse=True)[:_EXAMPLES]
    return TriageReport(
        topic=topic, count=len(letters), by_reason=dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        by_aggregate=dict(sorted(aggregates.items(), key=lambda kv: (-kv[1], kv[0]))),
        by_reason_and_aggregate=[(r, a, n) for (r, a), n in sorted(both.items(), key=lambda kv: (-kv[1], kv[0]))],
        reason_examples=examples, newest=[asdict(d) for d in newest], read=dict(read or {}), waiting=waiting,
        made_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def render_html(report: TriageReport, earlier: Iterable[str] = ()) -> str:
    """The report as one self-contained HTML page (no script, no style from elsewhere), linking the ``earlier``
    reports' JSON files (names in the same folder, newest first)."""
    e = html.escape

    def table(head: tuple[str, ...], rows: Iterable[tuple]) -> str:
        cells = "".join(f"<tr>{''.join(f'<td>{e(str(c))}</td>' for c in row)}</tr>" for row in rows)
        return f"<table><tr>{''.join(f'<th>{e(h)}</th>' for h in head)}</tr>{cells}</table>"

    read = ", ".join(f"partition {p}: offsets {a}..{b}" for p, (a, b) in sorted(report.read.items())) or "nothing"
    parts = [f"<h1>Dead letters of {e(report.topic)}</h1>",
             f"<p>{report.count:,} new dead letter(s), made {e(report.made_at)}; read {e(read)}"
             + (f"; {report.waiting:,} more wait for the next report" if report.waiting else "") + ".</p>"]
    if report.count:
        parts += ["<h2>By reason</h2>", table(("dead letters", "reason (kind)", "example"),
                                              ((n, k, report.reason_examples.get(k, ""))
                                               for k, n in report.by_reason.items())),
                  "<h2>By aggregate</h2>", table(("dead letters", "aggregate"),
                                                 ((n, a) for a, n in report.by_aggregate.items())),
                  "<h2>By reason and aggregate</h2>", table(("dead letters", "reason (kind)", "aggregate"),
                                                            ((n, r, a) for r, a, n in
                                                             report.by_reason_and_aggregate)),
                  f"<h2>The newest {len(report.newest)}</h2>",
                  table(("partition", "offset", "aggregate", "reason", "original at", "recorded at"),
                        ((d["partition"], d["offset"], d["aggregate"], d["reason"], d["source"], d["recorded_at"])
                         for d in report.newest))]
    earlier = list(earlier)
    if earlier:
        parts += ["<h2>Earlier reports</h2>",
                  "<ul>" + "".join(f'<li><a href="{e(n)}">{e(n)}</a></li>' for n in earlier) + "</ul>"]
    parts.append("<p>A quarantined account is resolved from the Airflow DAG <code>triage_dead_letters</code>'s form "
                 "or with <code>eventlake resolve-quarantine ACCOUNT --record T/P/O --reason TEXT</code>.</p>")
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:1.5em}"
             "td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}")
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>Dead letters</title><style>{style}</style>"
            f"</head><body>{''.join(parts)}</body></html>\n")


def report_folder(settings: Settings) -> Path:
    """Where the reports are: ``<home>/data_docs/dead_letters``, beside the Great Expectations Data Docs."""
    return settings.data_docs / REPORT_FOLDER


def read_new(settings: Settings, positions: Mapping[int, int], limit: int = 100_000
             ) -> tuple[list[DeadLetter], dict[int, list[int]], int]:
    """The dead letters after ``positions`` (partition -> next offset; a partition not in it from its
    beginning), at most ``limit``: (them, partition -> [first, end] read, how many more wait)."""
    from kafka import TopicPartition

    from event_store.kafka_log import make_consumer, read_partition

    topic = settings.dead_letters_topic
    consumer = make_consumer(settings)
    letters: list[DeadLetter] = []
    read: dict[int, list[int]] = {}
    waiting = 0
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not partitions:
            return [], {}, 0
        ends = consumer.end_offsets(partitions)
        beginnings = consumer.beginning_offsets(partitions)
        for tp in partitions:
            start = max(positions.get(tp.partition, beginnings[tp]), beginnings[tp])
            end = min(ends[tp], start + max(0, limit - len(letters)))
            waiting += ends[tp] - end
            for record in read_partition(consumer, tp, start, end):
                letters.append(parse_dead_letter(tp.partition, record.offset, record.key, record.value))
            read[tp.partition] = [start, end]
    finally:
        consumer.close()
    return letters, read, waiting


def triage(settings: Settings, limit: int = 100_000, log=print) -> TriageReport:
    """Report the dead letters that came since the last report (at most ``limit``), write the report beside the
    Data Docs, then move the position past them."""
    folder = report_folder(settings)
    position_file = folder / _POSITION_FILE
    positions = ({int(p): int(o) for p, o in json.loads(position_file.read_text()).items()}
                 if position_file.exists() else {})
    letters, read, waiting = read_new(settings, positions, limit)
    report = summarize(settings.dead_letters_topic, letters, read, waiting)
    folder.mkdir(parents=True, exist_ok=True)
    index = folder / "index.html"
    report.html = str(index)
    # A run with nothing new keeps the last report on the page (the watcher may start runs that find nothing).
    if report.count or not index.exists():
        stamp = report.made_at.replace(":", "").replace("-", "")
        report.json = str(folder / f"report-{stamp}.json")
        write_whole(Path(report.json), json.dumps(asdict(report), indent=1))
        kept = sorted(folder.glob("report-*.json"), reverse=True)
        for old in kept[KEEP_REPORTS:]:
            old.unlink(missing_ok=True)
        write_whole(index, render_html(report, [p.name for p in kept[1:KEEP_REPORTS]]))
    write_whole(position_file, json.dumps({**{str(p): o for p, o in positions.items()},
                                      **{str(p): end for p, (_, end) in read.items()}}))
    for line in report.lines():
        log(line)
    return report


def dead_letter_signal(message) -> dict | None:
    """The Airflow watcher's view of one record of the dead-letters topic (a confluent-kafka Message): where it
    is and why, short (the asset event's extra); None for a record without a value (nothing to triage)."""
    value = message.value()
    if value is None:
        return None
    letter = parse_dead_letter(message.partition(), message.offset(), message.key(), value)
    return {"topic": message.topic(), "partition": letter.partition, "offset": letter.offset,
            "aggregate": letter.aggregate, "reason": reason_kind(letter.reason)}


def resolve_quarantine(settings: Settings, account: str, record: str, reason: str, by: str = "",
                       timeout_s: float = 30.0) -> int:
    """``eventlake resolve-quarantine ACCOUNT --record RECORD --reason REASON [--by BY]``: the verb's own function
    (its domain's, found in the registry), as its principal; 0 when the account takes commands again. Raises
    QuarantineNotResolved when the input is refused before anything is sent."""
    import importlib

    from event_store import domains

    verbs = {v.name: v for v in domains.verbs()}
    verb = verbs.get("resolve-quarantine")
    if verb is None:
        raise QuarantineNotResolved("no registered domain has the verb resolve-quarantine")
    if not (account and record and reason):
        raise QuarantineNotResolved("resolve-quarantine needs an account, the record that quarantined it "
                                    "(topic/partition/offset, see `eventlake status`) and a reason")
    if not RECORD.fullmatch(record):
        raise QuarantineNotResolved(f"record {record!r} is not topic/partition/offset (e.g. eventlake.events/0/42)")
    module, _, function = verb.run.partition(":")
    run = getattr(importlib.import_module(module), function)
    args = Namespace(account=account, record=record, reason=reason, by=by or None, timeout=timeout_s)
    try:
        return run(settings.for_role(verb.role), args, None)
    except SystemExit as e:  # the verb's own refusal of its input
        raise QuarantineNotResolved(str(e.code)) from None
