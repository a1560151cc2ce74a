"""Jars from Maven Central for the components eventlake starts itself (the Kafka broker, Hadoop's mini cluster):
a project's ``pom.xml`` resolved once with ``mvn dependency:copy-dependencies`` into a folder of the cache."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["copy_dependencies"]


def copy_dependencies(pom: Path, target: Path, what: str, error: type[Exception], prefix: str, log=print) -> Path:
    """The runtime jars of ``pom`` in ``target`` (a no-op while its marker says they came from this very pom).
    ``what`` names them in messages (``"Apache Kafka's jars"``); a failure raises ``error`` with Maven's output."""
    marker = target / ".complete"
    if marker.exists() and marker.read_text() == pom.read_text():
        return target
    if shutil.which("mvn") is None:
        raise error(f"Maven (mvn) is needed once to fetch {what}; install it (apt-get install maven)")
    log(f"{prefix}: resolving {what} from Maven Central into {target} (once) ...")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    cmd = ["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", f"-DoutputDirectory={target}",
           "-DincludeScope=runtime"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        raise error(f"resolving {what} failed ({' '.join(cmd)}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    marker.write_text(pom.read_text())
    log(f"{prefix}: {len(list(target.glob('*.jar')))} jars in {target}")
    return target
