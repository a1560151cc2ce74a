"""The benchmarks in one report a person reads at a glance: bench/results/REPORT.md with PNG plots.

Runs the benchmarks one after the other, each as its own process (as a user runs them), keeps each one's printed
figures in the report, and draws:

- **latency distribution**: ``bench/freshness.py``: accepted -> visible in ``account_summary``, and payment ->
  ``FraudSuspected``, as cumulative distributions;
- **throughput against batch size**: ``bench/projection.py`` at each ``--batch-sizes``: the projection (its Python
  engine and Spark), the plain Python consumer, the unparsed Kafka -> Delta copy and the archive append, in
  events/s;
- **events/s by step**: the Python engine's steps in the largest-batch run (events in the run / seconds in the
  step).

``memory`` runs ``bench/projection.py --engine-memory`` at ``--events`` and five times as many: the Python engine's
peak RSS as the log grows.

Each figure names the command that made it, the date and the machine. The benchmarks take their own time (the
defaults: an hour or more on a 2-core machine; ``--quick`` runs small sizes in minutes, for a look, not for
figures to quote). Pick benchmarks with ``--only``: the report's other sections are kept as they were, and each
section says when it ran and by which command.

    .venv/bin/python bench/report.py [--quick] [--only commands projection memory freshness rebuild sql]
                                     [--events 1000000] [--batch-sizes 50000 200000 1000000]
                                     [--freshness-rate 2000] [--freshness-seconds 60] [--out bench/results]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHES = ("commands", "projection", "memory", "freshness", "rebuild", "sql")


def machine() -> str:
    """One line naming the machine: host, cores, memory, Python and Java."""
    memory = next((int(line.split()[1]) // 2**20 for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:")), 0) if Path("/proc/meminfo").exists() else 0
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    return (f"{platform.node()}: {os.cpu_count()} cores, {memory} GiB, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, {java[0] if java else 'no java'}")


class Run:
    """One benchmark process: its command line, printed output, exit code and wall time."""

    def __init__(self, script: str, *args: str):
        self.argv = [sys.executable, f"bench/{script}", *args]
        self.command = ".venv/bin/python " + " ".join(shlex.quote(a) for a in self.argv[1:])
        print(f"report: running {self.command}", flush=True)
        started = time.monotonic()
        out = subprocess.run(self.argv, cwd=ROOT, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.seconds = time.monotonic() - started
        self.code = out.returncode
        # Spark's and librdkafka's log lines are not figures.
        self.output = "\n".join(line for line in out.stdout.splitlines()
                                if not line.startswith(("WARNING", "%", "Setting default log level")))
        if self.code:
            self.output += f"\n\n(exit {self.code}; the last lines of its stderr:)\n" + "\n".join(
                out.stderr.splitlines()[-20:])
        print(f"report: {'done' if not self.code else f'FAILED (exit {self.code})'} in {self.seconds:.0f}s",
              flush=True)


def _shown(path: Path) -> str:
    """``path`` as the report's commands show it: relative to the repository when inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _stamp(ax_fig, command: str, when: str, host: str) -> None:
    ax_fig.text(0.01, 0.01, f"{command}\n{when} · {host}", fontsize=6, color="#555555", va="bottom")


def _thousands():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda value, _: f"{value / 1000:,.0f}k" if value else "0")


def plot_latency(data: dict, path: Path, command: str, when: str, host: str) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    fig.subplots_adjust(bottom=0.2)
    for label, values in (("accepted -> visible in account_summary", [v for _, v in data["freshness"]]),
                          ("payment -> FraudSuspected", [v for _, v in data["fraud"]]),
                          ("probe sent -> accepted", data["accepted"])):
        if values:
            xs = sorted(values)
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=f"{label} (n={len(xs)})")
    ax.set_xscale("log")
    ax.set_xlabel("seconds (log scale)")
    ax.set_ylabel("share of samples at or below")
    ax.set_title(f"Latency at {data['rate']:,} commands/s for {data['seconds']} s")
    ax.axvline(1.0, color="#999999", linestyle=":", linewidth=1)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    _stamp(fig, command, when, host)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_throughput(runs: list[tuple[int, dict]], path: Path, commands: list[str], when: str, host: str) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    fig.subplots_adjust(bottom=0.24)
    sizes = [size for size, _ in runs]
    for key, label in (("python_engine", "projection, Python engine (eventlake project's default)"),
                       ("projection", "projection, Spark (account_summary + payments)"),
                       ("plain", "plain Python consumer (delta-rs MERGE)"),
                       ("copy", "Kafka -> Delta, unparsed"), ("archive", "archive append (parsed)")):
        if all(d.get(key) for _, d in runs):
            ax.plot(sizes, [d[key]["events"] / d[key]["seconds"] for _, d in runs], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("events per batch (--max-offsets; the plain consumer's batch)")
    ax.set_ylabel("events/s")
    ax.yaxis.set_major_formatter(_thousands())
    ax.set_title(f"Throughput against batch size ({runs[0][1]['events']:,} events)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    _stamp(fig, "\n".join(commands), when, host)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_steps(data: dict, path: Path, command: str, when: str, host: str) -> None:
    import matplotlib.pyplot as plt

    engine = "python_engine" if data.get("python_engine") else "projection"
    steps = {k: v for k, v in data[engine]["steps"].items() if v > 0}
    events = data[engine]["events"]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(steps) + 2))
    fig.subplots_adjust(left=0.38, bottom=0.22)
    names = list(steps)[::-1]
    ax.barh(names, [events / steps[n] for n in names])
    ax.xaxis.set_major_formatter(_thousands())
    ax.set_xlabel("events/s of the step alone (events / seconds in it)")
    if engine == "python_engine":
        ax.set_title(f"Projection, Python engine: events/s by step ({events:,} events, batches of at most "
                     f"{min(data['max_offsets'], 100_000):,})", fontsize=10)
    else:
        ax.set_title(f"Projection: events/s by step ({events:,} events, batches of {data['max_offsets']:,})\n"
                     "(a step with sub-steps, e.g. `payments`, includes them)", fontsize=10)
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    _stamp(fig, command, when, host)
    fig.savefig(path, dpi=110)
    plt.close(fig)


TITLES = {"commands": "## Command path", "projection": "## Projection throughput",
          "memory": "## Memory as the log grows", "freshness": "## Freshness and fraud latency",
          "rebuild": "## Rebuild from the archive", "sql": "## SQL reads"}


def earlier_sections(text: str) -> dict[str, str]:
    """The sections of an existing report by bench. A section of a report made before sections said when they ran
    gets the report's date and command."""
    head, *parts = text.split("\n## ")
    made = re.search(r"^(\d{4}-\d\d-\d\d \d\d:\d\d UTC) on .*?\n\nMade by (`[^`]*`)", head, re.MULTILINE | re.DOTALL)
    by_title = {title: bench for bench, title in TITLES.items()}
    sections = {}
    for part in parts:
        title, _, body = part.partition("\n\n")
        bench = by_title.get(f"## {title.strip()}")
        if bench is None:
            continue
        if not body.startswith("Run ") and made:
            body = f"Run {made.group(1)}: {made.group(2)}.\n\n{body}"
        sections[bench] = f"## {title.strip()}\n\n{body.rstrip()}\n"
    return sections


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=BENCHES, default=list(BENCHES))
    ap.add_argument("--quick", action="store_true", help="small sizes: a look at the report, not figures to quote")
    ap.add_argument("--events", type=int, help="events of each projection run (default 1,000,000; quick 50,000)")
    ap.add_argument("--batch-sizes", type=int, nargs="+",
                    help="--max-offsets of the projection runs (default 50000 200000 1000000)")
    ap.add_argument("--freshness-rate", type=int, help="commands/s of bench/freshness.py (its default 2,000)")
    ap.add_argument("--freshness-seconds", type=int, help="seconds measured by bench/freshness.py (its default 60)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    events = args.events or (50_000 if args.quick else 1_000_000)
    sizes = sorted(args.batch_sizes or ([5_000, 50_000] if args.quick else [50_000, 200_000, 1_000_000]))
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    raw = args.out / "raw"
    raw.mkdir(exist_ok=True)
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    host = machine()
    sections: dict[str, str] = {}  # bench -> its section (title, when it ran, body)
    ran = f"Run {when}: `.venv/bin/python bench/report.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}`.\n\n"

    def printed(run: Run) -> str:
        return f"`{run.command}` ({run.seconds:.0f} s):\n\n```\n{run.output.strip()}\n```\n"

    if "commands" in args.only:
        run = Run("commands.py", *(["--commands", "20000"] if args.quick else []))
        sections["commands"] = (f"{TITLES['commands']}\n\n{ran}Accepted commands/s end to end, with 1 and 2 "
                                "handlers.\n\n" + printed(run))
    if "projection" in args.only:
        runs, texts = [], []
        for size in sizes:
            out = raw / f"projection-{size}.json"
            out.unlink(missing_ok=True)
            run = Run("projection.py", "--events", str(events), "--max-offsets", str(size),
                      "--warmup", str(min(100_000, events // 10)), "--json", _shown(out))
            texts.append(printed(run))
            if not run.code and out.exists():
                runs.append((size, json.loads(out.read_text()), run.command))
        body = f"{TITLES['projection']}\n\n{ran}"
        if runs:
            plot_throughput([(s, d) for s, d, _ in runs], args.out / "throughput.png", [c for *_, c in runs],
                            when, host)
            body += "![throughput against batch size](throughput.png)\n\n"
            size, data, command = runs[-1]
            plot_steps(data, args.out / "steps.png", command, when, host)
            body += "![events/s by step](steps.png)\n\n"
            body += "| batch | engine | events/s | plain consumer | unparsed copy | archive | ratio to plain | " \
                    "ratio to copy | peak RSS |\n|---|---|---|---|---|---|---|---|---|\n"
            for size, d, _ in runs:
                rate = {k: d[k]["events"] / d[k]["seconds"] for k in ("python_engine", "projection", "plain",
                                                                        "copy", "archive") if d.get(k)}
                for key, name, rss in (("python_engine", "Python", "peak_rss_mib"),
                                       ("projection", "Spark", "jvm_peak_rss_mib")):
                    if key in rate:
                        body += (f"| {size:,} | {name} | {rate[key]:,.0f} | {rate['plain']:,.0f} | "
                                 f"{rate['copy']:,.0f} | {rate['archive']:,.0f} | {rate[key] / rate['plain']:.2f} | "
                                 f"{rate[key] / rate['copy']:.2f} | {d[key][rss]:,.0f} MiB"
                                 f"{' (JVM)' if name == 'Spark' else ''} |\n")
            body += ("\n(events/s; aims: ratio to the plain consumer >= 1.5, to the unparsed copy >= 0.5. The Python "
                     "engine's batches hold at most 100,000 events whatever the batch size.)\n\n")
        sections["projection"] = body + "\n".join(texts)
    if "memory" in args.only:
        out = raw / "memory.json"
        out.unlink(missing_ok=True)
        run = Run("projection.py", "--engine-memory", *(["50000", "200000"] if args.quick else
                                                         [str(events), str(5 * events)]), "--json", _shown(out))
        sections["memory"] = (f"{TITLES['memory']}\n\n{ran}The projection's Python engine alone, catching up on "
                              "1x and 5x the events, the same accounts going on (aim: its peak RSS flat).\n\n"
                              + printed(run))
    if "freshness" in args.only:
        out = raw / "freshness.json"
        out.unlink(missing_ok=True)
        options = ["--rate", "200", "--seconds", "20", "--warm-up", "10", "--accounts", "300"] if args.quick else []
        if args.freshness_rate:
            options += ["--rate", str(args.freshness_rate), "--accounts", str(max(300, args.freshness_rate))]
        if args.freshness_seconds:
            options += ["--seconds", str(args.freshness_seconds)]
        run = Run("freshness.py", *options, "--json", _shown(out))
        body = f"{TITLES['freshness']}\n\n{ran}"
        if not run.code and out.exists():
            plot_latency(json.loads(out.read_text()), args.out / "latency.png", run.command, when, host)
            body += "![latency distribution](latency.png)\n\n(aims: freshness p50 <= 1 s, p99 <= 2 s; " \
                    "fraud p99 <= 1 s: the dotted line)\n\n"
        sections["freshness"] = body + printed(run)
    if "rebuild" in args.only:
        run = Run("rebuild.py", "--events", *(["200000"] if args.quick else ["1000000"]),
                  *(["--warmup", "20000"] if args.quick else []))
        sections["rebuild"] = f"{TITLES['rebuild']}\n\n{ran}" + printed(run)
    if "sql" in args.only:
        run = Run("sql.py", *(["--payments", "100000", "--repeat", "10"] if args.quick else []))
        sections["sql"] = f"{TITLES['sql']}\n\n{ran}" + printed(run)

    report = args.out / "REPORT.md"
    kept = [bench for bench in BENCHES if bench not in sections]
    if kept and report.exists():  # a partial run: the other sections stay as the report had them
        old = earlier_sections(report.read_text())
        sections.update({bench: old[bench] for bench in kept if bench in old})
    report.write_text(
        f"# eventlake benchmarks\n\nOn {host}. Each section says when it ran and the command that made it "
        "(`--only` re-runs some and keeps the others). Absolute figures move by ±30% between runs on a shared host; "
        "compare within one section.\n\n"
        + "\n".join(sections[bench] for bench in BENCHES if bench in sections))
    print(f"report: {report}")
    return 0


# bench/long_log.py (issue 42's aims) runs for tens of minutes per size: it is not one of BENCHES that ``main``
# runs; it writes its own section of the report from its JSON (``long_log_section``, ``replace_section``).
LONG_LOG_TITLE = "## The handler on a long log"


def plot_long_log(entries: list[dict], path: Path, command: str, when: str, host: str) -> None:
    """Handler peak RSS and restart time against the log's length, one line per label (before/after)."""
    import matplotlib.pyplot as plt

    fig, (rss, restart) = plt.subplots(1, 2, figsize=(10, 4.4))
    fig.subplots_adjust(bottom=0.25, wspace=0.3)
    for label in sorted({e["label"] for e in entries}):
        mine = sorted((e for e in entries if e["label"] == label), key=lambda e: e["events"])
        xs = [e["events"] for e in mine]
        rss.plot(xs, [e["first_fold"]["peak_rss_mib"] for e in mine], marker="o", label=f"{label}: first fold")
        rss.plot(xs, [e["command_path"]["rss_after_mib"] for e in mine], marker="s", linestyle="--",
                 label=f"{label}: after the commands")
        restart.plot(xs, [e["restart"]["all_answered_s"] for e in mine], marker="o", label=f"{label}: same home")
        restart.plot(xs, [e["restore"]["all_answered_s"] for e in mine], marker="s", linestyle="--",
                     label=f"{label}: fresh home (restore)")
    for ax, title, unit in ((rss, "Handler peak RSS", "MiB"), (restart, "Handler start to every probe answered", "s")):
        ax.set_xscale("log")
        ax.set_xlabel("events in the log")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    restart.axhline(5.0, color="#999999", linestyle=":", linewidth=1)
    _stamp(fig, command, when, host)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def long_log_section(entries: list[dict], table: str, command: str, when: str, host: str, out: Path) -> str:
    """The report's section of bench/long_log.py: its plot (``long_log.png`` in ``out``) and its table."""
    import matplotlib

    matplotlib.use("Agg")
    plot_long_log(entries, out / "long_log.png", command, when, host)
    return (f"{LONG_LOG_TITLE}\n\nRun {when}: `{command}` (figures: `bench/results/long_log.json`; labels: the "
            "handler's commit, before/after the state store).\n\n![handler RSS and restart against the log's "
            "length](long_log.png)\n\n(aims, issue 42: peak RSS <= 1 GB at 50M events and within 1.2x from 1M to "
            "50M; restart <= 5 s at every size: the dotted line; restore >= 200k state entries/s; commands/s on "
            f"the long log >= 20k and >= 0.8x the 1M log's)\n\n{table}\n")


def replace_section(report: Path, title: str, section: str) -> None:
    """Put ``section`` (starting with ``title``) in place of the report's section of that title, or at its end."""
    text = report.read_text() if report.exists() else "# eventlake benchmarks\n"
    head, *parts = text.split("\n## ")
    parts = [p for p in parts if f"## {p.partition(chr(10))[0].strip()}" != title]
    report.write_text("\n## ".join([head.rstrip("\n") + "\n", *[p.rstrip("\n") + "\n" for p in parts]])
                      .rstrip("\n") + "\n\n" + section)


if __name__ == "__main__":
    raise SystemExit(main())
