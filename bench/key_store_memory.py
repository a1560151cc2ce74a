"""What a key store (``event_store.personal_data.SubjectKeys``) costs per subject in a process that seals or opens
values of many subjects: memory (RssAnon, beyond the records read from the files) and microseconds per value, with
the store's bounded caches (``CIPHERS_KEPT``, ``HEADS_KEPT``) and, side by side in the same run, with them unbounded
(what the store did before issue 42's bound). Each variant runs in a process of its own, so its RSS is its own.

    .venv/bin/python bench/key_store_memory.py [--subjects 100000] [--repeat 2]

Prints figures; it is not a test.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_ONE = r"""
import json, sys, time
import event_store.personal_data as pd
from event_store.personal_data import SubjectKeys

folder, subjects, bounded, role = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "bounded", sys.argv[4]
if not bounded:
    pd.CIPHERS_KEPT = pd.HEADS_KEPT = 10 ** 12


def rss_anon_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1])


names = [f"cus-{i:07d}" for i in range(subjects)]
tokens = [line for line in open(folder + "/tokens.txt").read().split()]
store = SubjectKeys(folder + "/keys")
before = rss_anon_kib()
started = time.perf_counter()
for _ in range(2):  # a first use of each subject, then a second
    if role == "seal":
        for name in names:
            store.seal(name, "location", "US-NYC")
    else:
        for token in tokens:
            store.unseal(token, field_name="location")
print(json.dumps({"mib": round((rss_anon_kib() - before) / 1024, 1),
                  "us_per_value": round((time.perf_counter() - started) / (2 * subjects) * 1e6, 2)}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subjects", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=2, help="runs of each variant, alternating")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from event_store.personal_data import CIPHERS_KEPT, HEADS_KEPT, SubjectKeys

    with tempfile.TemporaryDirectory(prefix="eventlake-key-store-") as folder:
        store = SubjectKeys(Path(folder) / "keys", defer_sync=True)
        started = time.perf_counter()
        tokens = [store.seal(f"cus-{i:07d}", "location", "US-NYC") for i in range(args.subjects)]
        store.sync()
        (Path(folder) / "tokens.txt").write_text("\n".join(tokens))
        print(f"{args.subjects:,} subjects' keys made in {time.perf_counter() - started:.1f}s; bounded caches: "
              f"{CIPHERS_KEPT:,} ciphers, {HEADS_KEPT:,} token heads each way")
        runs: dict[tuple[str, str], list[dict]] = {(role, variant): [] for role in ("seal", "open")
                                                    for variant in ("bounded", "unbounded")}
        for _ in range(args.repeat):
            for (role, variant), found in runs.items():
                proc = subprocess.run([sys.executable, "-c", _ONE, folder, str(args.subjects), variant, role],
                                      cwd=ROOT, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT)})
                if proc.returncode != 0:
                    print(proc.stderr[-3000:], file=sys.stderr)
                    return 1
                found.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    for (role, variant), found in runs.items():
        memory = sorted(r["mib"] for r in found)
        speed = sorted(r["us_per_value"] for r in found)
        print(f"{'sealing' if role == 'seal' else 'opening'} every subject's value twice, caches {variant:9s}: "
              f"+{memory[len(memory) // 2]:6.1f} MiB RssAnon ({memory[len(memory) // 2] * 2 ** 20 / args.subjects:,.0f}"
              f" bytes per subject), {speed[len(speed) // 2]:6.2f} us per value (median of {len(found)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
