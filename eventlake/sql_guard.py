"""The SQL guard's jar: ``infra/sql_guard``'s Java sources (the read-only check rule, the grants' rule, the login
check and the query log) compiled with the JDK's ``javac`` against pyspark's jars, cached under ``.cache/sql-guard``.
Used by the Thrift server (``eventlake.sql_server``) and by ``eventlake query --engine spark``
(``eventlake.read_only``), so neither imports the other."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from lakehouse.settings import PROJECT_ROOT, Settings
from lakehouse.errors import Unavailable

__all__ = ["GuardBuildError", "guard_jar", "GUARD_SOURCES", "GUARD_CLASS"]

GUARD_SOURCES = PROJECT_ROOT / "infra" / "sql_guard" / "src" / "eventlake" / "sql"
GUARD_CLASS = "eventlake.sql.ReadOnlyExtension"


class GuardBuildError(Unavailable, RuntimeError):
    """The guard's jar could not be built (no JDK, or its sources did not compile); the message says why."""


def guard_jar(settings: Settings, log=print) -> Path:
    """The read-only check rule, the grants' rule, the login check and the query log as a jar, compiled from
    every ``.java`` of ``infra/sql_guard`` against pyspark's jars (once per version of those sources; a few
    seconds)."""
    sources = sorted(GUARD_SOURCES.glob("*.java"))
    hashed = hashlib.sha1()
    for source in sources:
        hashed.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    digest = hashed.hexdigest()[:12]
    jar = settings.cache_dir / "sql-guard" / f"eventlake-sql-guard-{digest}.jar"
    if jar.exists():
        return jar
    javac, jar_tool = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar_tool is None:
        raise GuardBuildError("the SQL server's read-only guard is compiled with the JDK's javac and jar, which are "
                             "not on PATH; install a JDK 17 (apt-get install openjdk-17-jdk-headless)")
    import pyspark

    spark_jars = Path(pyspark.__file__).parent / "jars"
    build = jar.parent / f"build-{digest}"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    log(f"sql-server: compiling the read-only guard ({GUARD_SOURCES.relative_to(PROJECT_ROOT)}) into {jar} (once)")
    compiled = subprocess.run([javac, "-nowarn", "-d", str(build), "-cp", f"{spark_jars}/*", *map(str, sources)],
                              capture_output=True, text=True)
    if compiled.returncode != 0:
        raise GuardBuildError(f"compiling {GUARD_SOURCES} failed:\n{compiled.stdout[-3000:]}{compiled.stderr[-3000:]}")
    packed = subprocess.run([jar_tool, "cf", str(jar.with_suffix(".tmp")), "-C", str(build), "."],
                            capture_output=True, text=True)
    if packed.returncode != 0:
        raise GuardBuildError(f"packing {jar} failed:\n{packed.stderr[-3000:]}")
    jar.with_suffix(".tmp").rename(jar)
    shutil.rmtree(build, ignore_errors=True)
    return jar
