"""The write side's import layering (docs/DESIGN.md, "Layers" and "Module map"), read from the source with ``ast``.

Imports inside functions count too: the ``envelope`` <-> ``schemas`` cycle this guards against was one.
Domains live in subpackages of ``event_store`` (``event_store/account/``); the framework (every other module)
knows them only through the registry, ``event_store.domains`` (docs/DESIGN.md, "Adding a domain").
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "event_store"
# What event_store may import from the rest of the repository: only the bottom layer.
ALLOWED_OUTSIDE = {"eventlake.settings", "eventlake.tables"}
# Top-level folders of the repository: importing any of them from event_store is a layering question.
REPO_PACKAGES = {"eventlake", "read_models", "spark_apps", "dags", "expectations", "infra", "bench", "tests"}
# The pure core: no Kafka, no Spark, no Delta, no Airflow.
PURE = {"errors", "fields", "domain", "domains", "schemas", "upcasting", "envelope", "decider", "snapshots",
        "account", "account.aggregate", "account.schemas", "account.upcasters", "account.fraud_rules",
        "iot", "iot.aggregate", "iot.schemas", "iot.telemetry_rules",
        "site", "site.aggregate", "site.schemas"}
# The one framework module that may import domain packages.
REGISTRY = f"{PACKAGE}.domains"
IO_PACKAGES = {"kafka", "confluent_kafka", "pyspark", "delta", "deltalake", "airflow"}


def _modules() -> dict[str, Path]:
    """Every module of the package, subpackages included, by dotted name."""
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _domain_packages() -> set[str]:
    """The domain subpackages: every package directly below event_store."""
    return {f"{PACKAGE}.{path.parent.name}" for path in (ROOT / PACKAGE).glob("*/__init__.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module ``path`` imports, anywhere in it; ``from pkg import mod`` names ``pkg.mod`` when that is a
    module of the package."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (use absolute imports)"
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
    return found


MODULES = _modules()
IMPORTS = {name: _imports(path, MODULES) for name, path in MODULES.items()}
DOMAIN_PACKAGES = _domain_packages()


def _in_domain(module: str) -> bool:
    return any(module == d or module.startswith(d + ".") for d in DOMAIN_PACKAGES)


FRAMEWORK = sorted(m for m in MODULES if not _in_domain(m) and m != REGISTRY)


def test_domains_are_found():
    assert f"{PACKAGE}.account" in DOMAIN_PACKAGES and f"{PACKAGE}.account.aggregate" in MODULES
    assert f"{PACKAGE}.decider" in FRAMEWORK and f"{PACKAGE}.account" not in FRAMEWORK


@pytest.mark.parametrize("module", FRAMEWORK)
def test_the_framework_imports_no_domain_package(module):
    domain = sorted(m for m in IMPORTS[module] if _in_domain(m))
    assert not domain, (f"{module} imports {domain}: the framework knows domains only through the registry "
                        f"({REGISTRY}); ask it (DOMAINS, COMMAND_TYPES, EVENT_TYPES) instead (docs/DESIGN.md, "
                        f"'Adding a domain')")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_event_store_imports_only_the_bottom_layer_of_the_rest(module):
    outside = {m for m in IMPORTS[module] if m.split(".")[0] in REPO_PACKAGES}
    assert outside <= ALLOWED_OUTSIDE, (
        f"{module} imports {sorted(outside - ALLOWED_OUTSIDE)}: the write side may use only "
        f"{sorted(ALLOWED_OUTSIDE)} outside event_store (docs/DESIGN.md, 'Layers')")


def test_event_store_modules_form_no_import_cycle():
    # A package naming itself (``from event_store.account import schemas`` in its __init__) is no cycle.
    graph = {m: {d for d in IMPORTS[m] if d in MODULES and d not in (PACKAGE, m)} for m in MODULES}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = path[path.index(module):] + [module]
            pytest.fail(f"import cycle: {' -> '.join(cycle)}; move what both need to a module below them "
                        f"(e.g. event_store.errors)")
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, path + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


@pytest.mark.parametrize("module", sorted(f"{PACKAGE}.{m}" for m in PURE))
def test_the_pure_core_imports_no_kafka_spark_delta_or_airflow(module):
    io = {m for m in IMPORTS[module] if m.split(".")[0] in IO_PACKAGES}
    assert not io, f"{module} is pure (decide/evolve, schemas, envelopes) but imports {sorted(io)}"


def _calls_and_handlers(path: Path) -> tuple[set[str], bool]:
    """Names of the librdkafka clients ``path`` constructs, and whether it catches BufferError."""
    built, buffer_error = set(), False
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in {"Producer", "Consumer", "AdminClient"}:
                built.add(name)
        elif isinstance(node, ast.ExceptHandler) and node.type is not None:
            names = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            buffer_error |= any(isinstance(n, ast.Name) and n.id == "BufferError" for n in names)
    return built, buffer_error


def test_librdkafka_clients_and_the_buffer_error_retry_live_in_kafka_clients_only():
    for module, path in MODULES.items():
        built, buffer_error = _calls_and_handlers(path)
        if module == f"{PACKAGE}.kafka_clients":
            assert built and buffer_error, "event_store.kafka_clients no longer builds the clients it should"
            continue
        assert not built, f"{module} builds confluent-kafka {sorted(built)} itself; ask event_store.kafka_clients"
        assert not buffer_error, f"{module} retries on BufferError itself; use kafka_clients.produce"
