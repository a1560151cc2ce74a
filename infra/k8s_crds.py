"""Strimzi's CustomResourceDefinitions, made the way Strimzi's release makes them, for validating infra/k8s.

Strimzi publishes no CRD files on Maven Central: its release build generates ``packaging/install/cluster-operator/
04*-Crd-*.yaml`` from its API classes (``io.strimzi:api``) with its ``CrdGenerator`` (``io.strimzi:crd-generator``).
``generate`` resolves both artifacts (``infra/k8s/schemas/pom.xml``) and runs that generator with the release
build's arguments. The CRDs the manifests use are kept in ``infra/k8s/schemas/strimzi/`` (so validating needs
neither Maven nor Java); ``python -m infra.k8s_crds`` writes them again, and a test checks they are still what the
generator makes. The generator needs Java 21 or later (it is compiled for it).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from lakehouse.errors import Unavailable

__all__ = ["CRDS", "POM", "VENDORED", "K8sCrdError", "strimzi_version", "find_java", "generate"]

K8S = Path(__file__).resolve().parent / "k8s"
POM = K8S / "schemas" / "pom.xml"
VENDORED = K8S / "schemas" / "strimzi"
# kind -> (the API class, the file name in Strimzi's packaging/install/cluster-operator)
CRDS = {
    "Kafka": ("io.strimzi.api.kafka.model.kafka.Kafka", "040-Crd-kafka.yaml"),
    "KafkaTopic": ("io.strimzi.api.kafka.model.topic.KafkaTopic", "043-Crd-kafkatopic.yaml"),
    "KafkaNodePool": ("io.strimzi.api.kafka.model.nodepool.KafkaNodePool", "045-Crd-kafkanodepool.yaml"),
}
# The arguments of the generate-crd-co-install-v1 step of io.strimzi:api's pom.xml.
GENERATOR_ARGS = ["--label", "app:strimzi", "--label", "strimzi.io/crd-install:true", "--target-kube", "1.16+",
                  "--crd-api-version", "v1", "--api-versions", "v1", "--storage-version", "v1", "--yaml"]


class K8sCrdError(Unavailable, RuntimeError):
    """The CRDs could not be generated (no Maven, no Java 21+, or the generator failed)."""


def strimzi_version() -> str:
    match = re.search(r"<strimzi.version>([^<]+)</strimzi.version>", POM.read_text())
    if not match:
        raise K8sCrdError(f"{POM}: no <strimzi.version>")
    return match.group(1)


def _java_major(java: str) -> int:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except OSError:
        return 0
    match = re.search(r'version "(\d+)', out)
    return int(match.group(1)) if match else 0


def find_java(minimum: int = 21) -> str | None:
    """A ``java`` of at least this major version: $JAVA_HOME's, the PATH's, or one under /usr/lib/jvm."""
    candidates = [os.path.join(os.environ["JAVA_HOME"], "bin", "java")] if os.environ.get("JAVA_HOME") else []
    candidates += [j for j in [shutil.which("java")] if j]
    candidates += sorted(str(p) for p in Path("/usr/lib/jvm").glob("*/bin/java"))
    for java in candidates:
        if os.path.exists(java) and _java_major(java) >= minimum:
            return java
    return None


def generate(out_dir: Path, cache_dir: Path, log=print) -> list[Path]:
    """Write the CRDs of ``CRDS`` into ``out_dir`` with Strimzi's generator (its jars cached under ``cache_dir``)."""
    version = strimzi_version()
    lib = cache_dir / f"strimzi-{version}"
    if not (lib / f"crd-generator-{version}.jar").exists():
        if shutil.which("mvn") is None:
            raise K8sCrdError("Maven (mvn) is needed once to fetch io.strimzi:api and io.strimzi:crd-generator")
        log(f"k8s: fetching Strimzi {version}'s API and CRD generator into {lib} (once) ...")
        cmd = ["mvn", "-q", "-B", "-f", str(POM), "dependency:copy-dependencies", "-DincludeScope=runtime",
               f"-DoutputDirectory={lib}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise K8sCrdError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    java = find_java()
    if java is None:
        raise K8sCrdError("Strimzi's CRD generator needs Java 21 or later (set JAVA_HOME to one)")
    out_dir.mkdir(parents=True, exist_ok=True)
    targets = [out_dir / name for _, name in CRDS.values()]
    cmd = [java, "-cp", f"{lib}{os.sep}*", "io.strimzi.crdgenerator.CrdGenerator", *GENERATOR_ARGS,
           *(f"{cls}={out_dir / name}" for cls, name in CRDS.values())]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not all(t.exists() for t in targets):
        raise K8sCrdError(f"Strimzi's CrdGenerator failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return targets


if __name__ == "__main__":
    from lakehouse.settings import Settings

    written = generate(VENDORED, Settings.load().cache_dir / "k8s")
    print(f"k8s: Strimzi {strimzi_version()} CRDs written: {', '.join(str(p) for p in written)}")
    sys.exit(0)
