"""Where a command's CPU goes, by kind of process: run COMMAND (e.g. ``make test``), sample every process's CPU
time from /proc every few seconds, and print the CPU-seconds of each kind (the Spark session of each pytest
process, Spark apps started as subprocesses, Kafka brokers, the pytest processes themselves, Airflow, ...).

    .venv/bin/python bench/suite_cpu.py -- make test
    .venv/bin/python bench/suite_cpu.py --every 1 -- .venv/bin/python -m pytest tests/integration/test_rebuild.py

Linux only (/proc). A process that lives less than one interval may be missed, and the last interval of each
process is not counted: the figures are a floor. Processes that were running before COMMAND started are counted
from their start, so run it on an otherwise idle machine. The table says whether the command was bound by the
cores: the CPU-seconds of every kind against the wall time times the cores.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

_HZ = os.sysconf("SC_CLK_TCK")


def _cmdline(pid: int | str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _stat(pid: str) -> tuple[int, int, float] | None:
    """(parent pid, start time in ticks, CPU seconds) of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[19]), (int(fields[11]) + int(fields[12])) / _HZ


def kind(cmd: str, parent_cmd: str, pid: int | str = "?", ppid: int | str = "?") -> str:
    """The kind of a process, from its command line and its parent's (a pytest process by its pid: `make test`
    runs two)."""
    words = cmd.split()
    if not words:
        return "other"
    if "kafka.Kafka" in cmd:
        return "kafka broker"
    if "org.apache.spark" in cmd:
        if "pytest" in parent_cmd:
            return f"spark session of pytest {ppid}"
        return f"spark app of {' '.join(w.rsplit('/', 1)[-1] for w in parent_cmd.split()[1:3])[:50]}"
    if os.path.basename(words[0]).startswith("java"):
        return "other java"
    if "pytest" in cmd:
        return f"pytest {pid}"
    if "airflow" in cmd:
        return "airflow"
    if "eventlake" in cmd:
        return "eventlake " + next((w for w in words[2:] if not w.startswith("-")), "")
    if "python" in os.path.basename(words[0]):
        return "python " + " ".join(words[1:3])[:50]
    return os.path.basename(words[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=2.0, help="seconds between samples (default 2)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command: give it after --")
    before = {pid for pid in os.listdir("/proc") if pid.isdigit()}
    started = time.monotonic()
    proc = subprocess.Popen(command)
    seen: dict[tuple[str, int], list] = {}  # (pid, start ticks) -> [kind, CPU seconds]
    pytests: dict[str, str] = {}  # pid -> command line of each pytest process
    while True:
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid in before:
                continue
            stat = _stat(pid)
            if stat is None:
                continue
            ppid, start, cpu = stat
            entry = seen.get((pid, start))
            if entry is None:
                cmd = _cmdline(pid)
                seen[(pid, start)] = [kind(cmd, _cmdline(ppid), pid, ppid), cpu]
                if "pytest" in cmd and "org.apache.spark" not in cmd:
                    pytests[pid] = cmd
            else:
                entry[1] = cpu
        if proc.poll() is not None:
            break
        time.sleep(args.every)
    wall = time.monotonic() - started
    totals: dict[str, float] = {}
    for name, cpu in seen.values():
        totals[name] = totals.get(name, 0.0) + cpu
    total = sum(totals.values())
    cores = os.cpu_count() or 1
    print(f"\n{' '.join(command)}: exit {proc.returncode}, {wall:.0f} s of wall time, {total:.0f} CPU-seconds "
          f"sampled ({total / wall:.2f} of the {cores} cores on average)")
    for name, cpu in sorted(totals.items(), key=lambda item: -item[1]):
        if cpu >= 1.0:
            print(f"{cpu:9.0f} s {100 * cpu / total:5.1f}%  {name}")
    for pid, cmd in pytests.items():
        print(f"pytest {pid}: {cmd[:160]}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
