"""infra/k8s against the real schemas, offline, and against the project.

Schemas: Kubernetes' own (the OpenAPI definitions of a named version, bundled by ``kubernetes-validate``, strict:
an unknown field is an error, as ``kubectl apply``'s default field validation makes it); Strimzi's CRDs as its
release generates them (``infra/k8s/schemas/strimzi``, see ``infra/k8s_crds.py``), each kind against its
``openAPIV3Schema``; the Spark operator's SparkApplication schema from its published API models
(``kubeflow-spark-api``). The project: versions match pyproject.toml, every service the CLI runs has a manifest,
the settings the apps read are set, and the topics are the ones the code creates.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import re
import tomllib
from functools import cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from event_store import kafka_log
from lakehouse.settings import Settings
from spark_apps import session

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
KUBERNETES_VERSION = "1.33"  # the oldest Kubernetes the manifests are checked against
SETTINGS_CONFIGMAP = "eventlake-settings"


# -- loading ----------------------------------------------------------------------------------------------------
def _documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@cache
def _kustomization() -> dict:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


@cache
def _objects() -> tuple[tuple[str, dict], ...]:
    """(file, object) for every object ``kubectl apply -k infra/k8s`` applies."""
    return tuple((name, doc) for name in _kustomization()["resources"] for doc in _documents(K8S / name))


def _of_kind(kind: str) -> list[dict]:
    return [doc for _, doc in _objects() if doc["kind"] == kind]


def _one(kind: str, name: str) -> dict:
    [found] = [doc for doc in _of_kind(kind) if doc["metadata"]["name"] == name]
    return found


@cache
def _airflow_values() -> dict:
    return yaml.safe_load((K8S / "airflow-values.yaml").read_text())


@cache
def _dockerfile_env() -> dict[str, str]:
    """The Dockerfile's ENV settings (KEY=VALUE pairs of its ENV instructions)."""
    text = (K8S / "Dockerfile").read_text().replace("\\\n", " ")
    env = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(re.findall(r"(\w+)=(\S+)", line))
    return env


@cache
def _pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(dep.split("==", 1) for dep in project["dependencies"])


def _project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


# -- validation against the schemas -----------------------------------------------------------------------------
def _strict(schema):
    """The schema with ``additionalProperties: false`` on every object that lists its properties and allows no
    unknown fields (``x-kubernetes-preserve-unknown-fields``): the API server's strict field validation."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) if k not in ("enum", "default", "example", "examples", "required") else v
           for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@cache
def _crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> its strict openAPIV3Schema, for every served version of the vendored CRDs."""
    from infra.k8s_crds import VENDORED

    schemas = {}
    for path in sorted(VENDORED.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        assert crd["kind"] == "CustomResourceDefinition", path
        for version in crd["spec"]["versions"]:
            if version["served"]:
                api_version = f"{crd['spec']['group']}/{version['name']}"
                schemas[(api_version, crd["spec"]["names"]["kind"])] = _strict(version["schema"]["openAPIV3Schema"])
    return schemas


@cache
def _spark_application_schema() -> dict:
    from kubeflow_spark_api.models import SparkV1beta2SparkApplication

    return _strict(SparkV1beta2SparkApplication.model_json_schema(by_alias=True))


def _messages(errors) -> list[str]:
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
            for e in sorted(errors, key=lambda e: list(map(str, e.absolute_path)))]


def _metadata_errors(doc: dict) -> list[str]:
    """A custom resource's metadata against Kubernetes' ObjectMeta (a CRD's schema leaves it to the API server)."""
    try:
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc.get("metadata")},
                                     KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"metadata: {e.message}"]
    return []


def validation_errors(doc: dict) -> list[str]:
    """Why the API server (with these CRDs and the Spark operator installed) would refuse ``doc``; [] if it
    would not."""
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if (api_version, kind) in _crd_schemas():
        errors = _messages(jsonschema.Draft7Validator(_crd_schemas()[(api_version, kind)]).iter_errors(doc))
        return errors + _metadata_errors(doc)
    if (api_version, kind) == ("sparkoperator.k8s.io/v1beta2", "SparkApplication"):
        from kubeflow_spark_api.models import SparkV1beta2SparkApplication
        from pydantic import ValidationError

        errors = _messages(jsonschema.Draft202012Validator(_spark_application_schema()).iter_errors(doc))
        try:  # the models' own (strict) validation too
            SparkV1beta2SparkApplication.from_dict(doc)
        except ValidationError as e:
            errors += [f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
        return errors + _metadata_errors(doc)
    if api_version and api_version.endswith(("strimzi.io/v1", "sparkoperator.k8s.io/v1beta2")):
        return [f"no schema here for {api_version} {kind}: add its CRD"]
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [e.message]
    return []


@pytest.mark.parametrize("name, index", [(name, i) for name in _kustomization()["resources"]
                                         for i in range(len(_documents(K8S / name)))])
def test_every_manifest_is_valid_against_its_schema(name, index):
    doc = _documents(K8S / name)[index]
    assert validation_errors(doc) == [], f"{name} #{index} ({doc.get('kind')} {doc['metadata'].get('name')})"


def _set(path: str, value):
    """A change of one field: ``path`` is dotted, list indexes as numbers, a key with dots in brackets."""
    keys = [k.strip("[]") for k in re.findall(r"\[[^\]]+\]|[^.]+", path)]

    def change(doc):
        *parents, last = keys
        node = doc
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[last] = value
    return change


@pytest.mark.parametrize("kind, name, change, expected", [
    ("Deployment", "command-handler", _set("spec.replicas", "one"), "spec.replicas"),
    ("Deployment", "command-handler", _set("spec.template.spec.containers.0.envFrom", {"configMapRef": {}}),
     "envFrom"),
    ("Deployment", "fraud-policy", _set("spec.template.spec.containers.0.comand", ["eventlake"]), "comand"),
    ("ConfigMap", SETTINGS_CONFIGMAP, _set("data.EVENTLAKE_TOPIC_PARTITIONS", 3), "EVENTLAKE_TOPIC_PARTITIONS"),
    ("KafkaTopic", "eventlake-events", _set("spec.partitions", "3"), "spec.partitions"),
    ("KafkaTopic", "eventlake-events", _set("spec.retention", -1), "retention"),
    ("KafkaNodePool", "dual-role", _set("spec.roles", ["broker", "zookeeper"]), "spec.roles"),
    ("Kafka", "eventlake", _set("spec.kafka.replicas", 3), "replicas"),  # gone with node pools
    ("Kafka", "eventlake", _set("spec.kafka.listeners.0.type", "external"), "spec.kafka.listeners.0.type"),
    ("SparkApplication", "projection", _set("spec.driver.cores", "1"), "spec.driver.cores"),
    ("SparkApplication", "projection", _set("spec.executor.instance", 2), "instance"),
    ("SparkApplication", "projection", _set("spec.sparkConf.[spark.ui.enabled]", False), "spark.ui.enabled"),
    ("SparkApplication", "telemetry-detector", _set("metadata.labels", {"app": 1}), "metadata"),
])
def test_a_broken_manifest_is_refused(kind, name, change, expected):
    doc = copy.deepcopy(_one(kind, name))
    assert validation_errors(doc) == []
    change(doc)
    errors = validation_errors(doc)
    assert errors and any(expected in e for e in errors), errors


def test_kustomization_names_every_manifest_and_nothing_else():
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "kustomizeconfig.yaml",
                                                        "airflow-values.yaml"}
    assert set(_kustomization()["resources"]) == manifests
    assert _kustomization()["namespace"] == _one("Namespace", "eventlake")["metadata"]["name"]


# -- versions ---------------------------------------------------------------------------------------------------
def _coordinates(package: str) -> tuple[str, str, str]:
    group, artifact, version = package.split(":")
    return group, artifact, version


def test_spark_packages_match_pyproject():
    pyspark, delta = _pins()["pyspark"], _pins()["delta-spark"]
    spark_minor = ".".join(pyspark.split(".")[:2])
    by_artifact = {artifact: (group, version) for group, artifact, version in map(_coordinates,
                                                                                    session.SPARK_PACKAGES)}
    assert by_artifact[f"delta-spark_{spark_minor}_2.13"] == ("io.delta", delta)
    assert by_artifact["spark-sql-kafka-0-10_2.13"] == ("org.apache.spark", pyspark)


def _jars(app: dict) -> list[str]:
    return app["spec"]["deps"]["jars"]


def test_spark_applications_run_the_pinned_spark_with_the_packages_from_the_image():
    cache_dir = Path(_one("ConfigMap", SETTINGS_CONFIGMAP)["data"]["EVENTLAKE_CACHE_DIR"])
    assert _dockerfile_env()["EVENTLAKE_CACHE_DIR"] == str(cache_dir)
    group, artifact, version = session.TOKEN_PROVIDER
    wanted = [f"local://{cache_dir}/ivy/jars/{g}_{a}-{v}.jar" for g, a, v in map(_coordinates,
                                                                                 session.SPARK_PACKAGES)]
    wanted.append(f"local://{cache_dir}/spark-jars/{artifact}-{version}.jar")
    apps = _of_kind("SparkApplication")
    assert apps
    for app in apps:
        spec = app["spec"]
        assert spec["sparkVersion"] == _pins()["pyspark"], app["metadata"]["name"]
        assert spec["type"] == "Python" and spec["mode"] == "cluster"
        assert set(wanted) <= set(_jars(app)), app["metadata"]["name"]
        assert _jars(app) == _jars(apps[0]), "every app gets the same jars"
        assert all(j.startswith(f"local://{cache_dir}/") for j in _jars(app)), "files of the image, not downloads"
        for role in ("driver", "executor"):
            assert session.JVM_OPTIONS in spec["sparkConf"][f"spark.{role}.extraJavaOptions"]
    # No other version of a package is listed beside the pinned one (a stale jar).
    names = [re.sub(r"-[0-9][^/]*\.jar$", "", j.rsplit("/", 1)[1]) for j in _jars(apps[0])]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_every_image_is_the_projects_and_the_dockerfile_builds_it_from_the_pins():
    image = f"eventlake:{_project_version()}"
    for deployment in _of_kind("Deployment"):
        assert {c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]} == {image}
    for app in _of_kind("SparkApplication"):
        assert app["spec"]["image"] == image
    # kustomize's images: renames this image in both kinds (its configuration names the SparkApplication's field).
    [kustomized] = _kustomization()["images"]
    assert f"{kustomized['name']}:{kustomized['newTag']}" == image
    config = yaml.safe_load((K8S / _kustomization()["configurations"][0]).read_text())
    assert {"path": "spec/image", "kind": "SparkApplication"} in config["images"]
    values = _airflow_values()
    assert f"{values['images']['airflow']['repository']}:{values['images']['airflow']['tag']}" == image
    assert f"{values['defaultAirflowRepository']}:{values['defaultAirflowTag']}" == image
    assert values["airflowVersion"] == _pins()["apache-airflow"]

    dockerfile = (K8S / "Dockerfile").read_text()
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    python = re.search(r"^FROM python:(\d+\.\d+)", dockerfile, re.M).group(1)
    assert f">={python}" in requires, (python, requires)
    assert "openjdk-17-jre-headless" in dockerfile  # Spark 4's JVM
    assert "-c constraints.txt -e '.[k8s]'" in dockerfile and "eventlake setup" in dockerfile
    constraints = {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in (
        line.split("==", 1) for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line)}
    assert constraints["pyspark"] == _pins()["pyspark"] and constraints["delta-spark"] == _pins()["delta-spark"]
    # The image's extra (Airflow's executor and metadata database for the chart) is pinned like the rest.
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["k8s"]
    for requirement in extra:
        name, version = requirement.split("==")
        assert constraints[re.sub(r"[-_.]+", "-", name).lower()] == version, requirement
    assert _airflow_values()["executor"] == "KubernetesExecutor"
    assert any("cncf-kubernetes" in r for r in extra) and any("postgres" in r for r in extra)


# -- every service the CLI runs ---------------------------------------------------------------------------------
def _cli_services() -> dict[str, object]:
    """The CLI's long-running services: the subcommands that run until stopped unless ``--until-caught-up``."""
    from eventlake.cli import build_parser

    parser = build_parser()
    [subparsers] = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return {name: sub.get_default("run") for name, sub in subparsers.choices.items()
            if any("--until-caught-up" in a.option_strings for a in sub._actions)}


def _default_engine(command: str) -> str | None:
    """The default of the subcommand's ``--engine`` option (None: it has none)."""
    from eventlake.cli import build_parser

    [subparsers] = [a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction"]
    return next((a.default for a in subparsers.choices[command]._actions if a.dest == "engine"), None)


def _spark_entry_points() -> set[str]:
    """The long-running spark-submit targets: modules of spark_apps/ that run as a script and as a service (an
    ``--until-caught-up`` option or ``run_service``). One-shot jobs (the rebuild) have no standing manifest: they
    are submitted when needed, ``eventlake spark-submit rebuild --master k8s://... --deploy-mode cluster``."""
    return {p.name for p in (ROOT / "spark_apps").glob("*.py")
            if re.search(r'^if __name__ == "__main__":', p.read_text(), re.M)
            and ("--until-caught-up" in p.read_text() or "run_service(" in p.read_text())}


def test_every_service_the_cli_runs_has_a_manifest():
    import importlib
    import inspect

    services = _cli_services()
    assert {"handler", "policy", "project", "detect-fraud"} <= set(services)  # the CLI as this test knows it
    app_files = {app["spec"]["mainApplicationFile"].rsplit("/", 1)[1]: app for app in _of_kind("SparkApplication")}
    deployed = {tuple(c["args"][:2]) for d in _of_kind("Deployment") for c in d["spec"]["template"]["spec"]
                ["containers"]}
    spark_engines = set()  # Spark apps a service runs only when asked (--engine spark): spark-submit them
    for command, run in services.items():
        # The function the verb runs (a domain's verb names its own: event_store.verbs.Verb.run), and the Spark
        # app it imports or asks the CLI to run.
        target = run
        if getattr(run, "verb", None) is not None:
            module, _, function = run.verb.run.partition(":")
            target = getattr(importlib.import_module(module), function)
        found = re.search(r'from spark_apps(?:\.| import )(\w+)|run_spark_detector\("(\w+)"', inspect.getsource(target))
        spark_app = found and re.match(r"(\w+)", found.group(1) or found.group(2))  # .group(1): the app
        if spark_app and _default_engine(command) != "python":
            assert f"{spark_app.group(1)}.py" in app_files, f"`eventlake {command}` has no SparkApplication"
        else:
            assert ("eventlake", command) in deployed, f"`eventlake {command}` has no Deployment"
            assert not spark_app or f"{spark_app.group(1)}.py" not in app_files, f"`eventlake {command}` runs twice"
            if spark_app:
                spark_engines.add(f"{spark_app.group(1)}.py")
    assert "fraud_detector.py" in spark_engines  # the CLI as this test knows it
    # ... and every other spark-submit target of spark_apps/ is a SparkApplication, from the image's copy of the code.
    assert set(app_files) == _spark_entry_points() - spark_engines
    for module, app in app_files.items():
        assert app["spec"]["mainApplicationFile"] == f"local:///opt/eventlake/spark_apps/{module}"
    assert "COPY spark_apps ./spark_apps" in (K8S / "Dockerfile").read_text()
    assert re.search(r"^WORKDIR /opt/eventlake$", (K8S / "Dockerfile").read_text(), re.M)


# -- settings ---------------------------------------------------------------------------------------------------
def _settings_data() -> dict[str, str]:
    return _one("ConfigMap", SETTINGS_CONFIGMAP)["data"]


def _field_read_from(variable: str) -> str | None:
    """The Settings field that ``Settings.load`` fills from this environment variable (None: none)."""
    # The local cluster's size and security mode are read from under EVENTLAKE_HOME unless set (once `eventlake
    # kafka up` or the demo ran in this checkout): set them, so a probe of the home changes only the home.
    pinned = {"EVENTLAKE_KAFKA_BROKERS": "1", "EVENTLAKE_KAFKA_SECURITY": "none"}
    base = {k: v for k, v in pinned.items() if k != variable}
    default = Settings.load(base)
    for probe in ("7", "8"):
        loaded = Settings.load({**base, variable: probe})
        changed = [f for f in dataclasses.fields(Settings) if getattr(loaded, f.name) != getattr(default, f.name)]
        if changed:
            [field] = changed
            return field.name
    return None


def test_every_setting_in_the_configmap_is_one_the_apps_read_and_the_needed_ones_are_set():
    fields = {variable: _field_read_from(variable) for variable in _settings_data()}
    assert None not in fields.values(), f"not a setting: {[v for v, f in fields.items() if f is None]}"
    # Needed in a cluster: the broker (unset = start a local one), every location (defaults lie in the checkout;
    # an optional one, such as the SASL credentials file, is derived from them) and what the topics are made of
    # (they must agree with topics.yaml).
    needed = {f.name for f in dataclasses.fields(Settings)
              if f.name == "kafka_bootstrap_servers" or f.name.startswith("topic_")
              or ("Path" in str(f.type) and "None" not in str(f.type))}
    assert needed <= set(fields.values()), f"not set: {sorted(needed - set(fields.values()))}"
    Settings.load(_settings_data())  # every value is one the settings take


def _pod_specs() -> list[tuple[str, dict]]:
    """(what, container or Spark pod spec) for every eventlake container."""
    pods = [(d["metadata"]["name"], c) for d in _of_kind("Deployment") for c in d["spec"]["template"]["spec"]
            ["containers"]]
    pods += [(f"{a['metadata']['name']} {role}", a["spec"][role]) for a in _of_kind("SparkApplication")
             for role in ("driver", "executor")]
    return pods


def test_every_process_gets_the_settings_and_the_tables_where_the_settings_say():
    home = _settings_data()["EVENTLAKE_HOME"]
    for what, pod in _pod_specs():
        assert {"configMapRef": {"name": SETTINGS_CONFIGMAP}} in pod["envFrom"], what
    for app in _of_kind("SparkApplication"):
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in app["spec"]["volumes"]}
        for role in ("driver", "executor"):
            mounts = {m["mountPath"]: claims[m["name"]] for m in app["spec"][role]["volumeMounts"]}
            assert mounts.get(home) == "eventlake-home", (app["metadata"]["name"], role)
        assert app["spec"]["driver"]["serviceAccount"] == _one("ServiceAccount", "eventlake-spark")["metadata"]["name"]
    claim = _one("PersistentVolumeClaim", "eventlake-home")
    assert "ReadWriteMany" in claim["spec"]["accessModes"]  # every driver, executor and worker mounts it
    values = _airflow_values()
    assert yaml.safe_load(values["extraEnvFrom"]) == [{"configMapRef": {"name": SETTINGS_CONFIGMAP}}]
    assert {m["mountPath"] for m in values["workers"]["extraVolumeMounts"]} == {home}


def test_the_airflow_values_hold_valid_kubernetes_objects_and_the_images_dags():
    """The chart's values.schema.json is not available offline here; the Kubernetes objects the values hand to
    the chart's pods are checked against Kubernetes' schema in a pod of the worker's shape."""
    values = _airflow_values()
    workers = values["workers"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "airflow-worker"},
           "spec": {"volumes": workers["extraVolumes"],
                    "containers": [{"name": "worker", "image": values["images"]["airflow"]["repository"],
                                    "envFrom": yaml.safe_load(values["extraEnvFrom"]),
                                    "volumeMounts": workers["extraVolumeMounts"],
                                    "resources": workers["resources"]}]}}
    assert validation_errors(pod) == []
    assert values["executor"] in ("KubernetesExecutor", "CeleryExecutor", "LocalExecutor",
                                  "CeleryKubernetesExecutor")
    dags_folder = values["config"]["core"]["dags_folder"]
    assert dags_folder == _dockerfile_env()["AIRFLOW__CORE__DAGS_FOLDER"]
    assert "COPY dags ./dags" in (K8S / "Dockerfile").read_text() and dags_folder == "/opt/eventlake/dags"
    assert not values["dags"]["gitSync"]["enabled"] and not values["dags"]["persistence"]["enabled"]


# -- Kafka ------------------------------------------------------------------------------------------------------
def test_topics_are_the_ones_the_code_creates_with_its_configuration():
    settings = Settings.load(_settings_data())
    wanted = kafka_log.topic_configs(settings)
    topics = {t["spec"]["topicName"]: t for t in _of_kind("KafkaTopic")}
    assert set(topics) == set(wanted)
    assert {settings.commands_topic, settings.events_topic, settings.results_topic, settings.dead_letters_topic,
            settings.snapshots_topic, settings.keys_topic} == set(topics)
    for name, topic in topics.items():
        spec = topic["spec"]
        assert spec["partitions"] == kafka_log.topic_partitions(settings, name), name
        assert spec["replicas"] == settings.replication_factor == 3, name
        assert {k: str(v) for k, v in spec["config"].items()} == wanted[name], name
        assert topic["metadata"]["labels"]["strimzi.io/cluster"] == _one("Kafka", "eventlake")["metadata"]["name"]
    events = topics[settings.events_topic]["spec"]["config"]
    assert events["retention.ms"] == -1 and events["min.insync.replicas"] == 2


def test_the_kafka_cluster_is_the_one_the_settings_name_and_survives_one_node():
    kafka = _one("Kafka", "eventlake")
    [plain] = [listener for listener in kafka["spec"]["kafka"]["listeners"] if not listener["tls"]]
    assert _settings_data()["KAFKA_BOOTSTRAP_SERVERS"] == f"{kafka['metadata']['name']}-kafka-bootstrap:{plain['port']}"
    pools = [p for p in _of_kind("KafkaNodePool") if p["metadata"]["labels"]["strimzi.io/cluster"] == "eventlake"]
    brokers = sum(p["spec"]["replicas"] for p in pools if "broker" in p["spec"]["roles"])
    controllers = sum(p["spec"]["replicas"] for p in pools if "controller" in p["spec"]["roles"])
    assert brokers >= 3 and controllers >= 3
    config = kafka["spec"]["kafka"]["config"]
    assert config["min.insync.replicas"] == 2 and config["default.replication.factor"] == 3
    assert config["transaction.state.log.replication.factor"] == 3  # the handler's transactions
    assert "topicOperator" in kafka["spec"]["entityOperator"]  # it makes the KafkaTopics into topics


# -- the schemas' sources ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_vendored_strimzi_crds_are_what_strimzis_generator_makes(tmp_path):
    from infra import k8s_crds

    if k8s_crds.find_java() is None:
        pytest.skip("Strimzi's CRD generator needs Java 21+ (none found: set JAVA_HOME)")
    written = k8s_crds.generate(tmp_path, Settings.load().cache_dir / "k8s", log=lambda _: None)
    for path in written:
        assert path.read_text() == (k8s_crds.VENDORED / path.name).read_text(), (
            f"{path.name} differs from Strimzi {k8s_crds.strimzi_version()}'s: run python -m infra.k8s_crds")


@pytest.mark.slow
def test_spark_applications_list_exactly_the_jars_the_projects_resolution_gives(spark):
    """deps.jars are the files `eventlake setup` resolved into the image: the same set that the session's own
    resolution of SPARK_PACKAGES (and its token provider) puts on the driver's class path."""
    local_jars = spark.sparkContext.getConf().get("spark.repl.local.jars")
    resolved = {j.rsplit("/", 1)[1] for j in local_jars.split(",") if j}
    listed = {j.rsplit("/", 1)[1] for j in _jars(_of_kind("SparkApplication")[0])}
    assert listed == resolved


# -- the image's entrypoint -------------------------------------------------------------------------------------
def _entrypoint(tmp_path: Path, args: list[str], env: dict[str, str]) -> list[str]:
    """The command entrypoint.sh would exec under tini, for these arguments and this environment."""
    import subprocess

    script = (K8S / "entrypoint.sh").read_text()
    assert script.count("exec /usr/bin/tini -s -g -- ") == 1
    probe = tmp_path / "entrypoint.sh"
    probe.write_text(script.replace("exec /usr/bin/tini -s -g -- ", "printf '%s\\n' "))
    out = subprocess.run(["bash", str(probe), *args], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True,
                         text=True, check=True, cwd=tmp_path)
    return out.stdout.splitlines()


def test_the_entrypoint_starts_spark_pods_as_spark_on_kubernetes_does_and_runs_anything_else(tmp_path):
    spark_home = _dockerfile_env()["SPARK_HOME"]
    driver = _entrypoint(tmp_path, ["driver", "--properties-file", "/opt/spark/conf/spark.properties",
                                    "local:///opt/eventlake/spark_apps/projection.py"],
                         {"SPARK_HOME": spark_home, "SPARK_DRIVER_BIND_ADDRESS": "10.0.0.2"})
    assert driver[0] == f"{spark_home}/bin/spark-submit"
    assert driver[driver.index("--deploy-mode") + 1] == "client"
    assert "spark.driver.bindAddress=10.0.0.2" in driver and driver[-1].endswith("projection.py")
    executor_env = {"SPARK_HOME": spark_home, "JAVA_HOME": "/opt/java", "SPARK_EXECUTOR_MEMORY": "2g",
                    "SPARK_JAVA_OPT_0": "-XX:-DontCompileHugeMethods", "SPARK_DRIVER_URL": "spark://d:7078",
                    "SPARK_EXECUTOR_ID": "1", "SPARK_EXECUTOR_CORES": "1", "SPARK_APPLICATION_ID": "spark-1",
                    "SPARK_EXECUTOR_POD_IP": "10.0.0.3", "SPARK_RESOURCE_PROFILE_ID": "0",
                    "SPARK_EXECUTOR_POD_NAME": "projection-exec-1"}
    executor = _entrypoint(tmp_path, ["executor"], executor_env)
    assert executor[0] == "/opt/java/bin/java" and "-XX:-DontCompileHugeMethods" in executor
    assert "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend" in executor
    assert f"{spark_home}/jars/*" in executor[executor.index("-cp") + 1].split(":")
    assert _entrypoint(tmp_path, ["bash", "-c", "exec airflow scheduler"], {}) == ["bash", "-c",
                                                                                 "exec airflow scheduler"]
    assert _entrypoint(tmp_path, ["eventlake", "handler", "--instance-id", "0"], {})[:2] == ["eventlake", "handler"]


@pytest.mark.slow
def test_what_kustomize_renders_is_valid_in_the_namespace_with_the_image_it_is_told(tmp_path):
    """``kubectl apply -k`` applies kustomize's rendering, not the files: render it (a copy of infra/k8s whose image
    is renamed as docs/deployment.md says) and check every object again. Needs the kustomize binary (skipped without)."""
    import shutil
    import subprocess

    kustomize = shutil.which("kustomize")
    if kustomize is None:
        pytest.skip("kustomize is not on the PATH")
    work = tmp_path / "k8s"
    shutil.copytree(K8S, work, ignore=shutil.ignore_patterns("schemas"))
    subprocess.run([kustomize, "edit", "set", "image", "eventlake=registry.example.com/eventlake:9.9.9"], cwd=work,
                   check=True, capture_output=True)
    rendered = subprocess.run([kustomize, "build", str(work)], check=True, capture_output=True, text=True).stdout
    objects = [d for d in yaml.safe_load_all(rendered) if d]
    assert len(objects) == len(_objects())
    for doc in objects:
        assert validation_errors(doc) == [], (doc["kind"], doc["metadata"]["name"])
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "eventlake", (doc["kind"], doc["metadata"]["name"])
    images = {c["image"] for d in objects if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]
              ["containers"]}
    images |= {d["spec"]["image"] for d in objects if d["kind"] == "SparkApplication"}
    assert images == {"registry.example.com/eventlake:9.9.9"}


def test_the_services_that_serve_metrics_listen_beyond_the_pod_on_the_port_their_annotations_name():
    """The handler, the fraud policy, the fraud detector, the lag exporter and the projection's and telemetry
    detector's drivers serve /metrics (docs/metrics.md): on loopback, Prometheus in another pod could not scrape them; the port their pods'
    prometheus.io annotations and container ports name is the one the settings give."""
    settings = Settings.load(_settings_data())
    assert settings.metrics == "on" and settings.metrics_host == "0.0.0.0" and settings.metrics_port > 0
    pods = {name: _one("Deployment", name)["spec"]["template"]
            for name in ("command-handler", "fraud-policy", "fraud-detector", "lag-exporter")}
    drivers = {name: _one("SparkApplication", name)["spec"]["driver"] for name in ("projection", "telemetry-detector")}
    for what, pod_annotations, container in (
            *((name, pod["metadata"]["annotations"], pod["spec"]["containers"][0]) for name, pod in pods.items()),
            *((f"{name} driver", driver["annotations"], driver) for name, driver in drivers.items())):
        assert pod_annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": str(settings.metrics_port),
                               "prometheus.io/path": "/metrics"}, what
        assert {"name": "metrics", "containerPort": settings.metrics_port} in [
            {k: v for k, v in p.items() if k != "protocol"} for p in container["ports"]], what
    # Spark's own metrics: the drivers' UI, on the port the settings give, which their spark-ui port names
    # (infra/prometheus/kubernetes.yml scrapes it; tests/integration/test_prometheus.py runs that configuration).
    assert settings.spark_metrics == "on"
    for name, driver in drivers.items():
        assert {"name": "spark-ui", "containerPort": settings.spark_ui_port} in [
            {k: v for k, v in p.items() if k != "protocol"} for p in driver["ports"]], name
        assert "spark.ui.enabled" not in _one("SparkApplication", name)["spec"]["sparkConf"], name


def test_the_alert_rules_and_the_dashboard_are_mounted_as_written():
    """monitoring.yaml holds infra/prometheus/alerts.yml and infra/grafana's dashboard as they are (kustomize loads
    no file outside infra/k8s: infra/k8s_monitoring.py writes it from them)."""
    from infra import k8s_monitoring

    assert k8s_monitoring.MANIFEST.read_text() == k8s_monitoring.manifest(), (
        "infra/k8s/monitoring.yaml is not what the rules and the dashboard make now: "
        "run `.venv/bin/python -m infra.k8s_monitoring`")
    rules = _one("ConfigMap", "eventlake-alert-rules")["data"]["eventlake-alerts.yml"]
    assert yaml.safe_load(rules) == yaml.safe_load(k8s_monitoring.RULES.read_text())
    scrape = _one("ConfigMap", "eventlake-prometheus-config")["data"]["prometheus.yml"]
    assert yaml.safe_load(scrape) == yaml.safe_load(k8s_monitoring.SCRAPE_CONFIG.read_text())
    dashboard = _one("ConfigMap", "eventlake-grafana-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["eventlake-dashboard.json"])["uid"] == "eventlake"
