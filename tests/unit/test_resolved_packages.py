"""The jars Ivy resolved the Spark packages to, reused by later sessions on a local master
(spark_apps.session.resolved_packages): only while they are the current packages' and all still there."""
import json

from spark_apps.session import RESOLVED_FILE, SPARK_PACKAGE_EXCLUDES, SPARK_PACKAGES, resolved_packages


def record(ivy, packages=SPARK_PACKAGES, names=("delta.jar", "kafka.jar")):
    (ivy / "jars").mkdir(parents=True, exist_ok=True)
    (ivy / RESOLVED_FILE).write_text(json.dumps({"packages": list(packages), "excludes": list(SPARK_PACKAGE_EXCLUDES),
                                                 "jars": list(names)}))


def test_the_recorded_jars_are_used_while_they_are_the_packages_and_all_there(tmp_path):
    ivy = tmp_path / "ivy"
    assert resolved_packages(ivy) is None  # nothing recorded: Ivy resolves
    record(ivy)
    assert resolved_packages(ivy) is None  # a jar is gone from the cache
    for name in ("delta.jar", "kafka.jar"):
        (ivy / "jars" / name).write_bytes(b"PK")
    assert resolved_packages(ivy) == [ivy / "jars" / "delta.jar", ivy / "jars" / "kafka.jar"]
    record(ivy, packages=("io.delta:delta-spark_4.2_2.13:4.3.0", *SPARK_PACKAGES[1:]))
    assert resolved_packages(ivy) is None  # recorded for other packages: an upgrade resolves again
    (ivy / RESOLVED_FILE).write_text("{not json")
    assert resolved_packages(ivy) is None
