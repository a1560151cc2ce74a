"""The Python engine is a package of its own beside spark_apps: loading it loads no pyspark (the Spark engine is
started for a hand-over only), and each of its modules keeps to one job (~500 lines at most)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_loading_the_python_engine_loads_no_pyspark():
    modules = sorted(f"python_engine.{p.stem}" for p in (ROOT / "python_engine").glob("*.py") if p.stem != "__init__")
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'delta', 'py4j')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_each_module_of_the_engine_and_the_core_keeps_to_one_job():
    for package in ("python_engine", "projection_core"):
        for path in sorted((ROOT / package).glob("*.py")):
            lines = len(path.read_text().splitlines())
            assert lines <= 500, f"{path.relative_to(ROOT)}: {lines} lines; split it by job"
